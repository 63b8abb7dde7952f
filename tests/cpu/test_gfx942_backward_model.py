"""The static model of the gfx942 backward kernel (python/rtcattn/tools/backward_model.py, `python -m rtcattn isa
--backward-model`): its pieces on synthetic loops and shapes, coreport's loop finder for a kernel of stages on a
synthetic program, and from the real code objects the two stages' loops (dK / dV: 4 products a tile pair, dQ: 3, at
D / 16 MFMAs each) and the model's rows against AITER's figures. The rows' ratios are reported, not asserted to pass
AITER: the test checks the model's mechanics."""
import math
import shutil
from types import SimpleNamespace

import pytest

from rtcattn.tools import backward_model as bm, coreport

LOOP = {"mfma": 32, "valu": 324, "trans": 4, "lds_bytes": 26112, "total": 591}


def test_iteration_cycles():
    c = bm.iteration_cycles(LOOP, 1)
    assert (c["mfma"], c["valu"], c["lds"], c["issue"]) == (32 * 16, 320 * 4 + 4 * 16, 4 * 26112 / 128, 591 * 4)
    assert (c["bound"], c["by"], c["pipes"]) == (2364, "issue", 1344)
    # Two waves a SIMD: the pipes' busy cycles double (two blocks' iterations side by side), a wave's issue does not.
    c2 = bm.iteration_cycles(LOOP, 2)
    assert (c2["mfma"], c2["valu"], c2["lds"], c2["issue"]) == (1024, 2688, 1632, 2364)
    assert (c2["bound"], c2["by"]) == (2688, "valu")


def test_tiles_per_block():
    # Full: every 16-row tile of a head (a partial last one too), every 16-key tile.
    assert bm.dkdv_tiles(0, 128, 128, False) == bm.dkdv_tiles(64, 128, 128, False) == 8
    assert bm.dkdv_tiles(0, 100, 100, False) == 7 and bm.dq_tiles(0, 100, 100, False) == 7
    # Causal (bottom-right): keys 64..127 are reached by rows 64.. only; rows 0..63 see keys 0..63.
    assert bm.dkdv_tiles(0, 128, 128, True) == 8 and bm.dkdv_tiles(64, 128, 128, True) == 4
    assert bm.dq_tiles(0, 128, 128, True) == 4 and bm.dq_tiles(64, 128, 128, True) == 8
    # Sq < Sk: row 0 sees keys 0..Sk - Sq.
    assert bm.key_range(0, 64, 128, True) == (0, 64) and bm.dq_tiles(0, 64, 128, True) == 8
    # Over a causal sequence of 1024 both stages run the same 16 x 16 tile pairs (an iteration: 4 waves' pairs):
    # the 64 x 65 / 2 on and below the diagonal, and the 6 above it in each of the 16 diagonal 64 x 64 blocks.
    kv = sum(bm.dkdv_tiles(j, 1024, 1024, True) for j in range(0, 1024, 64)) * 4
    q = sum(bm.dq_tiles(i, 1024, 1024, True) for i in range(0, 1024, 64)) * 4
    assert kv == q == 64 * 65 // 2 + 6 * 16


def test_makespan_and_flops():
    assert bm.makespan([3, 1, 1, 1], 2) == 3 and bm.makespan([1] * 5, 2) == 3 and bm.makespan([2, 2, 2], 3) == 2
    assert bm.makespan([1, 3], 1) == 4
    assert bm.flops((1, 1, 1, 64, False)) == 10 * 64 * 64 * 128 == 2 * bm.flops((1, 1, 1, 64, True))


def test_model_on_synthetic_loops():
    """(B 1, Hq 2, Hk 1, S 128) on 2 CUs: dK / dV 2 blocks of 2 heads x 8 tiles, one round; dQ 2 x 2 blocks of 8
    tiles, two rounds; delta: O and dO read, delta written, at 5.3 TB/s."""
    kv, q = dict(LOOP), {"mfma": 24, "valu": 306, "trans": 4, "lds_bytes": 16384, "total": 509}
    m = bm.model((1, 2, 1, 128, False), (kv, q), 1, cus=2)
    assert (m["plan"]["dkdv_grid_x"], m["plan"]["dkdv_grid_y"], m["plan"]["dq_grid_x"], m["plan"]["grid_z"]) == (
        2, 1, 2, 1)
    assert (m["dkdv_its"], m["dq_its"]) == (16, 8)
    assert m["dkdv"] == pytest.approx(16 * 2364 / bm.CLOCK_HZ) and m["dq"] == pytest.approx(2 * 8 * 2036 / bm.CLOCK_HZ)
    assert m["delta"] == pytest.approx(2 * 128 * (512 + 4) / bm.HBM_BYTES_PER_S)
    assert m["total"] == pytest.approx(m["delta"] + m["dkdv"] + m["dq"])
    assert m["tflops"] == pytest.approx(bm.flops((1, 2, 1, 128, False)) / m["total"] / 1e12)
    assert m["pipes_tflops"] > m["tflops"]  # both loops issue-bound at one wave a SIMD


