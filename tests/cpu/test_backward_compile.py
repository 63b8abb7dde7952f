"""Real compiles of the baseline backward (attention_bwd) through the runtime: clang-19 (gfx942), hipRTC 5.2 and
clang-19 (gfx90a), clang-22 (gfx950), NVRTC (sm_80, sm_90a). AMD code objects: no scratch (no private segment, no
VGPR spills; SGPRs may spill into VGPR lanes: the reference kernel holds the whole parameter block's uniform values),
LDS within 64 KiB; NVIDIA: ptxas reports no stack frame and no spills. The smallest and the largest bucket on every
arch and compiler (bf16, the window-varlen form: the most code), fp16 at the largest, every form at 128 on gfx942 and
sm_90a, the other bf16 modes at 128 on sm_90a; the middle buckets run in the emulator and GPU suites."""
import re
import shutil
import subprocess
import tempfile

import pytest

from rtcattn.runtime import _lib, dispatch, manifest

OP = "attention_bwd"
SPEC = manifest.load().op(OP)
KERNEL = SPEC.kernel("baseline")
BUCKETS = list(KERNEL.axes["head_dim"].buckets)
FORMS = [(mask, kv) for mask in ("none", "window") for kv in ("dense", "varlen")]
READELF = next((shutil.which(n) for n in ("llvm-readelf-19", "llvm-readelf-22", "llvm-readelf") if shutil.which(n)),
               None)
# arch -> the compilers to try (each a separate build, as the runtime would pick on a machine with it)
ARCHS = {"gfx942": ["clang"], "gfx90a": ["hiprtc", "clang"], "gfx950": ["clang22"], "sm_90a": ["nvrtc"],
         "sm_80": ["nvrtc"]}


def _build(arch, compiler, tmp_path, **call):
    full = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16", **call}
    m = manifest.load()
    req = m.request(m.variant_for(OP, "baseline", arch, full), dispatch.package_version())
    try:
        return _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                          compiler=compiler, package_version=req.package_version, cache_dir=str(tmp_path))
    except _lib.UnavailableError as e:
        pytest.skip(f"{compiler} unavailable for {arch}: {e}")


def _check(arch, res):
    code = res.code()
    assert code[:4] == b"\x7fELF"
    if arch.startswith("sm_"):
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", res.log())
        assert frame and frame.groups() == ("0", "0", "0"), res.log()
        return
    if READELF is None:
        pytest.skip("llvm-readelf not found: AMD notes not checked")
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code)
        f.flush()
        notes = subprocess.run([READELF, "--notes", f.name], capture_output=True, text=True, check=True).stdout
    for key in (".private_segment_fixed_size", ".vgpr_spill_count"):
        assert re.findall(rf"{re.escape(key)}:\s+(\d+)", notes) == ["0"], f"{key}: scratch or spills\n{notes}"
    lds = int(re.search(r"\.group_segment_fixed_size:\s+(\d+)", notes).group(1))
    assert 0 < lds <= 65536, f"LDS {lds} bytes"


@pytest.mark.parametrize("arch,compiler", [(a, c) for a, cs in ARCHS.items() for c in cs])
@pytest.mark.parametrize("d", [BUCKETS[0], BUCKETS[-1]])
def test_smallest_and_largest_bucket_compile_clean(arch, compiler, d, tmp_path):
    _check(arch, _build(arch, compiler, tmp_path, head_dim=d, mask="window", kv="varlen"))


@pytest.mark.parametrize("arch,compiler", [("gfx942", "clang"), ("sm_90a", "nvrtc")])
def test_fp16_compiles_clean(arch, compiler, tmp_path):
    _check(arch, _build(arch, compiler, tmp_path, head_dim=BUCKETS[-1], dtype="fp16", mask="window", kv="varlen"))


@pytest.mark.parametrize("arch,compiler", [("gfx942", "clang"), ("sm_90a", "nvrtc")])
@pytest.mark.parametrize("mask,kv", FORMS)
def test_every_form_compiles_clean(arch, compiler, mask, kv, tmp_path):
    _check(arch, _build(arch, compiler, tmp_path, mask=mask, kv=kv))


@pytest.mark.parametrize("mode", [m for m in SPEC.axis_values("round_mode") if m != "rtne"])
def test_other_modes_compile_clean(mode, tmp_path):
    _check("sm_90a", _build("sm_90a", "nvrtc", tmp_path, round_mode=mode, mask="window"))
