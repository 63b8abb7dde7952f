"""flash_attn_with_kvcache's device work before attention: the append of k / v into the cache, the rotary embedding
of q and the new k, and the packed call's metadata. All of it is torch ops on the inputs' device, queued on the
current stream: no value is read back to the host (no .item(), .tolist() or boolean-mask indexing), so a call never
waits on the device. Values only the device holds are clamped so that every read and write stays inside the
tensors (RTCATTN_CHECK=1 refuses them instead: check_device_values, a host sync).

Positions, as flash-attn 2.x defines them: sequence b's new rows go to cache rows cache_seqlens[b] + i (of cache
batch cache_batch_idx[b], or through its block-table row), its keys are rows cache_leftpad[b] ..
cache_seqlens[b] + S_new - 1, and the rotary position of a row is its cache row; q's rows sit at cache_seqlens[b] + i
when the call is causal or local, all at cache_seqlens[b] otherwise.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import kvquant
from .validate import NO_QUANT, KvcacheProblem, KvQuant, is_fp4


@dataclass
class Packed:
    """The attention of a kvcache call as a packed call with seqused_k."""
    q: torch.Tensor        # [B * Sq, Hq, D]
    k: torch.Tensor        # packed view [total_k, Hk, D] of a contiguous cache, or the paged pool
    v: torch.Tensor
    cu_q: torch.Tensor     # int32 [B + 1]: arange * Sq
    cu_k: torch.Tensor     # int32 [B + 1]: contiguous, each sequence's first key row (the last entry is not read)
    seqused_k: torch.Tensor  # int32 [B]: each sequence's keys
    max_seqlen_k: int      # the capacity: bounds every seqused_k value


def rows_view(cache: torch.Tensor, p: KvcacheProblem) -> torch.Tensor:
    """A contiguous cache [B_cache, S_max, Hk, D] as packed rows [total_k, Hk, D]: cache batch c's row j is row
    c * rows_per_batch + j (validate checked that the batch stride is rows_per_batch rows)."""
    total = (p.cache_batch - 1) * p.rows_per_batch + cache.shape[1]
    return cache.as_strided((total, cache.shape[2], cache.shape[3]), (cache.stride(1), cache.stride(2), 1))


def _clamp(t: torch.Tensor, lo, hi) -> torch.Tensor:
    return torch.clamp(t, min=lo, max=hi)


def positions(p: KvcacheProblem, cache_seqlens, device) -> torch.Tensor:
    """Where each sequence's new rows start (int64 [B]), clamped so that the append stays inside the cache:
    0 <= start <= capacity - S_new. cache_seqlens None: the whole cache is the sequence's."""
    if cache_seqlens is None:
        return torch.full((p.batch,), p.capacity - p.new, dtype=torch.int64, device=device)
    return _clamp(cache_seqlens.to(torch.int64), 0, p.capacity - p.new)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [..., D] with its first rotary_dim columns rotated by cos / sin [..., rotary_dim / 2] (broadcast), in fp32,
    rounded back to x's dtype (to nearest even); the other columns unchanged. Interleaved: pairs (2i, 2i + 1);
    otherwise (i, i + rotary_dim / 2), GPT-NeoX's."""
    half = cos.shape[-1]
    xf = x[..., :2 * half].float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
    else:
        a, b = xf[..., :half], xf[..., half:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    rot = torch.stack((ra, rb), dim=-1).flatten(-2) if interleaved else torch.cat((ra, rb), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _table(rotary, pos: torch.Tensor):
    """cos and sin (fp32) at positions pos (int64, any shape), each clamped to the table's rows; a trailing head
    axis of size 1 added."""
    cos, sin = rotary
    idx = _clamp(pos, 0, cos.shape[0] - 1)
    return cos.float()[idx].unsqueeze(-2), sin.float()[idx].unsqueeze(-2)


def store(cache, x, where, p: KvcacheProblem, descale, scale) -> None:
    """x [B, S_new, Hk, D] into the cache rows `where` (indices of its first two dims; FP4: of its block and row
    dims), in the cache's format: as it is; FP8 through kvquant.quantize_fp8 with the call's descale; FP4 through
    kvquant.quantize_fp4, its E8M0 bytes into scale [num_blocks, page_size, Hk]. quantize_kv's code: the same bytes."""
    if p.kv_dtype == "same":
        cache.index_put_(where, x)
    elif is_fp4(p.kv_dtype):
        packed, s = kvquant.quantize_fp4(x)
        cache.permute(0, 2, 1, 3).index_put_(where, packed)  # the HND pool's [block, row, head] view
        scale.index_put_(where, s)
    else:  # index_put_ on the bytes: torch's float8 dtypes have no index_put_ kernel on every device
        xq = kvquant.quantize_fp8(x, kvquant.descale_rows(descale, p.batch, x.device), cache.dtype)
        cache.view(torch.uint8).index_put_(where, xq.view(torch.uint8))


def append(k_cache, v_cache, k, v, start, p: KvcacheProblem, cache_batch_idx, block_table, rotary,
           interleaved: bool, quant: KvQuant = NO_QUANT) -> None:
    """Writes k (rotated when rotary is given) and v into the caches in place, sequence b's row i at row
    start[b] + i of its cache batch (contiguous) or of its block-table row (paged); a quantized cache gets them
    quantized (store)."""
    rows = start[:, None] + torch.arange(p.new, device=start.device)  # [B, S_new], each < capacity
    if rotary is not None:
        k = rotate(k, *_table(rotary, rows), interleaved)
    if p.paged:
        ids = block_table.gather(1, torch.div(rows, p.page_size, rounding_mode="floor")).to(torch.int64)
        where = (_clamp(ids, 0, p.cache_batch - 1), rows % p.page_size)
    else:
        if cache_batch_idx is None:
            batch = torch.arange(p.batch, device=start.device)
        else:
            batch = _clamp(cache_batch_idx.to(torch.int64), 0, p.cache_batch - 1)
        where = (batch[:, None].expand(-1, p.new), rows)
    store(k_cache, k, where, p, quant.k_descale, quant.k_scale)
    store(v_cache, v, where, p, quant.v_descale, quant.v_scale)


def rotate_q(q: torch.Tensor, start, p: KvcacheProblem, rotary, interleaved: bool, per_row: bool) -> torch.Tensor:
    pos = start[:, None] + (torch.arange(p.seq_q, device=start.device) if per_row else 0)
    return rotate(q, *_table(rotary, pos.expand(-1, p.seq_q)), interleaved)


@functools.lru_cache(maxsize=64)
def _steps(n: int, step: int, device: torch.device) -> torch.Tensor:
    """int32 [n + 1]: 0, step, 2 step, ...; one tensor per (n, step, device), made once and only read (cu_seqlens_q
    of every call of that shape, and with step 0 a paged call's cu_seqlens_k): a decode step queues no kernel for
    them."""
    return torch.arange(n + 1, dtype=torch.int32, device=device) * step


def plan(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, p: KvcacheProblem) -> Packed:
    """The packed call (q not rotated yet), from the metadata alone: nothing is written. Sequence b's keys start at
    its cache_leftpad[b] (clamped to [0, end]) and end at end = start + S_new. Without leftpad every sequence's keys
    start at row 0: seqused_k is end itself (one clamp, plus an add with new rows: a decode step's whole metadata)."""
    device = q.device
    if cache_leftpad is None:  # a decode step's usual call: one clamp in int32, and an add only with new rows
        first = None
        if cache_seqlens is None:
            used = torch.full((p.batch,), p.capacity, dtype=torch.int32, device=device)
        else:
            used = _clamp(cache_seqlens.to(torch.int32), 0, p.capacity - p.new)
            used = used + p.new if p.new else used
    else:
        end = positions(p, cache_seqlens, device) + p.new
        first = torch.minimum(cache_leftpad.to(torch.int64).clamp(min=0), end)
        used = (end - first).to(torch.int32)
    cu_q = _steps(p.batch, p.seq_q, device)
    if p.paged:
        cu_k = _steps(p.batch, 0, device)
        kv = (k_cache, v_cache)
    else:
        if cache_batch_idx is None and first is None:
            cu_k = _steps(p.batch, p.rows_per_batch, device)  # cache batch b's row 0 (the last entry is not read)
        else:
            batch = (torch.arange(p.batch, device=device) if cache_batch_idx is None
                     else _clamp(cache_batch_idx.to(torch.int64), 0, p.cache_batch - 1))
            starts = batch * p.rows_per_batch + (0 if first is None else first)
            cu_k = torch.cat((starts, starts.new_zeros(1))).to(torch.int32)
        kv = (rows_view(k_cache, p), rows_view(v_cache, p))
    return Packed(q.reshape(p.batch * p.seq_q, p.heads, p.head_dim), *kv, cu_q, cu_k, used, p.capacity)


def apply(packed: Packed, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
          block_table, p: KvcacheProblem, interleaved: bool, per_row: bool, quant: KvQuant = NO_QUANT) -> Packed:
    """Appends k / v (when given, k rotated; quantized into a quantized cache) and rotates q (when rotary is given):
    the packed call to launch. per_row: q's rows at their own positions (a causal or local call)."""
    rotary = None if rotary_cos is None else (rotary_cos, rotary_sin)
    if not p.new and rotary is None:
        return packed  # nothing to append or rotate: no kernel
    start = positions(p, cache_seqlens, q.device)
    if p.new:
        append(k_cache, v_cache, k, v, start, p, cache_batch_idx, block_table, rotary, interleaved, quant)
    if rotary is None:
        return packed
    q = rotate_q(q, start, p, rotary, interleaved, per_row)
    packed.q = q.reshape(p.batch * p.seq_q, p.heads, p.head_dim)
    return packed


def check_device_values(cache_seqlens, cache_batch_idx, cache_leftpad, block_table, p: KvcacheProblem) -> None:
    """RTCATTN_CHECK=1: reads the metadata back (a host sync) and refuses what the call would clamp, naming it."""
    n = p.batch
    seqlens = [p.capacity - p.new] * n if cache_seqlens is None else cache_seqlens.to("cpu").tolist()
    for b, s in enumerate(seqlens):
        if not 0 <= s <= p.capacity - p.new:
            what = f"with k.shape[1]={p.new} new rows " if p.new else ""
            raise ValueError(f"cache_seqlens[{b}]={s} {what}is not supported; accepted: 0..{p.capacity - p.new} (the "
                             f"cache holds {p.capacity} keys per sequence) (RTCATTN_CHECK=1)")
    if cache_batch_idx is not None:
        for b, c in enumerate(cache_batch_idx.to("cpu").tolist()):
            if not 0 <= c < p.cache_batch:
                raise ValueError(f"cache_batch_idx[{b}]={c} is not supported; accepted: 0..{p.cache_batch - 1} "
                                 "(k_cache.shape[0]) (RTCATTN_CHECK=1)")
    if cache_leftpad is not None:
        for b, lp in enumerate(cache_leftpad.to("cpu").tolist()):
            if not 0 <= lp <= seqlens[b]:
                raise ValueError(f"cache_leftpad[{b}]={lp} is not supported; accepted: 0..cache_seqlens[{b}]="
                                 f"{seqlens[b]} (RTCATTN_CHECK=1)")
    if p.paged:
        table = block_table.to("cpu")
        for b in range(n):
            pages = -(-(seqlens[b] + p.new) // p.page_size)
            bad = ((table[b, :pages] < 0) | (table[b, :pages] >= p.cache_batch)).nonzero()
            if bad.numel():
                j = int(bad[0, 0])
                raise ValueError(f"block_table[{b}, {j}]={int(table[b, j])} is not supported; accepted: a block id "
                                 f"in [0, {p.cache_batch}) (k_cache.shape[0]) (RTCATTN_CHECK=1)")
