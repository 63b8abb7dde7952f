"""The device forms of isa_gfx950.h: each wrapper compiles (clang++-22, gfx950) to its one instruction with the
operands the emulator's form assumes (operand widths by format, op_sel bits, byte / word selects); other archs are
refused. The semantics are tested under the emulator (tests/emu/test_isa_gfx950_emu.py)."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLANG, OBJDUMP = shutil.which("clang++-22"), shutil.which("llvm-objdump-22")
pytestmark = pytest.mark.skipif(not (CLANG and OBJDUMP), reason="clang++-22 / llvm-objdump-22 (gfx950) not installed")

KERNEL = r"""
#include "platform.h"
#include "isa_gfx950.h"
struct P { const rtc_i32x8* a; const rtc_i32x8* b; rtc_f32x4* c; rtc_u32* s; float* f; };
RTC_KERNEL(64) k(P p) {
  const int l = threadIdx.x;
  p.c[l] = mfma_scale_16x16x128_f8f6f4<0, 4, 1, 2>(p.a[l], p.b[l], p.c[l], p.s[l], p.s[l + 64]);
  p.c[l + 64] = mfma_scale_16x16x128_f8f6f4<2, 3, 3, 0>(p.a[l], p.b[l], p.c[l + 64], p.s[l], p.s[l + 64]);
  p.c[l + 128] = mfma_scale_16x16x128_f8f6f4<1, 0, 0, 0>(p.a[l], p.b[l], p.c[l + 128], p.s[l], p.s[l + 64]);
  p.f[l] = cvt_f32_fp8<2>(p.s[l]) + cvt_f32_bf8<3>(p.s[l + 1]);
  const rtc_f32x2 v = cvt_pk_f32_bf8<true>(p.s[l + 2]), w = cvt_pk_f32_fp8<false>(p.s[l + 3]);
  p.f[l + 64] = v[0] * w[1];
  p.s[l] = cvt_pk_fp8_f32<true>(p.f[l], p.f[l + 1], p.s[l + 4]);
  p.s[l + 64] = cvt_pk_bf8_f32<false>(p.f[l + 2], p.f[l + 3], p.s[l + 5]);
}
"""


def compile_for(arch, tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(KERNEL)
    out = tmp_path / "k.hsaco"
    p = subprocess.run([CLANG, "-x", "hip", f"--offload-arch={arch}", "-nogpulib", "-nogpuinc", "-O3",
                        "--cuda-device-only", "--no-gpu-bundle-output", "-I", os.path.join(ROOT, "csrc_common"),
                        "-c", str(src), "-o", str(out)], capture_output=True, text=True, timeout=300)
    return p, out


def test_device_forms_on_gfx950(tmp_path):
    p, out = compile_for("gfx950", tmp_path)
    assert p.returncode == 0, p.stderr
    dis = subprocess.run([OBJDUMP, "-d", "--mcpu=gfx950", str(out)], capture_output=True, text=True).stdout
    mfma = [ln for ln in dis.splitlines() if "v_mfma_scale_f32_16x16x128_f8f6f4" in ln]
    assert len(mfma) == 3, dis

    def regs(line, i):  # the register count of operand i (0: D, 1: A, 2: B)
        lo, hi = re.findall(r"[va]\[(\d+):(\d+)\]", line)[i]
        return int(hi) - int(lo) + 1
    fp8_fp4 = next(ln for ln in mfma if "blgp:4" in ln and "cbsz" not in ln)
    assert regs(fp8_fp4, 1) == 8 and regs(fp8_fp4, 2) == 4          # FP8 A: 8 dwords; FP4 B: 4
    assert "op_sel:[1,0,0] op_sel_hi:[0,1,0]" in fp8_fp4             # opsel_a 1 (bit 0), opsel_b 2 (bit 1)
    fp6 = next(ln for ln in mfma if "cbsz:2 blgp:3" in ln)
    assert regs(fp6, 1) == 6 and regs(fp6, 2) == 6 and "op_sel:[1,0,0] op_sel_hi:[1,0,0]" in fp6
    bf8 = next(ln for ln in mfma if "cbsz:1" in ln)
    assert regs(bf8, 1) == 8 and regs(bf8, 2) == 8 and "blgp" not in bf8
    for pattern in (r"v_cvt_f32_fp8_sdwa .*BYTE_2", r"v_cvt_f32_bf8_sdwa .*BYTE_3", r"v_cvt_pk_f32_bf8_sdwa .*WORD_1",
                    r"v_cvt_pk_f32_fp8_e32", r"v_cvt_pk_fp8_f32 .*op_sel:\[0,0,1\]", r"v_cvt_pk_bf8_f32 "):
        assert re.search(pattern, dis), (pattern, dis)


def test_refused_on_gfx942(tmp_path):
    p, _ = compile_for("gfx942", tmp_path)
    assert p.returncode != 0 and "isa_gfx950.h is for gfx950 kernels only" in p.stderr