def test_stage_loops_by_mfma_count():
    r = SimpleNamespace(head_dim=128, name="x", loops=[{"mfma": 32, "total": 1}, {"mfma": 24, "total": 2}])
    assert bm.stage_loops(r) == ({"mfma": 32, "total": 1}, {"mfma": 24, "total": 2})
    with pytest.raises(ValueError, match="not one"):
        bm.stage_loops(SimpleNamespace(head_dim=128, name="x", loops=[{"mfma": 32}, {"mfma": 32}, {"mfma": 24}]))


def _program(lines):
    """(address, mnemonic, operands) of a program, 4 bytes an instruction; a branch's operand names its target's
    line, turned into SOPP's simm16 (target = next instruction + 4 x simm16)."""
    out = []
    for i, (op, target) in enumerate(lines):
        args = "" if target is None else str((target - i - 1) & 0xFFFF)
        out.append((4 * i, op, args))
    return out


def test_loop_finder_of_a_kernel_of_stages():
    """An outer loop (a head step) around an inner one whose iteration holds a block some waves skip, then a
    second loop: mfma_loops finds two (the nested one merged into its outer loop), iteration_path keeps the
    instructions every inner iteration runs."""
    insts = _program([
        ("s_mov_b32", None),                  # 0
        ("s_add_i32", None),                  # 1  outer loop head: its own code
        ("s_nop", None),                      # 2
        ("v_mfma_f32_16x16x16_bf16", None),   # 3  inner loop head
        ("v_mfma_f32_16x16x16_bf16", None),   # 4
        ("v_add_f32_e32", None),              # 5
        ("s_cbranch_execz", 8),               # 6  some waves skip line 7
        ("ds_write_b32", None),               # 7
        ("v_mfma_f32_16x16x16_bf16", None),   # 8
        ("v_mfma_f32_16x16x16_bf16", None),   # 9
        ("s_cbranch_scc1", 3),                # 10 inner latch
        ("s_cbranch_scc0", 1),                # 11 outer latch
        ("v_mfma_f32_16x16x16_bf16", None),   # 12 second loop
        ("v_mfma_f32_16x16x16_bf16", None),   # 13
        ("v_mfma_f32_16x16x16_bf16", None),   # 14
        ("s_cbranch_scc1", 12),               # 15
        ("s_endpgm", None),                   # 16
    ])
    loops = coreport.mfma_loops(insts)
    assert [(b[0][0] // 4, b[-1][0] // 4, sum(x[1].startswith("v_mfma") for x in b)) for b in loops] == [
        (1, 11, 4), (12, 15, 3)]
    path = coreport.iteration_path(insts, loops[0])
    assert [x[0] // 4 for x in path] == [3, 4, 5, 6, 8, 9, 10]
    assert coreport.iteration_path(insts, loops[1]) == loops[1]


@pytest.mark.skipif(not shutil.which("clang++-19"), reason="needs clang++-19 (gfx942 code objects)")
@pytest.mark.parametrize("mask", ["none", "window"])
def test_the_stages_loops_in_the_code_object(mask):
    """D 128: two loops with MFMAs, dK / dV's 4 x 8 (S and dP over 8 k-steps, dV and dK over 8 column tiles) and
    dQ's 3 x 8 (S^T and dP^T, dQ); four exponentials a lane (4 pairs); at least two waves a SIMD (the kernel asks for
    them up to D 128: registers within 256, no AGPRs)."""
    r = coreport.report("gfx942", "rtne", mask, "dense", bm.HEAD_DIM, "bf16", kernel=bm.KERNEL, op=bm.OP)
    steps = bm.HEAD_DIM // 16
    assert sorted(c["mfma"] for c in r.loops) == [3 * steps, 4 * steps]
    kv, q = bm.stage_loops(r)
    assert (kv["mfma"], q["mfma"], kv["trans"], q["trans"]) == (32, 24, 4, 4)
    assert r.loop["mfma_total"] >= kv["mfma"] + q["mfma"]
    assert r.notes["vgpr_count"] <= 256 and r.notes["agpr_count"] == 0 and r.waves_per_simd >= 2
    # The iteration's instructions: fewer than the loop's code (the head step and the LSE rows' block drop out).
    assert 0 < kv["total"] < 2000 and kv["s_barrier"] == q["s_barrier"] == 2


@pytest.mark.skipif(not shutil.which("clang++-19"), reason="needs clang++-19 (gfx942 code objects)")
def test_the_models_rows():
    rows = bm.models(lambda mask: coreport.report("gfx942", "rtne", mask, "dense", bm.HEAD_DIM, "bf16",
                                                  kernel=bm.KERNEL, op=bm.OP))
    assert [m["case"] for m in rows] == list(bm.AITER)
    for m in rows:
        b, hq, hk, s, causal = m["case"]
        assert m["dkdv_its"] == hq // hk * s // 16 and m["dq_its"] == s // 16  # the longest blocks: all tiles
        # delta: a small part (0.1-1.4% of the model's time on the present kernel)
        assert m["total"] == pytest.approx(m["delta"] + m["dkdv"] + m["dq"]) and m["delta"] < 0.03 * m["total"]
        assert math.isclose(m["vs_a32"], m["tflops"] / bm.AITER[m["case"]][1])
        assert 0 < m["tflops"] <= m["pipes_tflops"]  # the issue term can only lower the bound
    full = {m["case"][:4]: m for m in rows if not m["case"][4]}
    for m in rows:  # causal: about half the work, never more time than the full call
        if m["case"][4]:
            assert m["total"] < full[m["case"][:4]]["total"]
