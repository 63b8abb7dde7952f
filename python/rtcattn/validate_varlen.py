"""Checks of a packed-sequence call (varlen, optionally with a paged KV cache) run before anything launches.

What needs no device memory is checked on every call: types, dtypes, shapes, devices, sizes. What
only device memory holds (cu_seqlens monotonic and ending at the totals, block ids inside the pool)
is checked only under RTCATTN_CHECK=1, because reading it costs a host sync; without it the kernels
clamp every sequence and page to the tensors (docs/numerics.md), so bad metadata never reaches
outside them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import validate


@dataclass(frozen=True)
class VarlenProblem:
    batch: int          # sequences: len(cu_seqlens_q) - 1
    heads: int
    heads_k: int
    head_dim: int
    total_q: int
    total_k: int        # rows of k / v (varlen); 0 when paged
    max_seqlen_q: int
    max_seqlen_k: int
    scale: float
    window: tuple = (-1, -1)
    page_size: int = 0  # paged: rows per page; 0 = k / v packed like q
    num_pages: int = 0
    pages_per_seq: int = 0

    @property
    def masked(self) -> bool:
        return self.window != (-1, -1)

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def kv(self) -> str:
        """The value of the manifest's kv axis this call needs."""
        return "paged" if self.paged else "varlen"


def _check_bf16(name: str, t, dims: int, shape_text: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: torch.bfloat16")
    if t.dim() != dims:
        raise ValueError(f"{name}.ndim={t.dim()} (shape {tuple(t.shape)}) is not supported; accepted: {dims} dims, "
                         f"{shape_text}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1)={t.stride(-1)} (strides {tuple(t.stride())}): the head dim must be "
                         "contiguous; accepted: stride 1 in the last dim (e.g. call .contiguous())")


def _check_int32(name: str, t, dims: int, shape_text: str, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: torch.int32")
    if t.dim() != dims:
        raise ValueError(f"{name}.ndim={t.dim()} (shape {tuple(t.shape)}) is not supported; accepted: {shape_text}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1)={t.stride(-1)} is not supported; accepted: 1 (contiguous last dim)")
    if t.device != device:
        raise ValueError(f"{name}.device={t.device} is not supported; accepted: q's device {device}")


def check_max(name: str, value) -> int:
    return validate.check_int(name, value, 1, validate.MAX_SIZE, " (the longest sequence's length)")


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode: str = "rtne",
                        softmax_scale=None, out: torch.Tensor | None = None, window: tuple = (-1, -1),
                        block_table: torch.Tensor | None = None) -> VarlenProblem:
    """Every check that needs no device memory. q [total_q, Hq, D]; k, v [total_k, Hk, D], or with
    block_table [num_pages, page_size, Hk, D]; cu_seqlens_* int32 [B + 1]; block_table int32 [B, pages]."""
    validate.check_choice("round_mode", round_mode, validate.axis_values("round_mode"))
    paged = block_table is not None
    kv_text = "[num_pages, page_size, Hk, D] (paged: block_table given)" if paged else "[total_k, Hk, D]"
    _check_bf16("q", q, 3, "[total_q, Hq, D]")
    for name, t in (("k", k), ("v", v)):
        _check_bf16(name, t, 4 if paged else 3, kv_text)
    device = q.device
    validate._check_same("devices", ("q.device", "k.device", "v.device"), (q.device, k.device, v.device))
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_int32(name, t, 1, "1 dim, [batch + 1]", device)
        if t.shape[0] < 1:
            raise ValueError(f"{name}.shape={tuple(t.shape)} is not supported; accepted: [batch + 1], at least 1 entry")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"len(cu_seqlens_q)={cu_seqlens_q.shape[0]} != len(cu_seqlens_k)={cu_seqlens_k.shape[0]}; "
                         "accepted: equal lengths (batch + 1 each)")
    batch = cu_seqlens_q.shape[0] - 1
    check_max("max_seqlen_q", max_seqlen_q)
    check_max("max_seqlen_k", max_seqlen_k)
    total_q, hq, d = q.shape
    validate._check_same("k and v shapes", ("k", "v"), (tuple(k.shape), tuple(v.shape)))
    hk, dk = k.shape[-2], k.shape[-1]
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"mismatched number of heads: q={hq}, k=v={hk}; accepted: q heads a multiple of the k/v "
                         "heads (equal, GQA or MQA)")
    validate._check_same("head dim", ("q", "k", "v"), (d, dk, v.shape[-1]))
    supports, rule = validate.head_dim_rule()
    if not supports(d):
        raise ValueError(f"head dim D={d} (q.shape={tuple(q.shape)}) is not supported; accepted: {rule}")
    page_size = num_pages = pages = 0
    total_k = 0
    if paged:
        _check_int32("block_table", block_table, 2, "2 dims, [batch, max_pages_per_seq]", device)
        if block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ValueError(f"block_table.shape={tuple(block_table.shape)} is not supported; accepted: "
                             f"[batch={batch}, pages >= 1] (batch = len(cu_seqlens_q) - 1)")
        num_pages, page_size = k.shape[0], k.shape[1]
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"k.shape={tuple(k.shape)} is not supported; accepted: [num_pages >= 1, page_size >= 1, "
                             "Hk, D]")
        pages = block_table.shape[1]
    else:
        total_k = k.shape[0]
        if total_k == 0 and total_q > 0:
            raise ValueError(f"k.shape={tuple(k.shape)} (total_k=0) is not supported; accepted: total_k >= 1")
    if out is not None:  # the metadata too: the kernels read cu_seqlens and the block table all along
        metadata = (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)) + (
            (("block_table", block_table),) if paged else ())
        validate.check_out(out, q, (("q", q), ("k", k), ("v", v)) + metadata)
    return VarlenProblem(batch, hq, hk, d, total_q, total_k, max_seqlen_q, max_seqlen_k,
                         validate.check_scale(softmax_scale, d), tuple(window), page_size, num_pages, pages)


