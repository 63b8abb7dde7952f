"""The static issue model of the gfx942 kernel (the lab tool .ci/lab/gfx942/isa_model.py): the bound of an
iteration, the rounds of the runtime's plan, the varlen model's work items against the runtime's plan, and per
head-dim bucket the bound below MoonMath's MI300X times scaled by D / 128."""
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci" / "lab" / "gfx942"))

import isa_model  # noqa: E402


def test_model_bound_is_the_larger_pipe():
    loop = {"mfma": 192, "valu": 500, "trans": 50, "lds_bytes": 4096, "vmem16": 16}
    c = isa_model.iteration_cycles(loop)
    assert c["mfma"] == 2 * 192 * 16 and c["valu"] == 2 * (450 * 4 + 50 * 16)
    assert c["l1"] == 8 * 16 * 1024 / isa_model.L1_BYTES_PER_CLK
    assert c["bound"] == max(c["mfma"], c["valu"], c["lds"], c["l1"])
    assert isa_model.iteration_cycles(dict(loop, vmem16=200))["bound"] == 8 * 200 * 1024 / isa_model.L1_BYTES_PER_CLK
    # One round of 304 items of 2 kv blocks each; a split can only shorten the fractional round.
    assert isa_model.lower_bound_ms((1, 304, 128), 1000.0, False) == pytest.approx(2 * 1000 / 2.1e9 * 1e3)
    assert (isa_model.lower_bound_ms((4, 16, 16384), 1000.0, True)
            <= isa_model.lower_bound_ms((4, 16, 16384), 1000.0, False))


def test_varlen_model_blocks_match_the_runtime_plan():
    """The model's per-item kv blocks add up to the runtime's plan (kv_span) of each sequence."""
    for causal in (False, True):
        items = isa_model.varlen_items(isa_model.VARLEN_MIX, 1, causal)
        plans = [isa_model.plan((1, 1, s), split=False, causal=causal) for s in isa_model.VARLEN_MIX]
        assert sum(u + m for u, m in items) == sum(p["blocks_total"] for p in plans)
        assert sum(m for _, m in items) == sum(p["blocks_masked"] for p in plans)
        assert len(items) == sum(p["items"] for p in plans)
    # Grid order: the longest sequence's last q block (the most keys under a causal mask) comes first.
    assert isa_model.varlen_items([1000, 100], 2, True)[:2] == [isa_model._item_blocks(1000, True)[-1]] * 2


def test_varlen_model_bounds():
    m = isa_model.varlen_model_ms([384] * 304, 1, 1000.0, 1000.0, False)
    assert m["items"] == 304 and m["bound"] == pytest.approx(6 * 1000 / 2.1e9 * 1e3) == m["greedy"]
    m = isa_model.varlen_model_ms([8192, 64], 1, 1000.0, 2000.0, True)
    assert m["greedy"] >= m["bound"] > 0


@pytest.mark.skipif(not shutil.which("clang++-19"), reason="needs clang++-19 for the gfx942 code objects")
def test_every_bucket_bound_is_below_moonmath_scaled_by_head_dim():
    """The issue's target for the static model: per bucket and dtype (gfx942, dense, rtne and rtz), on every seed
    shape, the bound (planned split) is below MoonMath's published time scaled by D / 128. The scaled figure is the
    time a kernel as fast as MoonMath's would take at D if its time followed the work (4 B H S^2 D flops)."""
    from rtcattn.tools import coreport
    reports = [coreport.report("gfx942", mode, "none", "dense", d, dtype) for d in coreport.buckets()
               for mode, dtype in (("rtne", "bf16"), ("rtz", "bf16"), ("rtne", "fp16"))]
    rows = isa_model.bucket_bounds(reports)
    assert {(x["head_dim"], x["dtype"], x["mode"]) for x in rows} == {(r.head_dim, r.dtype, r.mode) for r in reports}
    assert len(rows) == len(reports) * len(isa_model.MOONMATH_MS)
    over = [x for x in rows if not x["ratio"] < 1.0]
    assert not over, over
    assert all(x["moonmath_scaled_ms"] == pytest.approx(isa_model.MOONMATH_MS[x["shape"]][x["mode"] == "rtz"]
                                                        * x["head_dim"] / 128) for x in rows)
