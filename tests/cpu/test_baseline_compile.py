"""Real compiles of the baseline kernel through the runtime (clang-19, hipRTC 5.2, NVRTC), checking the code objects."""
import re
import shutil
import struct
import subprocess
import tempfile

import pytest

from rtcattn.runtime import _lib, dispatch, manifest

SPEC = manifest.load().op("attention_fwd")
KERNEL = SPEC.kernel("baseline")
SYMBOL = KERNEL.symbol
BUCKETS = list(KERNEL.axes["head_dim"].buckets)
EM_AMDGPU, EM_CUDA = 224, 190
AMD_MACH = {"gfx90a": 0x3F, "gfx942": 0x4C}  # EF_AMDGPU_MACH values (low byte of e_flags)
MODES = SPEC.axis_values("round_mode")

# Every mode at head-dim bucket 128; every bucket for rtne.
VARIANTS = sorted({(mode, 128) for mode in MODES} | {(MODES[0], d) for d in BUCKETS})


def _tool(*names):
    for n in names:
        if shutil.which(n):
            return shutil.which(n)
    return None


READELF = _tool("llvm-readelf-19", "llvm-readelf")
OBJDUMP = _tool("llvm-objdump-19", "llvm-objdump")


def _product_build(arch, compiler, variant, cache_dir, **axes):
    """The product path: manifest -> build request -> C++ runtime -> compiler, into a fresh cache dir. axes: other
    axis values than a dense bf16 call's."""
    mode, d = variant
    call = {"round_mode": mode, "mask": "none", "kv": "dense", "head_dim": d, "dtype": "bf16", "kv_dtype": "same",
            "score_mod": "plain", "dropout": "nodrop", **axes}
    v = manifest.load().variant_for("attention_fwd", "baseline", arch, call)
    req = manifest.load().request(v, dispatch.package_version())
    try:
        res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers,
                         req.options, compiler=compiler, package_version=req.package_version,
                         cache_dir=str(cache_dir))
    except _lib.UnavailableError as e:
        pytest.skip(f"{compiler} unavailable for {arch}: {e}")
    assert res.origin == "compile", f"fresh cache dir, yet origin {res.origin}"
    return res


def _elf_header(code):
    assert code[:4] == b"\x7fELF", "code object is not an ELF file"
    machine = struct.unpack_from("<H", code, 18)[0]
    flags = struct.unpack_from("<I", code, 48)[0]
    return machine, flags


def _check_amd(code, arch):
    machine, flags = _elf_header(code)
    assert machine == EM_AMDGPU, f"ELF machine {machine}, want EM_AMDGPU ({EM_AMDGPU})"
    assert flags & 0xFF == AMD_MACH[arch], f"e_flags {flags:#x} is not {arch}"
    if READELF is None:
        pytest.skip("llvm-readelf not found: ELF notes not checked")
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code)
        f.flush()
        hdr = subprocess.run([READELF, "-h", f.name], capture_output=True, text=True, check=True).stdout
        notes = subprocess.run([READELF, "--notes", "--dyn-syms", f.name], capture_output=True, text=True,
                               check=True).stdout
    assert re.search(r"Machine:\s+EM_AMDGPU", hdr) and re.search(rf"Flags:.*\b{arch}\b", hdr), hdr
    assert re.search(rf"\.name:\s+{SYMBOL}\b", notes), f"kernel {SYMBOL} missing from the notes"
    assert re.search(rf"\b{SYMBOL}\.kd\b", notes), f"kernel descriptor {SYMBOL}.kd missing"
    for key in (".private_segment_fixed_size", ".vgpr_spill_count", ".sgpr_spill_count"):
        vals = re.findall(rf"{re.escape(key)}:\s+(\d+)", notes)
        assert vals == ["0"], f"{key} = {vals} (want 0: no scratch, no spills)"
    lds = int(re.search(r"\.group_segment_fixed_size:\s+(\d+)", notes).group(1))
    assert 0 < lds <= 65536, f"LDS {lds} bytes"


def _check_cuda(code, sm):
    machine, flags = _elf_header(code)
    assert machine == EM_CUDA, f"ELF machine {machine}, want EM_CUDA ({EM_CUDA})"
    assert (flags >> 8) & 0xFF == sm, f"e_flags {flags:#x} is not sm_{sm}"
    assert SYMBOL.encode() + b"\0" in code, f"kernel {SYMBOL} missing from the cubin"


@pytest.mark.parametrize("arch,compiler", [("gfx942", "clang"), ("gfx90a", "clang"), ("gfx90a", "hiprtc")])
@pytest.mark.parametrize("variant", VARIANTS)
def test_amd(arch, compiler, variant, tmp_path):
    _check_amd(_product_build(arch, compiler, variant, tmp_path).code(), arch)


@pytest.mark.parametrize("sm,variant", [("sm_90a", v) for v in VARIANTS] + [("sm_80", ("rtna", 256))])
def test_nvrtc(sm, variant, tmp_path):
    _check_cuda(_product_build(sm, "nvrtc", variant, tmp_path).code(), int(re.sub(r"\D", "", sm)))


@pytest.mark.parametrize("sm,variant", [("sm_90a", ("rtne", 256)), ("sm_90a", ("rtz", 192)), ("sm_80", ("rtna", 256))])
def test_nvrtc_no_spills(sm, variant, tmp_path):
    """ptxas's own report, which the runtime keeps beside a product build (NVRTC runs ptxas -v)."""
    log = _product_build(sm, "nvrtc", variant, tmp_path).log()
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), log
    smem = int(re.search(r"(\d+) bytes smem", log).group(1))
    assert smem <= 48 * 1024, f"static shared memory {smem} bytes exceeds 48 KiB"


@pytest.mark.parametrize("arch,compiler", [("gfx942", "clang"), ("gfx90a", "hiprtc"), ("sm_90a", "nvrtc")])
@pytest.mark.parametrize("kv_dtype,dtype", [("fp8_e4m3", "bf16"), ("fp8_e4m3fnuz", "fp16"), ("fp4_e2m1", "bf16")])
def test_quantized_caches(arch, compiler, kv_dtype, dtype, tmp_path):
    """The variants that read a quantized cache (paged, windowed: the most code) compile with the same checks: no
    scratch or spills, LDS / shared memory in bounds."""
    res = _product_build(arch, compiler, ("rtne", 128), tmp_path, kv="paged", mask="window", dtype=dtype,
                         kv_dtype=kv_dtype)
    if arch.startswith("gfx"):
        _check_amd(res.code(), arch)
        return
    _check_cuda(res.code(), 90)
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", res.log()), res.log()
    assert int(re.search(r"(\d+) bytes smem", res.log()).group(1)) <= 48 * 1024


def test_plain_simt(tmp_path):
    """The baseline uses no matrix instructions (it is the fallback where those are not wanted)."""
    if OBJDUMP is None:
        pytest.skip("llvm-objdump not found")
    code = _product_build("gfx942", "clang", ("rtne", 256), tmp_path).code()
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code)
        f.flush()
        asm = subprocess.run([OBJDUMP, "-d", "--mcpu=gfx942", f.name], capture_output=True, text=True,
                             check=True).stdout
    assert "s_endpgm" in asm, "disassembly is empty"
    assert "v_mfma" not in asm and "v_dot" not in asm, "matrix/dot instructions in the baseline"
