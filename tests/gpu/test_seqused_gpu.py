"""seqused_k on a GPU (the packed forms' optional KV lengths, which flash_attn_with_kvcache passes): on Hopper the sm90
kernel serves these calls (dispatch's pick is asserted), varlen and paged, GQA / MQA, causal and windows, the three
modes, KV lengths 0, 1, 17, 300 and 4097 below the lengths cu_seqlens_k gives, first rows out of order and shared.

With seqused_k, sequence b uses seqused_k[b] keys from its first key row (varlen: cu_seqlens_k[b]; paged: its
block-table row). Each call must equal bit for bit the same attention written without seqused_k (the used keys gathered
into a packed k; for paged calls, the same pool with cu_seqlens_k holding the used lengths), and that call must meet
the fp64 reference per sequence (varlen_suite.check_accuracy), so the call with seqused_k meets it too."""
import pytest
import torch

import varlen_suite as vs
from rtc_testing import round_modes
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref

pytestmark = pytest.mark.gpu

DEV = "cuda"
MODES = round_modes()
I32 = torch.int32


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def call(q, k, v, cu_q, cu_k, max_q, max_k, mode, window, block_table=None, seqused_k=None):
    return torch.ops.rtcattn.fwd_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mode, None, True, *window, block_table,
                                        seqused_k)


def check_kernel(q, k, v, cu_q, cu_k, max_q, max_k, mode, window, block_table, used):
    """On Hopper a call with seqused_k runs sm90, or sm90_decode for at most 16 query rows per sequence (before this
    was verified, the baseline served them)."""
    sel = attention_fwd.selection_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mode, None, window, block_table, used)
    if _hopper():
        assert sel.kernel.name == ("sm90_decode" if max_q <= 16 else "sm90"), (sel.kernel.name, sel.why)


def assert_same(got, want, tag):
    assert torch.equal(ref.bf16_bits(got[0].cpu()), ref.bf16_bits(want[0].cpu())), f"output differs: {tag}"
    assert torch.equal(got[1].cpu().view(I32), want[1].cpu().view(I32)), f"LSE differs: {tag}"


def gathered(k, starts, used):
    """The packed k of the same keys: rows starts[b]:starts[b] + used[b] of k, one sequence after another."""
    rows = [k[s:s + n] for s, n in zip(starts, used)]
    return torch.cat(rows) if sum(used) else k[:1]


# (lens_q, starts, used, cu lengths): used <= the room each first row leaves and below most cu lengths.
VARLEN = [
    ([3, 1, 17, 300, 129], None, [0, 1, 17, 300, 4097], [5, 3, 40, 512, 4200]),   # in order, cu lengths longer
    ([1, 40, 7, 300], [4300, 0, 17, 100], [17, 4097, 300, 1], None),              # out of order, rows shared
]
WINDOWS = [(-1, -1), (-1, 0), (17, 3), (200, 0)]
HEADS = [(8, 2), (4, 1), (8, 8)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("case", range(len(VARLEN)))
@pytest.mark.parametrize("d", [128, 64, 256])
def test_varlen_seqused_equals_gathered_keys_and_fp64(d, case, window):
    lens_q, starts, used, cu_lens = VARLEN[case]
    i = WINDOWS.index(window)
    (hq, hk), mode = HEADS[(case + i) % 3], MODES[(case + i + d) % 3]
    gen = torch.Generator().manual_seed(d + 10 * case + i)
    if starts is None:  # first rows from the cu lengths, each longer than what the sequence uses
        cu_k = vs.cu(cu_lens)
        starts, total_k = cu_k[:-1].tolist(), int(cu_k[-1])
    else:
        total_k = max(s + n for s, n in zip(starts, used))
        cu_k = torch.tensor(starts + [total_k], dtype=I32)
    q = torch.randn(sum(lens_q), hq, d, generator=gen).to(torch.bfloat16).to(DEV)
    k, v = (torch.randn(total_k, hk, d, generator=gen).to(torch.bfloat16).to(DEV) for _ in range(2))
    cu_q, max_q, max_k = vs.cu(lens_q).to(DEV), max(lens_q), max(used)
    seqused = torch.tensor(used, dtype=I32, device=DEV)
    check_kernel(q, k, v, cu_q, cu_k.to(DEV), max_q, max_k, mode, window, None, seqused)
    got = call(q, k, v, cu_q, cu_k.to(DEV), max_q, max_k, mode, window, seqused_k=seqused)
    want = vs.Batch(q, gathered(k, starts, used), gathered(v, starts, used), cu_q, vs.cu(used).to(DEV), max_q, max_k)
    out, lse = vs.check_accuracy(want, mode, window, what=f"seqused varlen d={d} case={case}")
    assert_same(got, (out, lse), f"varlen d={d} case={case} window={window} mode={mode} heads={hq}/{hk}")


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (17, 3)])
@pytest.mark.parametrize("page", [16, 64])
def test_paged_seqused_equals_cu_lengths_and_fp64(page, window):
    """The pool holds each sequence's cu length of keys; seqused_k uses fewer (0, 1, 17, 300, 4097)."""
    lens_q, used, cu_lens = [3, 1, 17, 300, 129], [0, 1, 17, 300, 4097], [5, 3, 40, 512, 4200]
    b = vs.to_paged(vs.make_batch(lens_q, cu_lens, 8, 2, 128, DEV, seed=page), page, seed=page)
    seqused = torch.tensor(used, dtype=I32, device=DEV)
    mode = MODES[page % 3]
    check_kernel(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, max(used), mode, window, b.block_table, seqused)
    got = call(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, max(used), mode, window, b.block_table, seqused)
    want = vs.Batch(b.q, b.k, b.v, b.cu_q, vs.cu(used).to(DEV), b.max_q, max(used), b.block_table)
    out, lse = vs.check_accuracy(want, mode, window, what=f"seqused paged {page}")
    assert_same(got, (out, lse), f"paged page={page} window={window} mode={mode}")


