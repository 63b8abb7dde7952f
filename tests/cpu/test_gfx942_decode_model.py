"""The static bandwidth model of the gfx942 decode kernel (python/rtcattn/tools/decode_model.py, `python -m rtcattn isa
--decode-model`): its bounds from the runtime's plan and a loop's counts, and on the issue's decode cases, from the
real code objects, the bound against the KV bytes at MI300X's 5.3 TB/s."""
import math
import shutil

import pytest

from rtcattn.tools import decode_model as dm

LOOP = {"valu": 300, "trans": 9, "mfma": 32}  # about the d = 128 paged loop's counts


def test_step_time_is_the_loop_instructions_one_after_another():
    assert dm.step_seconds(LOOP) == pytest.approx((291 * 4 + 9 * 16 + 32 * 16) / 2.1e9)
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
    assert lone["splits"] > 64 and lone["merge"] >= math.ceil(lone["splits"] / 16) * dm.LATENCY_S, lone
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
    class Fake:  # a code object's report: the loop's counts and occupancy
        loop, waves_per_simd = LOOP, 2
    by = {t: dm.case_models(lambda d, kv_dtype: Fake(), t) for t in ("same", "fp8_e4m3", "fp4_e2m1")}
    dm.print_models(by, lambda rows, cols: print(cols, *rows, sep="\n"))
    out = capsys.readouterr().out
    ratio = dm.set_bound(by["fp4_e2m1"]) / dm.set_bound(by["fp8_e4m3"])
    assert "== KV cache: fp4_e2m1 ==" in out and f"FP4 / FP8 set bound = {ratio:.3f} (target <= 0.55)" in out


@pytest.mark.skipif(not shutil.which("clang++-19"), reason="needs clang++-19 for the gfx942 code objects")
def test_fp4_reads_at_most_0_55_of_fp8s_cache_bytes_on_the_decode_set():
    """The issue's ratio on the cache's bytes: the FP4 set's K and V bytes, scales included, at most 0.55x the FP8
    set's (0.508: 65 of 128 bytes a row at d = 128). The bounds beside them (the HBM bound with q, o, the table and
    each format's own split partials; the whole bound with the expansion's instruction issue) are printed by
    `isa --decode-model` and recorded in docs/NOTES.md: those do not meet 0.55 yet (0.557 and 0.64)."""
    from rtcattn.tools import coreport
    by = {t: dm.case_models(lambda d, kv_dtype: coreport.report("gfx942", "rtne", "window", "paged", d, "bf16",
                                                                kernel=dm.KERNEL, kv_dtype=kv_dtype), t)
          for t in ("fp8_e4m3", "fp4_e2m1")}
    kv = {t: sum(m["kv_bytes"] for m in rows) for t, rows in by.items()}
    assert kv["fp4_e2m1"] <= dm.FP4_OVER_FP8 * kv["fp8_e4m3"], kv
    assert all(m["ideal"] == m["kv_bytes"] / dm.HBM_BYTES_PER_S for rows in by.values() for m in rows)
