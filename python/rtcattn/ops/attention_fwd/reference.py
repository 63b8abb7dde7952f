"""Host references of the numerics contract (docs/numerics.md): bf16 and fp16 rounding bit for bit, the fp64 output,
the "R" algorithm, error metrics."""
from __future__ import annotations

import math

import numpy as np
import torch

from .validate import LAYOUTS, axis_values  # the op's layouts; the manifest's round modes

BF16_NAN = 0x7FFF
FP16_NAN = 0x7E00  # the canonical quiet NaN of fp32 -> fp16 (csrc_common/fp16_round.h)
NAN_BITS = {torch.bfloat16: BF16_NAN, torch.float16: FP16_NAN}  # what every NaN the kernels write is, per dtype


def _check_mode(mode: str) -> None:
    if mode not in axis_values("round_mode"):
        raise ValueError(f"round_mode={mode!r} is not one of {list(axis_values('round_mode'))}")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {list(LAYOUTS)}")


def _round_int_bits(x, mode: str):
    """The integer formulas of numerics.md on non-negative 64-bit views of fp32 bits (numpy or torch)."""
    if mode == "rtne":
        return (x + 0x7FFF + ((x >> 16) & 1)) >> 16
    if mode == "rtna":
        return (x + 0x8000) >> 16
    return x >> 16


def f32_to_bf16_bits_np(x: np.ndarray, mode: str) -> np.ndarray:
    """fp32 array -> uint16 bf16 bit patterns; NaN is tested on the bits first, every NaN -> 0x7FFF."""
    _check_mode(mode)
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    out = _round_int_bits(bits, mode).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, np.uint16(BF16_NAN), out)