def test_seqused_past_the_bounds_is_clamped():
    """seqused_k past max_seqlen_k, past the rows left, negative, and first rows negative or past k: each sequence gets
    the clamped keys
    (varlen: min(seqused, max_seqlen_k, total_k - first row); paged: min(seqused, max_seqlen_k, its block-table row's
    capacity)), and nothing outside the tensors is read (compute-sanitizer's run covers such calls)."""
    gen = torch.Generator().manual_seed(11)
    lens_q, total_k, max_k = [3, 2, 4, 1], 150, 100
    q = torch.randn(sum(lens_q), 2, 128, generator=gen).to(torch.bfloat16).to(DEV)
    k, v = (torch.randn(total_k, 1, 128, generator=gen).to(torch.bfloat16).to(DEV) for _ in range(2))
    starts, used = [-50, 120, 1 << 30, 10], [140, 90, 5, -7]
    clamped_starts, clamped = [0, 120, total_k, 10], [100, 30, 0, 0]
    cu_q = vs.cu(lens_q).to(DEV)
    seqused = torch.tensor(used, dtype=I32, device=DEV)
    check_kernel(q, k, v, cu_q, torch.tensor(starts + [0], dtype=I32, device=DEV), 4, max_k, "rtne", (-1, 0), None,
                 seqused)
    got = call(q, k, v, cu_q, torch.tensor(starts + [0], dtype=I32, device=DEV), 4, max_k, "rtne", (-1, 0),
               seqused_k=seqused)
    want = call(q, gathered(k, clamped_starts, clamped), gathered(v, clamped_starts, clamped), cu_q,
                vs.cu(clamped).to(DEV), 4, max_k, "rtne", (-1, 0))
    assert_same(got, want, "varlen clamped")
    b = vs.to_paged(vs.make_batch([2, 3], [40, 64], 2, 1, 128, DEV, seed=2), 16, seed=2, spare_entries=0)
    width = b.block_table.shape[1] * 16  # 64: the rows a block-table row reaches
    big = torch.tensor([1 << 30, 1 << 30], dtype=I32, device=DEV)
    got = call(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, 50, "rtne", (-1, -1), b.block_table, big)
    want = call(b.q, b.k, b.v, b.cu_q, vs.cu([min(50, width)] * 2).to(DEV), b.max_q, 50, "rtne", (-1, -1),
                b.block_table)
    assert_same(got, want, "paged clamped")
