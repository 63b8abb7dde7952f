"""Packed sequences (varlen) and paged KV as reusable checks, for rtcattn.forward_varlen on any device.

Each check builds its batch, runs it, and compares every sequence with the fp64 reference of that
sequence alone (masks aligned bottom-right to its own lengths), under the numerics contract's bounds.
Paged runs are built from the packed ones (the same keys, in shuffled pages of a pool with junk in
the spare pages and a block table longer than needed) and must equal them bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

import rtcattn
from numerics_suite import NORMWISE_BOUND
from rtcattn.ops.attention_fwd import reference as ref


@dataclass
class Batch:
    q: torch.Tensor
    k: torch.Tensor               # packed [total_k, Hk, D], or pages [num_pages, page, Hk, D]
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    block_table: torch.Tensor | None = None

    def tag(self) -> str:
        lens_q = (self.cu_q[1:] - self.cu_q[:-1]).tolist()
        lens_k = (self.cu_k[1:] - self.cu_k[:-1]).tolist()
        pages = "" if self.block_table is None else f" page={self.k.shape[1]}"
        return (f"Hq={self.q.shape[1]} Hk={self.k.shape[-2]} lens_q={lens_q[:8]} lens_k={lens_k[:8]} "
                f"B={len(lens_q)}{pages}")


def cu(lens) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def make_batch(lens_q, lens_k, hq, hk, d, device, seed=0, dtype=torch.bfloat16) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n, h: torch.randn((n, h, d), generator=gen).to(dtype).to(device)  # noqa: E731
    return Batch(rand(sum(lens_q), hq), rand(max(sum(lens_k), 1), hk), rand(max(sum(lens_k), 1), hk),
                 cu(lens_q).to(device), cu(lens_k).to(device), max(max(lens_q), 1), max(max(lens_k), 1))


def to_paged(b: Batch, page: int, seed=0, spare_pages=3, spare_entries=2) -> Batch:
    """The same keys in a paged pool: pages in shuffled order, junk (finite) in every row no sequence
    owns, block-table rows longer than needed with valid ids past the used entries."""
    gen = torch.Generator().manual_seed(seed + 1)
    lens = (b.cu_k[1:] - b.cu_k[:-1]).tolist()
    need = [-(-n // page) for n in lens]
    num_pages = sum(need) + spare_pages
    order = torch.randperm(num_pages, generator=gen).tolist()
    width = max(max(need), 1) + spare_entries
    table = torch.randint(0, num_pages, (len(lens), width), generator=gen, dtype=torch.int32)
    hk, d = b.k.shape[1], b.k.shape[2]
    pools = [torch.randn((num_pages, page, hk, d), generator=gen).to(b.k.dtype) for _ in range(2)]
    k, v, start, nxt = b.k.cpu(), b.v.cpu(), b.cu_k.tolist(), 0
    for s, n in enumerate(lens):
        for j in range(need[s]):
            pid = order[nxt]
            nxt += 1
            table[s, j] = pid
            rows = min(page, n - j * page)
            src = slice(start[s] + j * page, start[s] + j * page + rows)
            pools[0][pid, :rows], pools[1][pid, :rows] = k[src], v[src]
    dev = b.q.device
    return replace(b, k=pools[0].to(dev), v=pools[1].to(dev), block_table=table.to(dev))


def run(b: Batch, mode="rtne", window=(-1, -1), lse=True, out=None, scale=None):
    return rtcattn.forward_varlen(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, round_mode=mode,
                                  softmax_scale=scale, return_lse=lse, window_size=window, out=out,
                                  block_table=b.block_table)


def check_accuracy(b: Batch, mode="rtne", window=(-1, -1), what=""):
    """Per sequence, as the dense contract: err <= 2 err(R) + 1e-5, normwise < NORMWISE_BOUND, LSE [Hq, total_q]
    within 1e-4 max(1, |lse64|); a row that sees no key (a window, or a sequence with no key) is +0 with
    LSE -Inf. Returns (out, lse)."""
    out, lse = run(b, mode, window)
    tag = f"{what} {b.q.dtype} mode={mode} window={window} {b.tag()}"
    assert out.dtype == b.q.dtype and out.shape == b.q.shape, tag
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (b.q.shape[1], b.q.shape[0]), (tuple(lse.shape), tag)
    args = (b.q, b.k, b.v, b.cu_q.cpu(), b.cu_k.cpu())     # on q's device: fast on GPUs
    o64, lse64 = (t.cpu() for t in ref.reference_varlen(*args, None, None, window, b.block_table))
    r = ref.reference_varlen(*args, mode, None, window, b.block_table).cpu()
    err, nrm = ref.errors(out.cpu(), o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all(), f"non-finite output from finite inputs: {tag}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    bound = NORMWISE_BOUND[b.q.dtype]
    assert nrm < bound or o64.abs().max() == 0, f"normwise error {nrm:.3g} >= {bound:g}: {tag}"
    close = ref.lse_close(lse.cpu(), lse64)
    assert bool(close.all()), f"LSE off at {int((~close).sum())} of {close.numel()}: {tag}"
    empty = (lse64 == -math.inf).T                                          # [total_q, H]
    assert bool((ref.bf16_bits(out.cpu())[empty] == 0).all()), f"a row that sees no key is not +0: {tag}"
    return out, lse


def packed_kernels(arch: str) -> list:
    """Every kernel of the manifest that serves varlen and paged calls on arch (e.g. "gfx942-emu", "sm_90a"):
    a check over all of them covers each new kernel without being told of it."""
    from rtcattn.runtime import manifest
    spec = manifest.load().op("attention_fwd")
    kv = spec.axis("kv")
    return [k.name for k in spec.kernels
            if arch in k.archs and all(k.why_not(kv, m) is None for m in ("varlen", "paged"))]


def check_short_max_seqlen_k(b: Batch, max_k: int, mode="rtne", window=(-1, -1), what=""):
    """FlashAttention's contract: max_seqlen_k only sizes the launch. With it below some real KV length,
    every key of each sequence still counts (check_accuracy against the fp64 reference, which never
    reads max_seqlen_k). Returns (out, lse)."""
    longest = int((b.cu_k[1:] - b.cu_k[:-1]).max())
    assert max_k < longest, f"max_seqlen_k={max_k} is not below the longest KV length {longest}: nothing to check"
    return check_accuracy(replace(b, max_k=max_k), mode, window, what=f"{what} max_seqlen_k={max_k}")


def check_paged_equals_packed(b: Batch, page: int, mode="rtne", window=(-1, -1), seed=0):
    """The paged call gives the packed call's output and LSE bit for bit (same kernel math)."""
    o1, l1 = run(b, mode, window)
    o2, l2 = run(to_paged(b, page, seed), mode, window)
    tag = f"page={page} mode={mode} window={window} {b.tag()}"
    assert torch.equal(ref.bf16_bits(o1.cpu()), ref.bf16_bits(o2.cpu())), f"paged output != packed: {tag}"
    assert torch.equal(l1.cpu().view(torch.int32), l2.cpu().view(torch.int32)), f"paged LSE != packed: {tag}"


