"""The static bandwidth model of the gfx942 decode kernel (python/rtcattn/tools/decode_model.py, `python -m rtcattn isa
--decode-model`): its bounds from the runtime's plan and a loop's counts, and on the issue's decode cases, from the
real code objects, the bound against the KV bytes at MI300X's 5.3 TB/s."""
import dataclasses
import math
import shutil

import pytest

from rtcattn.tools import decode_model as dm
from rtcattn.tools.prefill_model import MACHINES, MI300X

LOOP = {"valu": 300, "trans": 9, "mfma": 32}  # about the d = 128 paged loop's counts


def test_step_time_is_the_issue_beside_the_matrix_pipe():
    """A wave-step on its SIMD: the issue of its VALU (4 cycles), transcendentals (16) and MFMAs (a 4-cycle slot
    each) beside the matrix pipe's 16 cycles an MFMA, the longer of the two (they co-execute)."""
    assert dm.step_seconds(LOOP) == pytest.approx((291 * 4 + 9 * 16 + 32 * 4) / 2.1e9)
    assert dm.step_seconds(dict(LOOP, valu=40, trans=0)) == pytest.approx(32 * 16 / 2.1e9)  # the pipe binds
    # A wave's step: the round trip of the loads requested after the S^T MFMAs (16 of the 32), or the math if longer.
    assert dm.wave_step_seconds(LOOP) == pytest.approx(2e-6 + 16 * 16 / 2.1e9)
    assert dm.wave_step_seconds(dict(LOOP, valu=2000)) == dm.step_seconds(dict(LOOP, valu=2000))


def test_a_full_batch_is_bound_by_hbm_and_a_lone_sequence_needs_its_split():
    full = dm.model((256, 1024, 32, 8, 16, 1, 128), LOOP, 2)
    assert full["splits"] == 1 and full["merge"] == 0.0
    assert full["bound"] == full["hbm"] > full["waves"] and full["ratio"] < 1.01, full
    kv = 256 * 1024 * 8 * 128 * 4
    assert full["kv_bytes"] == kv and full["ideal"] == kv / 5.3e12
    lone = dm.model((1, 131072, 32, 8, 64, 1, 128), LOOP, 2)
    assert lone["merge_groups"] == 4, lone  # GQA 4 at Sq 1: 4 rows of the call, 4 part groups of the merge's lanes
    assert lone["splits"] > 64 and lone["merge"] >= math.ceil(lone["splits"] / (16 * 4)) * dm.LATENCY_S, lone
    # Unsplit, 8 waves would walk 4096 steps each: a round trip a step.
    assert lone["bound"] < 4096 * dm.LATENCY_S / 10


@pytest.mark.skipif(not shutil.which("clang++-19"), reason="needs clang++-19 for the gfx942 code objects")
def test_the_decode_set_is_within_the_target():
    """The issue's target for the model: the decode set's bound within 1.25x of its KV bytes at 5.3 TB/s, and every
    case of at least 512 MB of KV within it on its own (the smaller ones are latency-bound: docs/NOTES.md)."""
    from rtcattn.tools import coreport
    rows = dm.case_models(lambda d, t: coreport.report("gfx942", "rtne", "window", "paged", d, "bf16", kernel=dm.KERNEL,
                                                                 kv_dtype=t))
    assert [m["case"] for m in rows] == dm.CASES
    assert sum(m["bound"] for m in rows) <= dm.TARGET * sum(m["ideal"] for m in rows), rows
    over = [(m["case"], round(m["ratio"], 3)) for m in rows if m["kv_bytes"] >= 512e6 and m["ratio"] > dm.TARGET]
    assert not over, over


def test_the_machine_prices_the_bounds():
    """The model on another part (gfx950's MI355X): the ideal and the HBM term at its bandwidth, the plan for its CUs,
    the step at its clock; MI300X the default."""
    case = (32, 4096, 32, 8, 16, 1, 128)
    mi300x, mi355x = dm.model(case, LOOP, 2), dm.model(case, LOOP, 2, MACHINES["gfx950"])
    assert mi300x == dm.model(case, LOOP, 2, MI300X) and MACHINES["gfx942"] == MI300X
    assert mi355x["ideal"] == mi300x["kv_bytes"] / 8.0e12 and mi300x["ideal"] == mi300x["kv_bytes"] / 5.3e12
    assert mi355x["hbm"] < mi300x["hbm"], (mi300x, mi355x)
    # The plan is the runtime's for the part (its CUs, HBM bandwidth and LDS per CU in the argument block): a lone
    # long sequence is split more finely on MI355X (90 parts on MI300X, 137), where the HBM term is shorter and the
    # waves' parts weigh more.
    lone = (1, 131072, 32, 8, 64, 1, 128)
    on_mi355x = dm.model(lone, LOOP, 2, MACHINES["gfx950"])["splits"]
    assert on_mi355x == dm.plan(lone, MACHINES["gfx950"])["splits"] > dm.model(lone, LOOP, 2)["splits"]
    slow = dataclasses.replace(MACHINES["gfx950"], hbm_bytes_per_s=5.3e12)  # 256 CUs at MI300X's bandwidth
    assert dm.plan(lone, slow)["splits"] < on_mi355x, dm.plan(lone, slow)
    assert dm.step_seconds(LOOP, MACHINES["gfx950"]) == pytest.approx(dm.step_seconds(LOOP) * 2.1 / 2.4)


