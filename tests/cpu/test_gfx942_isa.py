"""Code-object checks of the gfx942 fast kernel: all six variants per arch compile with no scratch, <= 64 KiB LDS, 512 threads, 2 waves/SIMD."""
import shutil

import pytest

from rtcattn import isa

ARCHS = [a for a, tool in (("gfx942", "clang++-19"), ("gfx90a", "clang++-19")) if shutil.which(tool)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", isa.LAYOUTS)
@pytest.mark.parametrize("mode", isa.MODES)
def test_code_object(arch, layout, mode):
    r = isa.report(arch, layout, mode)
    n = r.notes
    tag = f"{arch} {layout} {mode}: {n}"
    assert 0 < n["group_segment_fixed_size"] <= 64 * 1024, tag
    assert n["max_flat_workgroup_size"] == 512, tag
    assert r.waves_per_simd >= 2, f"2 waves/SIMD not achievable: {tag}"
    assert r.loop["has_mfma16_bf16"], tag
    # The KV loop holds one wave's 96 QK + 96 PV MFMAs and the two barriers of the schedule.
    assert r.loop["mfma"] == 192 and r.loop["s_barrier"] == 2, (tag, r.loop)
    # Only the last kv block masks scores, and it is peeled: the steady-state loop selects nothing.
    assert r.loop["cndmask"] == 0, (tag, r.loop)
    # SGPR spills into VGPR lanes (hipRTC 5.2 for gfx90a keeps a few) touch no memory: not counted.
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"


def test_model_bound_is_the_larger_pipe():
    loop = {"mfma": 192, "valu": 500, "trans": 50, "lds_bytes": 4096}
    c = isa.iteration_cycles(loop)
    assert c["mfma"] == 2 * 192 * 16 and c["valu"] == 2 * (450 * 4 + 50 * 16)
    assert c["bound"] == max(c["mfma"], c["valu"], c["lds"])
    # One round of 304 items of 2 kv blocks each; a split can only shorten the fractional round.
    assert isa.lower_bound_ms((1, 304, 128), 1000.0, False) == pytest.approx(2 * 1000 / 2.1e9 * 1e3)
    assert isa.lower_bound_ms((4, 16, 16384), 1000.0, True) <= isa.lower_bound_ms((4, 16, 16384), 1000.0, False)