def bf16_bits_to_f32_np(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x: torch.Tensor, mode: str) -> torch.Tensor:
    """fp32 tensor -> bf16 tensor rounded with `mode` (same formulas, on int64 views, any device)."""
    _check_mode(mode)
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = _round_int_bits(bits, mode)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    out = torch.where(nan, torch.full_like(out, BF16_NAN), out)
    return ((out ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16)


def f32_to_fp16_bits_np(x: np.ndarray) -> np.ndarray:
    """fp32 array -> uint16 fp16 bit patterns: numpy's cast (round to nearest even; subnormals kept, +-Inf from
    65520 on), every NaN -> the canonical 0x7E00 (numpy keeps the payload)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        out = x.astype(np.float16).view(np.uint16)
    nan = (x.view(np.uint32) & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, np.uint16(FP16_NAN), out)


def round_to_fp16(x: torch.Tensor) -> torch.Tensor:
    """fp32 tensor -> fp16 tensor rounded to nearest even, bit for bit as fp16_round.h (the same integer formulas
    on int64 views, any device): subnormals rounded, never flushed; +-Inf from 65520 on; every NaN 0x7E00."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign, a = (bits >> 16) & 0x8000, bits & 0x7FFFFFFF
    r = a - 0x38000000                                           # normal: rebias 127 -> 15, drop 13 bits
    normal = (r + 0x0FFF + ((r >> 13) & 1)) >> 13
    s = (126 - (a >> 23)).clamp(14, 25)                          # subnormal: m / 2^s, 14 <= s <= 24 where used
    m = (a & 0x7FFFFF) | 0x800000
    q, rest, half = m >> s, m & ((1 << s) - 1), 1 << (s - 1)
    sub = q + ((rest > half) | ((rest == half) & ((q & 1) == 1))).to(torch.int64)
    out = torch.where(a >= 0x38800000, normal, torch.where(a < 0x33000000, torch.zeros_like(sub), sub))
    out = torch.where(a >= 0x47800000, torch.full_like(out, 0x7C00), out) | sign
    out = torch.where(a > 0x7F800000, torch.full_like(out, FP16_NAN), out)
    return ((out ^ 0x8000) - 0x8000).to(torch.int16).view(torch.float16)


def round_to(x: torch.Tensor, dtype: torch.dtype, mode: str) -> torch.Tensor:
    """fp32 tensor -> the kernels' element dtype as they round it: bf16 with `mode`, fp16 to nearest even (the mode,
    checked, does not apply: the stub sends fp16 calls to the rtne variant)."""
    _check_mode(mode)
    if dtype == torch.bfloat16:
        return round_to_bf16(x, mode)
    if dtype == torch.float16:
        return round_to_fp16(x)
    raise ValueError(f"dtype={dtype} is not one of {list(NAN_BITS)}")


def bf16_bits(t: torch.Tensor) -> torch.Tensor:
    """16-bit tensor (bf16 or fp16) -> int32 tensor of its 16-bit patterns (0..65535)."""
    return t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def to_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    _check_layout(layout)
    return t.transpose(1, 2) if layout == "bshd" else t


def from_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return to_bhsd(t, layout)


def default_scale(head_dim: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


def visible(sq: int, sk: int, window=(-1, -1), device=None) -> torch.Tensor:
    """[Sq, Sk] bool: which keys each query row sees, aligned bottom-right (row i sits at key i + Sk - Sq);
    window = (left, right), -1 unbounded, causal = (-1, 0)."""
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = window
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def score_mod(s: torch.Tensor, softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled scores [B, H, Sq, Sk] (any float dtype, computed in it) with FlashAttention's modifications
    (docs/numerics.md, "Soft cap and ALiBi"): softcap > 0 caps each at softcap * tanh(s / softcap), then ALiBi adds
    -slope * |j - (i + Sk - Sq)| with alibi_slopes fp32 [H] or [B, H] (row b of the batch; one row: every b)."""
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    if alibi_slopes is not None:
        sq, sk = s.shape[-2], s.shape[-1]
        i = torch.arange(sq, device=s.device)[:, None] + (sk - sq)
        dist = (torch.arange(sk, device=s.device)[None, :] - i).abs().to(s.dtype)
        slopes = alibi_slopes.to(device=s.device, dtype=s.dtype)
        slopes = slopes[None] if slopes.dim() == 1 else slopes
        s = s - slopes[:, :, None, None] * dist
    return s


def sequence_slopes(alibi_slopes: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """Sequence (or batch row) b's slopes [1, H] of alibi_slopes [H] or [B, H], for a reference run on it alone."""
    if alibi_slopes is None:
        return None
    return alibi_slopes[None] if alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]


def dropout_factor(dropout_p: float, rng_state, shape, first_b: int = 0, dtype=torch.float64, device=None):
    """The forward's dropout as a factor on P: keep / (1 - p) ([B, H, Sq, Sk] of `shape`, batch rows or sequences
    first_b.. of the kernels' mask, dropout.keep_mask), in dtype (float32: 1 / (1 - p) as the kernels round it);
    None without dropout."""
    if not dropout_p:
        return None
    from . import dropout
    b, h, sq, sk = shape
    keep = torch.stack([dropout.keep_mask(rng_state, dropout_p, first_b + i, h, sq, sk) for i in range(b)])
    scale = dropout.drop_scale(dropout_p) if dtype == torch.float32 else 1.0 / (1.0 - dropout_p)
    return (keep.to(dtype) * scale).to(device)


def _kv_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Hk, S, D] -> [B, H, S, D]: query head h reads K/V head h // (H / Hk) (GQA/MQA)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def reference_fp64(q, k, v, layout: str, softmax_scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                   alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0, rng_state=None, first_b: int = 0):
    """O64 (float64, in `layout`) and lse64 ([B, H, Sq] float64) with the special-value table applied,
    for K/V with as many heads as q or fewer (GQA/MQA), the key window of docs/numerics.md, the score
    modifications (score_mod) and dropout (dropout_factor: the kernels' mask of rng_state, batch rows from
    first_b)."""
    qd = to_bhsd(q, layout).to(torch.float64)
    kd, vd = (_kv_heads(to_bhsd(t, layout).to(torch.float64), qd.shape[1]) for t in (k, v))
    scale = default_scale(q.shape[-1], softmax_scale)
    keep = visible(qd.shape[2], kd.shape[2], window, qd.device)               # [Sq,Sk]
    s = score_mod(torch.matmul(qd, kd.transpose(-1, -2)) * scale, softcap, alibi_slopes).masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    row_sum = p.sum(dim=-1, keepdim=True)
    z = dropout_factor(dropout_p, rng_state, tuple(s.shape), first_b, device=s.device)
    pv = p if z is None else p * z
    o = torch.matmul(pv, torch.nan_to_num(vd, nan=0.0)) / row_sum  # V's NaN comes back through the table below
    lse = (m + torch.log(row_sum)).squeeze(-1)
    nan = float("nan")
    # The table, applied explicitly so it holds whatever the BLAS does with 0 * NaN; a NaN in K or V
    # reaches the rows that see its key (see numerics.md for what kernels may add to that under a mask).
    knan = torch.isnan(kd).any(-1).to(torch.float64)                          # [B,H,Sk]
    vnan = torch.isnan(vd).to(torch.float64)                                  # [B,H,Sk,D]
    seen = keep.to(torch.float64)
    row_nan = torch.isnan(qd).any(-1) | torch.isposinf(s).any(-1) | (torch.matmul(knan, seen.T) > 0)
    col_nan = torch.matmul(seen, vnan) > 0                                    # [B,H,Sq,D]
    o = o.masked_fill(row_nan[..., None], nan).masked_fill(col_nan, nan)
    lse = lse.masked_fill(row_nan, nan)
    # A row that sees no key is 0 with LSE -Inf. One that sees keys whose scores are all -Inf keeps the
    # NaN of its softmax (-Inf - -Inf): the kernels make it NaN too, so it never passes for an empty row.
    empty = ~keep.any(-1).expand(s.shape[:-1])                                # [B,H,Sq]
    o = o.masked_fill(empty[..., None], 0.0)
    lse = lse.masked_fill(empty, -math.inf)
    return from_bhsd(o, layout), lse


def reference_r(q, k, v, layout: str, round_mode: str, softmax_scale: float | None = None, window=(-1, -1),
                softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0, rng_state=None,
                first_b: int = 0):
    """The "R" reference: the kernels' algorithm in the same precision, plainly in torch; P and O rounded to q's
    dtype (bf16 with round_mode, fp16 to nearest even), O returned in it."""
    qf = to_bhsd(q, layout).to(torch.float32)
    kf, vf = (_kv_heads(to_bhsd(t, layout).to(torch.float32), qf.shape[1]) for t in (k, v))
    scale = default_scale(q.shape[-1], softmax_scale)
    keep = visible(qf.shape[2], kf.shape[2], window, qf.device)
    s = score_mod(torch.matmul(qf, kf.transpose(-1, -2)) * scale, softcap, alibi_slopes).masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m.masked_fill(m == -math.inf, 0.0))                     # a row that sees nothing: p = 0
    z = dropout_factor(dropout_p, rng_state, tuple(s.shape), first_b, torch.float32, s.device)
    pb = round_to(p if z is None else p * z, q.dtype, round_mode).to(torch.float32)
    row_sum = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(pb, vf) / row_sum.masked_fill(row_sum == 0, 1.0)        # ... and its output 0
    return from_bhsd(round_to(o, q.dtype, round_mode), layout)