def test_quantized_caches_read_their_bytes_and_scales():
    """FP8 reads a byte a value, FP4 half a byte and a scale byte per row and head: the model's KV bytes, the plan's
    (the planner's per-step bytes shrink with them: a long context is split at least as finely)."""
    assert [dm.row_bytes(128, t) for t in ("same", "fp8_e4m3", "fp8_e4m3fnuz", "fp4_e2m1")] == [256, 128, 128, 65]
    case = (8, 32768, 32, 8, 64, 1, 128)
    rows = {t: dm.model(case, LOOP, 2, kv_dtype=t) for t in ("same", "fp8_e4m3", "fp4_e2m1")}
    assert rows["fp8_e4m3"]["kv_bytes"] * 2 == rows["same"]["kv_bytes"] == 8 * 32768 * 8 * 128 * 4
    assert rows["fp4_e2m1"]["kv_bytes"] == 8 * 32768 * 8 * 65 * 2
    assert rows["same"]["splits"] <= rows["fp8_e4m3"]["splits"] <= rows["fp4_e2m1"]["splits"], rows


def test_print_models_sets_the_formats_side_by_side(capsys):
    class Fake:  # a code object's report: the loop's counts and occupancy (no instructions: nothing replayed)
        loop, waves_per_cu, loop_body = LOOP, 8, []
    by = {t: dm.case_models(lambda d, kv_dtype: Fake(), t) for t in ("same", "fp8_e4m3", "fp4_e2m1")}
    dm.print_models(by, lambda rows, cols: print(cols, *rows, sep="\n"))
    out = capsys.readouterr().out
    ratio = dm.set_bound(by["fp4_e2m1"]) / dm.set_bound(by["fp8_e4m3"])
    assert "== KV cache: fp4_e2m1 ==" in out and f"FP4 / FP8 set bound = {ratio:.3f} (target <= 0.55)" in out


