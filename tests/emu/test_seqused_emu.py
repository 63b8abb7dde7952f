"""seqused_k (the packed forms' optional KV lengths) on the emulator, for the baseline and gfx942 kernels.

With seqused_k, sequence b uses seqused_k[b] keys from its first key row (varlen: cu_seqlens_k[b], in any
order, rows shared between sequences; paged: its block-table row), clamped to max_seqlen_k and to the rows it
can reach. Every call must equal bit for bit the same attention expressed without seqused_k: the keys copied
into a packed k whose cu_seqlens_k gives those lengths (and for paged calls, the same pool with cu_seqlens_k
holding the lengths). Values past every bound only complete: the emulator fails a launch on any access outside
the tensors, so completing (and equalling the clamped call) is the proof.
"""
import pytest
import torch

import varlen_suite as vs
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

KERNELS = ["baseline", "gfx942"]


@pytest.fixture
def pin(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    return lambda kernel: dispatch.pinned(kernel=kernel)


def call(q, k, v, cu_q, cu_k, max_q, max_k, window=(-1, -1), block_table=None, seqused_k=None, mode="rtne"):
    return torch.ops.rtcattn.fwd_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mode, None, True, *window, block_table,
                                        seqused_k)


def assert_same(a, b, tag):
    assert torch.equal(ref.bf16_bits(a[0]), ref.bf16_bits(b[0])), f"output differs: {tag}"
    assert torch.equal(a[1].view(torch.int32), b[1].view(torch.int32)), f"LSE differs: {tag}"


def gathered(k, starts, used):
    """The packed k of the same keys: rows starts[b]:starts[b] + used[b] of k, one sequence after another."""
    rows = [k[s:s + n] for s, n in zip(starts, used)]
    return torch.cat(rows) if sum(used) else k[:1]


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


CASES = [  # (lens_q, starts, used, window, heads): starts out of order, overlapping, one sequence without keys
    ([1, 3, 16, 5], [150, 0, 40, 40], [60, 33, 100, 0], (-1, 0), (4, 2)),
    ([2, 7, 1], [200, 7, 90], [77, 130, 1], (20, 3), (8, 1)),
    ([9, 4], [0, 0], [300, 129], (-1, -1), (2, 2)),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_varlen_seqused_equals_gathered_keys(pin, kernel, case):
    lens_q, starts, used, window, (hq, hk) = CASES[case]
    gen = torch.Generator().manual_seed(case)
    total_k = 320
    q = torch.randn(sum(lens_q), hq, 128, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(total_k, hk, 128, generator=gen).to(torch.bfloat16) for _ in range(2))
    cu_q = vs.cu(lens_q)
    max_q, max_k = max(lens_q), max(used)
    mode = ("rtne", "rtna", "rtz")[case]
    with pin(kernel):
        got = call(q, k, v, cu_q, i32(starts + [0]), max_q, max_k, window, seqused_k=i32(used), mode=mode)
        want = call(q, gathered(k, starts, used), gathered(v, starts, used), cu_q, vs.cu(used), max_q, max_k, window,
                    mode=mode)
    assert_same(got, want, f"{kernel} case {case}")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page", [16, 64])
def test_paged_seqused_equals_cu_seqlens_k(pin, kernel, page):
    b = vs.to_paged(vs.make_batch([1, 16, 4], [70, 1, 200], 4, 2, 128, "cpu", seed=page), page, seed=page)
    used = (b.cu_k[1:] - b.cu_k[:-1]).to(torch.int32)
    junk_cu_k = i32([5, -3, 1 << 30, 7])  # not read for paged lengths when seqused_k is given
    with pin(kernel):
        got = call(b.q, b.k, b.v, b.cu_q, junk_cu_k, b.max_q, b.max_k, (-1, 0), b.block_table, used)
        want = call(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, (-1, 0), b.block_table)
    assert_same(got, want, f"{kernel} page={page}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_out_of_range_seqused_and_starts_are_clamped(pin, kernel):
    """Lengths past max_seqlen_k, past the rows left, negative; first rows negative or past k: each sequence gets
    the clamped keys (varlen: min(seqused, max_seqlen_k, total_k - first row); paged: min(seqused, max_seqlen_k,
    its block-table row's capacity)), and nothing outside the tensors is touched."""
    gen = torch.Generator().manual_seed(11)
    lens_q, total_k, max_k = [3, 2, 4, 1], 150, 100
    q = torch.randn(sum(lens_q), 2, 128, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(total_k, 1, 128, generator=gen).to(torch.bfloat16) for _ in range(2))
    starts, used = [-50, 120, 1 << 30, 10], [40, 90, 5, -7]
    clamped_starts = [0, 120, total_k, 10]
    clamped = [40, 30, 0, 0]
    cu_q = vs.cu(lens_q)
    with pin(kernel):
        got = call(q, k, v, cu_q, i32(starts + [0]), 4, max_k, seqused_k=i32(used))
        want = call(q, gathered(k, clamped_starts, clamped), gathered(v, clamped_starts, clamped), cu_q,
                    vs.cu(clamped), 4, max_k)
        assert_same(got, want, f"{kernel} varlen")
        b = vs.to_paged(vs.make_batch([2, 3], [40, 64], 2, 1, 128, "cpu", seed=2), 16, seed=2, spare_entries=0)
        width = b.block_table.shape[1] * 16  # 64: sequence 1's capacity
        got = call(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, 50, (-1, -1), b.block_table, i32([1 << 30, 1 << 30]))
        want = call(b.q, b.k, b.v, b.cu_q, vs.cu([min(50, width)] * 2), b.max_q, 50, (-1, -1), b.block_table)
        assert_same(got, want, f"{kernel} paged")

