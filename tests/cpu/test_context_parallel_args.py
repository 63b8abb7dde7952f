"""rtcattn.distributed without a process group or a GPU: the sharding helpers' checks and round trip, and the
context_parallel bench suite's plan (its cases, and --cp-lengths refused by value)."""
import argparse

import pytest
import torch

from rtcattn.distributed import bench, sharding


@pytest.mark.parametrize("cut", sharding.SHARDINGS)
def test_shards_cover_the_sequence_once(cut):
    x = torch.arange(2 * 24 * 3).view(2, 24, 3)
    world = 3
    parts = [sharding.shard(x, r, world, cut) for r in range(world)]
    assert all(p.shape == (2, 8, 3) for p in parts)
    order = [c for r in range(world) for c in sharding.chunks_of(r, world, cut)]
    n = sharding.pieces(cut, world)
    chunks = x.chunk(n, 1)
    assert sorted(order) == list(range(n))
    assert torch.equal(torch.cat(parts, 1), torch.cat([chunks[c] for c in order], 1))
    if cut == "zigzag":
        assert sharding.chunks_of(0, world, cut) == (0, 5) and sharding.chunks_of(2, world, cut) == (2, 3)


def test_bad_sharding_and_lengths_are_named():
    with pytest.raises(ValueError, match="sharding='ring' is not supported"):
        sharding.shard(torch.zeros(1, 8, 1, 8), 0, 2, "ring")
    with pytest.raises(ValueError, match=r"x.shape\[1\]=6 is not supported .* a multiple of 4"):
        sharding.shard(torch.zeros(1, 6, 1, 8), 0, 2, "zigzag")


def test_bench_plan_lists_the_cases_and_refuses_bad_lengths(capsys):
    rows = bench.plan(argparse.Namespace(cp_lengths="131072,262144", cp_world=2))["rows"]
    assert [(r["S"], r["mask"], r["sharding"]) for r in rows] == [
        (131072, "causal", "zigzag"), (131072, "full", "contiguous"),
        (262144, "causal", "zigzag"), (262144, "full", "contiguous")]
    assert rows[0]["attention TFLOP"] == pytest.approx(rows[1]["attention TFLOP"] / 2, abs=0.01)
    with pytest.raises(ValueError, match="--cp-lengths entry 1000 is not supported"):
        bench.plan(argparse.Namespace(cp_lengths="1000", cp_world=2))


@pytest.mark.parametrize("seq_dim", [1, 2])
def test_a_fresh_merge_is_the_merge_of_an_empty_accumulator(seq_dim):
    """ring._merge with fresh=True (rows no partial reached yet: a copy) gives the bits the merge gives over an
    accumulator of zeros and -inf LSEs, rows that see no key (o 0, LSE -inf) included; a second partial merged in
    place agrees with the merge's formula in fp64 within fp32 rounding."""
    from rtcattn.distributed import ring
    g = torch.Generator().manual_seed(3)
    shape = (2, 8, 3, 16) if seq_dim == 1 else (2, 3, 8, 16)
    o = torch.randn(shape, generator=g).to(torch.bfloat16)
    lse = torch.randn((2, 3, 8), generator=g)
    lse[:, :, 5] = -ring.INF  # a row that sees no key: its o is 0
    o.narrow(seq_dim, 5, 1).zero_()
    accs = [(torch.zeros(shape), torch.full((2, 3, 8), -ring.INF)) for _ in range(2)]
    ring._merge(*accs[0], (o, lse), 0, seq_dim, fresh=False)
    ring._merge(*accs[1], (o, lse), 0, seq_dim, fresh=True)
    assert torch.equal(accs[0][0], accs[1][0]) and torch.equal(accs[0][1], accs[1][1])
    o2, lse2 = torch.randn(shape, generator=g).to(torch.bfloat16), torch.randn((2, 3, 8), generator=g)
    acc_o, acc_lse = accs[1]
    ring._merge(acc_o, acc_lse, (o2, lse2), 0, seq_dim)
    new = torch.logaddexp(lse.double(), lse2.double())
    w1, w2 = torch.exp(lse.double() - new), torch.exp(lse2.double() - new)
    if seq_dim == 1:
        w1, w2 = w1.transpose(1, 2)[..., None], w2.transpose(1, 2)[..., None]
    else:
        w1, w2 = w1[..., None], w2[..., None]
    want = o.double() * w1 + o2.double() * w2
    assert torch.allclose(acc_o.double(), want, rtol=1e-6, atol=1e-6)
    assert torch.allclose(acc_lse.double(), new, rtol=1e-6, atol=1e-6)