def test_rare_blocks_are_the_marked_basic_blocks():
    """coreport.rare_blocks: the whole basic block of a rare-block mark (two s_nop 0 in a row, wherever the scheduler
    put them in the block), from the branch that skips it to its target; a lone s_nop 0 (a hazard wait) marks
    nothing, and the loop's other blocks stay counted."""
    from rtcattn.tools import coreport

    def br(addr, op, target):  # SOPP: target = next instruction + 4 * simm16
        return (addr, op, str(((target - addr - 4) // 4) & 0xFFFF))
    insts = [(0x00, "v_mfma_f32_16x16x16_bf16", "v[0:3]"), (0x04, "s_and_saveexec_b64", "s[0:1], vcc"),
             br(0x08, "s_cbranch_execz", 0x20), (0x0C, "v_and_b32_e32", "v1, v2, v3"), (0x10, "s_nop", "0"),
             (0x14, "s_nop", "0"), (0x18, "v_cndmask_b32_e32", "v1, v1, v4, vcc"),
             (0x1C, "v_or_b32_e32", "v1, v1, v5"), (0x20, "s_or_b64", "exec, exec, s[0:1]"),
             (0x24, "s_nop", "0"), (0x28, "v_add_u32_e32", "v6, v6, v7"), br(0x2C, "s_cbranch_scc1", 0x00)]
    assert coreport.rare_blocks(insts) == {0x0C, 0x10, 0x14, 0x18, 0x1C}
    body = coreport.kv_loop(insts)
    c = coreport._hot_count(body, coreport.rare_blocks(insts))
    assert c["rare"] == 5 and c["valu"] == 1 and c["mfma"] == 1
    assert coreport.rare_blocks([x for x in insts if x[0] != 0x14]) == set()


@pytest.mark.parametrize("arch,compiler", [("gfx942", "clang++-19"), ("gfx950", "clang++-22")])
def test_fp4_reads_and_takes_at_most_0_55_of_fp8s_on_the_decode_set(arch, compiler):
    """The issue's ratio on the cache's bytes: the FP4 set's K and V bytes, scales included, at most 0.55x the FP8
    set's (0.508: 65 of 128 bytes a row at d = 128), and on the whole bound (HBM, waves, issue, merge) of the set on
    gfx942's code objects on MI300X and gfx950's on MI355X (docs/NOTES.md: 0.548 and 0.437)."""
    if not shutil.which(compiler):
        pytest.skip(f"needs {compiler} for the {arch} code objects")
    from rtcattn.tools import coreport
    machine = MACHINES[arch]
    by = {t: dm.case_models(lambda d, kv_dtype: coreport.report(arch, "rtne", "window", "paged", d, "bf16",
                                                                kernel=dm.KERNEL, kv_dtype=kv_dtype), t, machine)
          for t in ("fp8_e4m3", "fp4_e2m1")}
    kv = {t: sum(m["kv_bytes"] for m in rows) for t, rows in by.items()}
    assert kv["fp4_e2m1"] <= dm.FP4_OVER_FP8 * kv["fp8_e4m3"], kv
    bound = {t: dm.set_bound(rows) for t, rows in by.items()}
    assert bound["fp4_e2m1"] <= dm.FP4_OVER_FP8 * bound["fp8_e4m3"], bound
    assert all(m["ideal"] == m["kv_bytes"] / machine.hbm_bytes_per_s for rows in by.values() for m in rows)


def test_the_replay_waits_as_the_loop_says():
    """wave_seconds: a vector load waited for at once costs its round trip every iteration; one waited for two
    iterations later (vmcnt(1): the newer load stays in flight) a round trip every two iterations; a scalar load's
    lgkmcnt(0) waits SCALAR_LATENCY_S and never for the vector loads; two steps an iteration halve the iterations."""
    mfma = (0, "v_mfma_f32_16x16x16_bf16", "")
    at_once = [(0, "buffer_load_dwordx4", ""), (4, "s_waitcnt", "vmcnt(0)"), mfma]
    ahead = [(0, "s_waitcnt", "vmcnt(1)"), (4, "buffer_load_dwordx4", ""), mfma]
    one = 4 / 2.1e9  # the MFMA's issue slot (its pipe is free again long before the next round trip ends)
    assert dm.wave_seconds(at_once, 3) == pytest.approx(3 * (dm.LATENCY_S + one))
    assert dm.wave_seconds(ahead, 12) - dm.wave_seconds(ahead, 10) == pytest.approx(dm.LATENCY_S)  # 2 a trip
    assert dm.wave_seconds(at_once, 4, ahead=2) == pytest.approx(dm.wave_seconds(at_once, 2))
    scalar = [(0, "buffer_load_dwordx4", ""), (4, "s_load_dword", ""), (8, "s_waitcnt", "lgkmcnt(0)"), mfma]
    assert dm.wave_seconds(scalar, 1) == pytest.approx(dm.SCALAR_LATENCY_S + one)


def test_the_replay_runs_the_valu_beside_the_matrix_pipe():
    """wave_seconds: an MFMA issues in a 4-cycle slot; the next MFMA waits for the pipe (16 cycles after the first's
    issue); a VALU independent of them issues in the next slot, one that reads an MFMA's result waits 4 passes + 3 wait
    states (28 cycles) after that MFMA's issue; an MFMA accumulating onto the last one's result waits for the pipe
    only."""
    c = 1 / 2.1e9
    mfma = [(0, "v_mfma_f32_16x16x16_bf16", "v[0:3], v[4:5], v[6:7], v[0:3]"),
            (4, "v_mfma_f32_16x16x16_bf16", "v[8:11], v[4:5], v[6:7], v[8:11]")]
    free = mfma + [(8, "v_add_f32_e32", "v20, v21, v22")]
    reads = mfma + [(8, "v_add_f32_e32", "v20, v9, v22")]
    chain = [mfma[0], (4, "v_mfma_f32_16x16x16_bf16", "v[0:3], v[4:5], v[6:7], v[0:3]")]
    assert dm.wave_seconds(free, 1) == pytest.approx((16 + 4 + 4) * c)
    assert dm.wave_seconds(reads, 1) == pytest.approx((16 + 28 + 4) * c)
    assert dm.wave_seconds(chain, 1) == pytest.approx((16 + 4) * c)


def test_the_bound_takes_the_replayed_waves():
    """Given the loop's body, a case's waves are its part replayed (wave_seconds, in rounds of resident waves) and
    the bound takes them; the price of the same part from the loop's counts (part_seconds) is kept beside them as
    "priced", and without a body the waves are that price."""
    case = (1, 131072, 32, 8, 64, 1, 128)  # split: the waves and the merge decide
    trip = [(0, "buffer_load_dwordx4", ""), (4, "s_waitcnt", "vmcnt(0)")]
    slow = trip + trip + [(8, "v_mfma_f32_16x16x16_bf16", "")]  # two round trips a step, where the planner prices one
    m, bare = dm.model(case, LOOP, 2, body=slow), dm.model(case, LOOP, 2)
    steps = math.ceil(dm.plan(case)["steps"] / m["splits"])
    rounds = math.ceil(m["grid_attn"] / round(dm.MI300X.cus * 4 * 2))
    assert m["waves"] == pytest.approx(rounds * dm.wave_seconds(slow, steps)) and m["priced"] == bare["waves"]
    assert bare["waves"] == bare["priced"] and m["waves"] > m["priced"], (m, bare)
    assert m["bound"] == pytest.approx(max(m["hbm"], m["waves"], m["issue"]) + m["merge"]), m
