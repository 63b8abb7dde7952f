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