def check_out_and_determinism(b: Batch, mode="rtne", window=(-1, -1)):
    """out= is written in place (the returned tensor is it) and repeated calls agree bit for bit."""
    out = torch.full_like(b.q, float("nan"))
    res, lse = run(b, mode, window, out=out)
    assert res.data_ptr() == out.data_ptr()
    again, lse2 = run(b, mode, window)
    assert torch.equal(ref.bf16_bits(out.cpu()), ref.bf16_bits(again.cpu()))
    assert torch.equal(lse.cpu().view(torch.int32), lse2.cpu().view(torch.int32))


def shared_pages(lens_q, lens_k, hq, hk, d, page, device, seed=0) -> Batch:
    """A paged batch whose sequences all read one page list (each the first lens_k[b] keys of it): the
    block table is one row expanded to every sequence (stride 0), as a shared prefix cache gives it."""
    one = to_paged(make_batch([1], [max(lens_k)], hq, hk, d, device, seed), page, seed)
    b = make_batch(lens_q, lens_k, hq, hk, d, device, seed)
    return replace(b, k=one.k, v=one.v, block_table=one.block_table.expand(len(lens_q), -1))


def check_expanded_table_equals_materialised(b: Batch, mode="rtne", window=(-1, -1)):
    """A block table with stride 0 gives what the same table copied into memory gives, bit for bit."""
    assert b.block_table.stride(0) == 0
    o1, l1 = run(b, mode, window)
    o2, l2 = run(replace(b, block_table=b.block_table.contiguous()), mode, window)
    tag = f"expanded table mode={mode} window={window} {b.tag()}"
    assert torch.equal(ref.bf16_bits(o1.cpu()), ref.bf16_bits(o2.cpu())), f"output != materialised table's: {tag}"
    assert torch.equal(l1.cpu().view(torch.int32), l2.cpu().view(torch.int32)), f"LSE != materialised table's: {tag}"
