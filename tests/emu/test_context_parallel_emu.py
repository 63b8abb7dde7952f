"""Context parallelism (rtcattn.distributed) on CPU processes over gloo, each on the emulated gfx942: 2 and 4 ranks,
zigzag and contiguous sharding, causal and not, windows (one-sided with causal, two-sided without), GQA, both layouts,
bf16 and fp16. The unsharded result meets the numerics contract's accuracy rule against the fp64 reference of the
whole sequence (numerics_suite.check_accuracy's: err <= 2 err(R) + 1e-5, the normwise bound, the LSE within 1e-4, rows
that see no key 0 with LSE -Inf), stays within the merge's bound of the single call (docs/numerics.md, "Context
parallel": 2 eps max|V| of q's dtype), and a second run gives the same bits; the backward (the ring in reverse, dK / dV
travelling home) meets the backward's rule against the fp64 gradients widened by the partials' roundings: each
(query chunk, key chunk) pair's gradient comes out of the kernel rounded to q's dtype before the fp32 sum, at most
2W of them a key element under zigzag, W under contiguous: + pairs x eps / 2 x max|g64| (docs/numerics.md)."""
import pytest
import torch

import context_parallel_suite as cps

pytestmark = pytest.mark.emu

# (causal, window, sharding, layout, dtype, hk)
CASES = [
    (True, (-1, -1), "zigzag", "bshd", torch.bfloat16, 1),
    (False, (-1, -1), "contiguous", "bshd", torch.bfloat16, 2),
    (True, (-1, -1), "contiguous", "bhsd", torch.float16, 1),
    (True, (5, -1), "zigzag", "bhsd", torch.bfloat16, 2),
    (False, (3, 9), "zigzag", "bshd", torch.bfloat16, 1),
    (True, (20, -1), "contiguous", "bshd", torch.bfloat16, 2),
]
SHAPE = (1, 64, 2, 64)   # B, S, Hq, D


@pytest.fixture(autouse=True)
def emulate(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def ranked(request, tmp_path_factory):
    world = request.param
    return world, cps.run_ranks(world, "gloo", CASES, SHAPE, tmp_path_factory.mktemp(f"cp{world}"),
                                {"RTCATTN_EMULATE": "gfx942"})


@pytest.mark.parametrize("n", range(len(CASES)), ids=[cps.label(c) for c in CASES])
def test_whole_sequence_against_fp64_and_the_single_call(ranked, n):
    world, got = ranked
    cps.check_case(world, CASES[n], n, SHAPE, got)