def errors(x: torch.Tensor, o64: torch.Tensor) -> tuple[float, float]:
    """(max |x - O64|, ||x - O64|| / ||O64||) over the elements where O64 is finite."""
    ref = o64.to(torch.float64)
    fin = torch.isfinite(ref)
    d = (x.to(torch.float64) - ref)[fin]
    if d.numel() == 0:
        return 0.0, 0.0
    norm = torch.linalg.vector_norm(ref[fin]).item()
    return d.abs().max().item(), torch.linalg.vector_norm(d).item() / max(norm, 1e-300)


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns mapped to integers whose difference counts ULPs across zero."""
    return torch.where(bits >= 0x8000, 0x8000 - bits, bits)


def share_within_ulp(x: torch.Tensor, y: torch.Tensor, ulps: int = 1) -> float:
    """Share of elements of two bf16 (or two fp16) tensors at most `ulps` ULPs of their dtype apart (finite pairs
    only)."""
    fin = torch.isfinite(x.float()) & torch.isfinite(y.float())
    d = (_ordered(bf16_bits(x)) - _ordered(bf16_bits(y))).abs()[fin]
    return 1.0 if d.numel() == 0 else (d <= ulps).double().mean().item()


def lse_close(lse: torch.Tensor, lse64: torch.Tensor) -> torch.Tensor:
    """Elementwise |lse - lse64| <= 1e-4 max(1, |lse64|); NaN and -Inf must match exactly."""
    ref = lse64.to(torch.float64)
    got = lse.to(torch.float64)
    fin = torch.isfinite(ref)
    tol = 1e-4 * torch.clamp(ref.abs(), min=1.0)
    ok_fin = (got - ref).abs() <= tol
    ok_special = (torch.isnan(ref) & torch.isnan(got)) | (ref == got)
    return torch.where(fin, ok_fin & torch.isfinite(got), ok_special)


# ---- quantized KV caches (docs/numerics.md §10): the function is attention over the exactly dequantized values ----

def dequantize_cache(cache: torch.Tensor, kv_cache_dtype: str = "auto", scale: torch.Tensor | None = None):
    """A cache's exact values in fp64, rows as the other references take them ([..., rows, Hk, D]): an FP8 cache
    (float8_e4m3fn / fnuz) as its values (descales are per sequence: descaled()); an FP4 cache uint8
    [num_blocks, Hk, page, D / 2] with its E8M0 scales [num_blocks, page, Hk] as [num_blocks, page, Hk, D]."""
    from . import kvquant
    if kv_cache_dtype in ("fp4_e2m1", "fp4_e2m1_native"):
        return kvquant.dequantize_fp4(cache.permute(0, 2, 1, 3), scale).to(torch.float64)
    return cache.to(torch.float64)


def descaled(rows: torch.Tensor, descale: torch.Tensor | None, b: int) -> torch.Tensor:
    """Rows [..., Hk, D] of sequence b times its FP8 descale (fp32 [B, Hk] or one element), in fp64: exact."""
    if descale is None:
        return rows
    d = descale.to(torch.float64).cpu()
    d = d.reshape(()) if d.numel() == 1 else d[b][:, None]
    return rows.to(torch.float64) * d


def paged_rows(pages: torch.Tensor, block_table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """[length, Hk, D]: the first `length` key rows of sequence b of a paged cache [num_pages, page, Hk, D]."""
    page = pages.shape[1]
    j = torch.arange(length, device=pages.device)
    ids = block_table[b].to(pages.device).long()[j // page]
    return pages[ids, j % page]


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, round_mode: str | None = None,
                     softmax_scale: float | None = None, window=(-1, -1), block_table=None, k_descale=None,
                     v_descale=None, softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                     dropout_p: float = 0.0, rng_state=None):
    """Per sequence: the dense reference on [1, S, H, D] slices (masks aligned to each sequence's own
    lengths). Returns (O64 [total_q, H, D] float64, lse64 [H, total_q] float64), or with round_mode the
    "R" output [total_q, H, D] in q's dtype. k, v are packed [total_k, Hk, D] or, with block_table, pages; a
    quantized cache's exact values (dequantize_cache), sequence b's rows times its k_descale / v_descale row."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    total_q, heads = q.shape[0], q.shape[1]
    o = torch.zeros(q.shape, dtype=torch.float64 if round_mode is None else q.dtype, device=q.device)
    lse = torch.full((heads, total_q), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 <= q0:
            continue
        if block_table is None:
            kb, vb = k[k0:k1], v[k0:k1]
        else:
            kb, vb = (paged_rows(t, block_table, b, k1 - k0) for t in (k, v))
        kb, vb = descaled(kb, k_descale, b), descaled(vb, v_descale, b)
        if kb.shape[0] == 0:  # no key: every row of the sequence is 0, its LSE -Inf (already so)
            continue
        args = (q[None, q0:q1], kb[None], vb[None], "bshd")
        score = dict(softcap=softcap, alibi_slopes=sequence_slopes(alibi_slopes, b), dropout_p=dropout_p,
                     rng_state=rng_state, first_b=b)
        if round_mode is None:
            ob, lb = reference_fp64(*args, softmax_scale, window, **score)
            o[q0:q1], lse[:, q0:q1] = ob[0], lb[0]
        else:
            o[q0:q1] = reference_r(*args, round_mode, softmax_scale, window, **score)[0]
    return o if round_mode is not None else (o, lse)


def rotary_fp64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions, interleaved: bool) -> torch.Tensor:
    """x [S, H, D] with row i rotated by angle row positions[i] of cos / sin [seqlen_ro, rotary_dim / 2], in fp64,
    rounded once to x's dtype: interleaved pairs (2j, 2j + 1), else (j, j + rotary_dim / 2)."""
    half = cos.shape[1]
    idx = torch.tensor(positions, dtype=torch.int64)
    c, s = (t.to(torch.float64).cpu()[idx][:, None, :] for t in (cos, sin))
    out = x.to(torch.float64).cpu().clone()
    first = slice(0, 2 * half, 2) if interleaved else slice(0, half)
    second = slice(1, 2 * half, 2) if interleaved else slice(half, 2 * half)
    a, b = out[..., first].clone(), out[..., second].clone()
    out[..., first], out[..., second] = a * c - b * s, a * s + b * c
    return out.to(x.dtype)


