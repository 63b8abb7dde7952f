"""The static model of the gfx942 prefill kernel over quantized paged caches (python/rtcattn/tools/prefill_model.py,
`python -m rtcattn isa --prefill-model`): its pieces on synthetic loops, and from the real code objects the issue's
target, paged prefill over FP8 at no less than 0.9x the bf16 speed (on the model: no AMD GPU here)."""
import shutil

import pytest

from rtcattn.tools import coreport, prefill_model as pm

LOOP = {"mfma": 192, "valu": 511, "trans": 51, "lds_bytes": 4096}


def test_the_pieces():
    assert pm.iteration_cycles(LOOP) == max(2 * 192 * 16, 2 * (460 * 4 + 51 * 16), 8 * 4096 / 128)
    # Non-causal: every q block of a sequence sees all its blocks, the partial last one cut; causal: the diagonal's.
    assert pm.item_blocks(1000, 384, False) == [(15, 1)] * 3
    assert pm.item_blocks(384, 384, True) == [(0, 6)] and sum(sum(b) for b in pm.item_blocks(4096, 384, True)) < (
        11 * 64)
    # The stage's bytes: bf16 reads V and writes V^T; FP8 reads half of V, and K, and writes K's expanded rows too.
    assert pm.stage_bytes([64], 1, 128, "same") == 64 * 512
    assert pm.stage_bytes([64], 1, 128, "fp8_e4m3") == 64 * (128 + 256) * 2
    assert pm.stage_bytes([64], 1, 128, "fp4_e2m1") == 64 * ((65 + 256) * 2 + 4)
    # The machine: its CUs and clock price the attention stage, its HBM the stage's bytes (MI300X the default).
    case, loops = ("one", [4096] * 4, 32, 8, 128), (LOOP, LOOP)
    mi300x, mi355x = pm.model(case, loops, False, "same"), pm.model(case, loops, False, "same", pm.MACHINES["gfx950"])
    assert mi355x["vt"] == pytest.approx(mi300x["vt"] * 5.3 / 8.0)
    assert mi355x["attn"] == pytest.approx(mi300x["attn"] * (304 / 256) * (2.1 / 2.4))


@pytest.mark.skipif(not shutil.which("clang++-19"), reason="needs clang++-19 (gfx942 code objects)")
def test_fp8_paged_prefill_meets_the_issue_target_on_the_model():
    """The quantized variants' loops are the bf16 varlen loop (K from the K workspace): the attention stage's bound
    equals bf16's without a mask and is within 5% with the causal one (the cut blocks' loop: 7% more, the row's
    window widened per block); the V^T stage's extra K pass keeps every case at >= 0.9x the bf16 speed, FP4 too."""
    rows = pm.models(lambda mask, t: coreport.report("gfx942", "rtne", mask, "paged", 128, "bf16", kv_dtype=t))
    for r in rows:
        assert r["fp8_e4m3"]["attn"] <= r["same"]["attn"] * (1.05 if r["causal"] else 1.0), r
        assert r["speed_fp8"] >= pm.TARGET and r["speed_fp4"] >= pm.TARGET, r