def check_device_metadata(cu_seqlens_q, cu_seqlens_k, block_table, problem: VarlenProblem) -> None:
    """RTCATTN_CHECK=1: reads cu_seqlens and the block table back (a host sync) and checks their values."""
    cq, ck = (t.to("cpu").tolist() for t in (cu_seqlens_q, cu_seqlens_k))
    # Rows past max_seqlen_q are not computed, so a longer q sequence is refused; max_seqlen_k bounds
    # nothing (every kernel uses all of a sequence's keys, as FlashAttention does).
    for name, cu, total, longest in (("cu_seqlens_q", cq, problem.total_q, ("max_seqlen_q", problem.max_seqlen_q)),
                                     ("cu_seqlens_k", ck, None if problem.paged else problem.total_k, None)):
        if cu[0] != 0:
            raise ValueError(f"{name}[0]={cu[0]} is not supported; accepted: 0 (RTCATTN_CHECK=1)")
        for b in range(problem.batch):
            if cu[b + 1] < cu[b]:
                raise ValueError(f"{name}[{b + 1}]={cu[b + 1]} < {name}[{b}]={cu[b]}; accepted: non-decreasing "
                                 "offsets (RTCATTN_CHECK=1)")
            if longest is not None and cu[b + 1] - cu[b] > longest[1]:
                raise ValueError(f"sequence {b} has length {cu[b + 1] - cu[b]} > {longest[0]}={longest[1]}; "
                                 f"accepted: {longest[0]} >= every length (RTCATTN_CHECK=1)")
        if total is not None and cu[-1] != total:
            raise ValueError(f"{name}[-1]={cu[-1]} is not supported; accepted: the packed rows, {total} "
                             "(RTCATTN_CHECK=1)")
    if not problem.paged:
        return
    table = block_table.to("cpu")
    for b in range(problem.batch):
        n = -(-(ck[b + 1] - ck[b]) // problem.page_size)
        if n > problem.pages_per_seq:
            raise ValueError(f"sequence {b} has {ck[b + 1] - ck[b]} keys, {n} pages > block_table.shape[1]="
                             f"{problem.pages_per_seq}; accepted: a block table that holds every page "
                             "(RTCATTN_CHECK=1)")
        ids = table[b, :n]
        bad = ((ids < 0) | (ids >= problem.num_pages)).nonzero()
        if bad.numel():
            j = int(bad[0, 0])
            raise ValueError(f"block_table[{b}, {j}]={int(ids[j])} is not supported; accepted: a page id in "
                             f"[0, {problem.num_pages}) (RTCATTN_CHECK=1)")