def reference_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                      cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, window=(-1, -1),
                      rotary_interleaved=True, round_mode: str | None = None, k_descale=None, v_descale=None,
                      softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None):
    """flash-attn 2.x's flash_attn_with_kvcache on the host, sequence by sequence, from its documented semantics:
    new rows k / v written at cache rows cache_seqlens[b] + i (k rotated at those positions), q rotated at
    cache_seqlens[b] + i when the call is causal or local (a window side in [0, capacity)) else all at
    cache_seqlens[b], keys cache_leftpad[b] .. cache_seqlens[b] + S_new - 1. window: (left, right) with causal's
    right = 0 applied. Returns (k_cache, v_cache) as updated copies, and O64 [B, Sq, Hq, D] float64 with lse64
    [B, Hq, Sq], or with round_mode the "R" output in q's dtype. A quantized cache: its exact values
    (dequantize_cache, without k / v: the append's quantization is tested bit for bit on its own), sequence b's rows
    times its k_descale / v_descale row."""
    kc, vc = k_cache.cpu().clone(), v_cache.cpu().clone()
    batch, seq_q = q.shape[0], q.shape[1]
    paged = block_table is not None
    capacity = kc.shape[1] * (block_table.shape[1] if paged else 1)
    new = 0 if k is None else k.shape[1]
    seqlens = [capacity] * batch if cache_seqlens is None else cache_seqlens.cpu().tolist()
    bidx = list(range(batch)) if cache_batch_idx is None else cache_batch_idx.cpu().tolist()
    leftpad = [0] * batch if cache_leftpad is None else cache_leftpad.cpu().tolist()
    table = None if not paged else block_table.cpu()
    per_row = any(0 <= w < capacity for w in window)
    o = torch.zeros(q.shape, dtype=torch.float64 if round_mode is None else q.dtype)
    lse = torch.full((batch, q.shape[2], seq_q), -math.inf, dtype=torch.float64)

    def rows(cache, b, descale):  # sequence b's cache rows [capacity, Hk, D]
        return descaled(cache[table[b].long()].flatten(0, 1) if paged else cache[bidx[b]], descale, b)

    for b in range(batch):
        at = [seqlens[b] + i for i in range(new)]
        if new:
            kb = k[b].cpu()
            if rotary_cos is not None:
                kb = rotary_fp64(kb, rotary_cos, rotary_sin, at, rotary_interleaved)
            for i, r in enumerate(at):
                if paged:
                    page = kc.shape[1]
                    kc[table[b, r // page], r % page], vc[table[b, r // page], r % page] = kb[i], v[b, i].cpu()
                else:
                    kc[bidx[b], r], vc[bidx[b], r] = kb[i], v[b, i].cpu()
    for b in range(batch):
        qb = q[b].cpu()
        if rotary_cos is not None:
            pos = [seqlens[b] + i if per_row else seqlens[b] for i in range(seq_q)]
            qb = rotary_fp64(qb, rotary_cos, rotary_sin, pos, rotary_interleaved)
        keys = slice(leftpad[b], seqlens[b] + new)
        kb, vb = rows(kc, b, k_descale)[keys], rows(vc, b, v_descale)[keys]
        if kb.shape[0] == 0 or seq_q == 0:
            continue
        args = (qb[None], kb[None], vb[None], "bshd")
        score = dict(softcap=softcap, alibi_slopes=sequence_slopes(alibi_slopes, b))
        if round_mode is None:
            ob, lb = reference_fp64(*args, softmax_scale, window, **score)
            o[b], lse[b] = ob[0], lb[0]
        else:
            o[b] = reference_r(*args, round_mode, softmax_scale, window, **score)[0]
    return (kc, vc), (o if round_mode is not None else (o, lse))


# ---- S_dmask (return_attn_probs): the probabilities in torch, the sign from dropout's host mask ----

def s_dmask(q, k, lse, layout: str, scale: float, window, softcap: float, alibi_slopes, dropout_p: float,
            rng_state, first_b: int = 0) -> torch.Tensor:
    """S_dmask [B, H, Sq, Sk] fp32 of a dense call from its inputs and the LSE it returned: each P_ij =
    exp(s_ij - LSE_i) of the modified, masked scores (0 where the mask hides the key), negated where dropout drops
    the element (`return_attn_probs=True`; for tests: it is formed in torch, not by the kernels, and the kernels'
    mask is tested against keep_mask bit for bit)."""
    qf = to_bhsd(q, layout).float()
    kf = _kv_heads(to_bhsd(k, layout).float(), qf.shape[1])
    s = score_mod(qf @ kf.transpose(-1, -2) * scale, softcap, alibi_slopes)
    keep = visible(qf.shape[2], kf.shape[2], window, q.device)
    probs = torch.where(keep & (lse[..., None] != -math.inf), torch.exp(s - lse[..., None]), 0.0)
    if not dropout_p:
        return probs
    b, h, sq, sk = probs.shape
    from . import dropout
    mask = torch.stack([dropout.keep_mask(rng_state, dropout_p, first_b + i, h, sq, sk) for i in range(b)])
    return dropout.attn_probs(probs, mask)


def s_dmask_varlen(q, k, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, scale: float,
                   window, softcap: float, alibi_slopes, dropout_p: float, rng_state) -> torch.Tensor:
    """S_dmask [B, Hq, max_seqlen_q, max_seqlen_k] fp32 of a packed call (k packed, not paged), each sequence's
    rows and keys at the top left, zeros elsewhere."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = torch.zeros((len(cq) - 1, q.shape[1], max_seqlen_q, max_seqlen_k), dtype=torch.float32, device=q.device)
    for b in range(len(cq) - 1):
        lq, lk = min(cq[b + 1] - cq[b], max_seqlen_q), min(ck[b + 1] - ck[b], max_seqlen_k)
        if lq <= 0 or lk <= 0:
            continue
        one = s_dmask(q[None, cq[b]:cq[b] + lq], k[None, ck[b]:ck[b] + lk], lse[None, :, cq[b]:cq[b] + lq], "bshd",
                      scale, window, softcap, sequence_slopes(alibi_slopes, b), dropout_p, rng_state, b)
        out[b, :, :lq, :lk] = one[0]
    return out
