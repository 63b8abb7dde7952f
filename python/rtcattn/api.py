"""The user-facing calls: rtcattn.forward / forward_varlen (MoonMath's style) and AITER's flash_attn_func /
flash_attn_varlen_func."""
from __future__ import annotations

import torch

from . import ops  # noqa: F401  (registers torch.ops.rtcattn.*)
from .ops import checks
from .ops.attention_fwd import validate

HOW_V3_BF16_CVT = {0: "rtne", 1: "rtna", 2: "rtz"}   # AITER's encoding of the rounding mode (AITER's fact)


def _schema_types(q, k, v, layout, round_mode, softmax_scale, out) -> None:
    """Type guards for what the op's schema takes, so a wrong type gets our message, not the dispatcher's.
    The values are checked once, inside the op (and its fake while tracing)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        checks.check_type(name, t, optional=name == "out")
    if not isinstance(layout, str):  # each raises, listing the values
        checks.check_choice("layout", layout, validate.LAYOUTS)
    if not isinstance(round_mode, str):
        checks.check_choice("round_mode", round_mode, validate.axis_values("round_mode"))
    if softmax_scale is not None:
        checks.check_scale(softmax_scale, 1)


def _wants_lse(return_lse: bool, *tensors) -> bool:
    """Whether the op should return the LSE: asked for, or needed by a backward (an input requires grad: the
    backward recomputes P from it; without it the backward would run the forward again)."""
    return return_lse or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str = "bshd",
            round_mode: str = "rtne", softmax_scale: float | None = None,
            out: torch.Tensor | None = None, return_lse: bool = False, causal: bool = False,
            window_size: tuple[int, int] = (-1, -1), deterministic: bool = False, softcap: float = 0.0,
            alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0):
    """O = softmax(scale * Q K^T) V for bf16 or fp16 q, k, v (one dtype for all, and out's) in layout "bshd"
    ([B,S,H,D]) or "bhsd" ([B,H,S,D]); out has q's dtype.

    round_mode ("rtne", "rtna", "rtz") rounds every fp32 -> bf16 conversion (P and O) of a bf16 call. fp16 calls
    round P and O to nearest even whatever round_mode says (it is still checked): fp16 has one rounding, as in
    AITER / CK; an output past fp16's largest value (65504: from 65520 on) is +-Inf.
    k and v may have fewer heads than q (GQA/MQA: q heads a multiple of theirs).
    causal / window_size=(left, right) mask keys as FlashAttention >= 2.1 does, aligned bottom-right:
    row i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1: unbounded; causal: right = 0).
    Returns out, or (out, lse) with lse fp32 [B, H, Sq] (natural log) when return_lse.
    Differentiable (without out=): the backward (torch.ops.rtcattn.bwd) gives q, k and v their gradients, the LSE's
    own gradient included when the caller uses it (docs/numerics.md, the backward). deterministic (the backward's, as
    flash-attn's): True gives the same gradient bits every run; False (the default) lets a kernel add dQ up with
    atomics in any order (the sm90 kernel up to head dim 128), faster, its bits free to differ run to run.
    softcap > 0 caps each scaled score s at softcap * tanh(s / softcap) (Gemma 2, Grok; 0: off); alibi_slopes (fp32
    [H] or [B, H]) adds ALiBi's -slope * |j - (i + Sk - Sq)| to it, as FlashAttention does (docs/numerics.md, "Soft
    cap and ALiBi"); both apply to the gradients too. dropout_p in [0, 1) drops each element of P with that
    probability and scales the kept ones by 1 / (1 - p), the mask a function of a generator state drawn from
    torch's generator per call (docs/numerics.md, "Dropout"; torch.manual_seed repeats it); the backward regenerates
    it.
    """
    out, lse, _ = _dense_call(q, k, v, layout, round_mode, softmax_scale, out, return_lse, causal, window_size,
                              deterministic, softcap, alibi_slopes, dropout_p)
    return (out, lse) if return_lse else out


def _dense_call(q, k, v, layout, round_mode, softmax_scale, out, return_lse, causal, window_size, deterministic,
                softcap, alibi_slopes, dropout_p):
    """forward()'s call of the op: (out, lse, the dropout arguments it drew)."""
    _schema_types(q, k, v, layout, round_mode, softmax_scale, out)
    checks.check_bool("return_lse", return_lse)
    checks.check_bool("deterministic", deterministic)
    left, right = checks.check_window(window_size, causal)
    scale = None if softmax_scale is None else float(softmax_scale)
    score = _score_args(softcap, alibi_slopes)
    drop = _dropout_args(dropout_p, q)
    if out is None:
        out, lse = torch.ops.rtcattn.fwd(q, k, v, layout, round_mode, scale, _wants_lse(return_lse, q, k, v), left,
                                         right, deterministic, **score, **drop)
    else:
        lse = torch.ops.rtcattn.fwd_out(q, k, v, out, layout, round_mode, scale, return_lse, left, right, **score,
                                        **drop)
    return out, lse, drop


def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, round_mode: str = "rtne",
                   softmax_scale: float | None = None, out: torch.Tensor | None = None,
                   return_lse: bool = False, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                   block_table: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                   v_descale: torch.Tensor | None = None, kv_cache_dtype: str = "auto",
                   k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                   deterministic: bool = False, softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                   dropout_p: float = 0.0):
    """forward() over a batch of sequences packed along one token dimension (the serving layout).

    q [total_q, Hq, D] bf16 or fp16 (k, v and out of the same dtype); sequence b owns rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] (int32 [B + 1]).
    k, v [total_k, Hk, D] packed the same way by cu_seqlens_k, or, with block_table (int32 [B, pages]),
    a paged KV cache [num_pages, page_size, Hk, D] (page_size a power of two >= 16): key j of sequence b is
    row j % page_size of page block_table[b, j // page_size], and its KV length is
    cu_seqlens_k[b+1] - cu_seqlens_k[b]. max_seqlen_q bounds the q lengths (it sizes the grid: nothing is
    read back from the device); max_seqlen_k only sizes the launch, every key of a sequence counts (as in
    FlashAttention). Masks align bottom-right per sequence.
    Quantized KV caches (docs/numerics.md §10; the baseline kernel serves them): k, v torch.float8_e4m3fn (or
    torch.float8_e4m3fnuz) with FA3's k_descale / v_descale (fp32 [B, Hk] or one element; None: 1), or, paged only,
    kv_cache_dtype="fp4_e2m1": k, v uint8 [num_pages, Hk, page_size, D / 2] (element 2i in the low nibble) with
    k_scale / v_scale uint8 [num_pages, page_size, Hk] (E8M0, one per key row and head). kv_cache_dtype=
    "fp4_e2m1_native" (an opt-in: the numerics change) reads the same FP4 cache through gfx950's scaled MFMA with q
    quantized to FP8 E4M3 per (row, head) by a power-of-two scale: decode calls (at most 16 query rows a sequence)
    on gfx950 only; elsewhere the call is refused by name.
    Returns out [total_q, Hq, D], or (out, lse) with lse fp32 [Hq, total_q] when return_lse.
    Differentiable (without out=, a block table or a quantized cache) as forward() is (torch.ops.rtcattn.bwd_varlen),
    deterministic as forward()'s. softcap and alibi_slopes (fp32 [Hq] or [B, Hq], B sequences) as forward()'s, the
    ALiBi distance within each sequence. dropout_p as forward()'s (b of the mask: the sequence).
    """
    out, lse, _ = _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                               softmax_scale, out, return_lse, causal, window_size, block_table, k_descale, v_descale,
                               kv_cache_dtype, k_scale, v_scale, deterministic, softcap, alibi_slopes, dropout_p)
    return (out, lse) if return_lse else out


def _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode, softmax_scale, out,
                 return_lse, causal, window_size, block_table, k_descale, v_descale, kv_cache_dtype, k_scale, v_scale,
                 deterministic, softcap, alibi_slopes, dropout_p):
    """forward_varlen()'s call of the op: (out, lse, the dropout arguments it drew)."""
    _schema_types(q, k, v, "bshd", round_mode, softmax_scale, out)
    checks.check_bool("return_lse", return_lse)
    checks.check_bool("deterministic", deterministic)
    left, right = checks.check_window(window_size, causal)
    scale = None if softmax_scale is None else float(softmax_scale)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("block_table", block_table)):
        checks.check_type(name, t, optional=name == "block_table")
    quant = _quant_args(k_descale, v_descale, kv_cache_dtype, k_scale, v_scale)
    lens = (validate.check_max("max_seqlen_q", max_seqlen_q), validate.check_max("max_seqlen_k", max_seqlen_k))
    score = _score_args(softcap, alibi_slopes)
    drop = _dropout_args(dropout_p, q)
    if out is None:
        out, lse = torch.ops.rtcattn.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *lens, round_mode, scale,
                                                _wants_lse(return_lse, q, k, v), left, right, block_table, None,
                                                **quant, deterministic=deterministic, **score, **drop)
    else:
        lse = torch.ops.rtcattn.fwd_varlen_out(q, k, v, out, cu_seqlens_q, cu_seqlens_k, *lens, round_mode, scale,
                                               return_lse, left, right, block_table, None, **quant, **score, **drop)
    return out, lse, drop


def _quant_args(k_descale, v_descale, kv_cache_dtype, k_scale, v_scale) -> dict:
    """A quantized cache's keyword arguments as the ops take them, type-checked (their values are the op's)."""
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale), ("k_scale", k_scale), ("v_scale", v_scale)):
        checks.check_type(name, t, optional=True)
    if not isinstance(kv_cache_dtype, str):
        checks.check_choice("kv_cache_dtype", kv_cache_dtype, validate.KV_CACHE_DTYPE_ARGS)
    return dict(k_descale=k_descale, v_descale=v_descale, k_scale=k_scale, v_scale=v_scale,
                kv_cache_dtype=kv_cache_dtype)


def _score_args(softcap, alibi_slopes) -> dict:
    """The soft cap and ALiBi slopes as the ops take them, type-checked (their values are the op's)."""
    checks.check_type("alibi_slopes", alibi_slopes, optional=True)
    return dict(softcap=validate.check_softcap(softcap), alibi_slopes=alibi_slopes)


def _dropout_args(dropout_p, q) -> dict:
    """dropout_p checked, and the generator state the call's mask is drawn from (dropout.draw_rng_state)."""
    from .ops.attention_fwd import dropout
    p = validate.check_dropout_p(dropout_p)
    return dict(dropout_p=p, rng_state=dropout.draw_rng_state(p, q.device)) if p else {}


def _with_probs(result, return_lse: bool, return_attn_probs: bool, probs):
    """AITER's return: out, then the LSE when asked, then S_dmask when asked."""
    out, lse = result if isinstance(result, tuple) else (result, None)
    parts = [out] + ([lse] if return_lse else []) + ([probs(lse)] if return_attn_probs else [])
    return parts[0] if len(parts) == 1 else tuple(parts)


def _one_softcap(logits_soft_cap, softcap) -> float:
    """AITER's logits_soft_cap and flash-attn's softcap name one value: either may be given, or both alike."""
    cap, other = validate.check_softcap(logits_soft_cap, "logits_soft_cap"), validate.check_softcap(softcap)
    if cap and other and cap != other:
        raise ValueError(f"logits_soft_cap={logits_soft_cap!r} and softcap={softcap!r} differ; accepted: one of them "
                         "(AITER's and flash-attn's names of the same cap), or both equal")
    return cap or other


def _unsupported(name: str, value, accepted: str) -> None:
    raise NotImplementedError(f"{name}={value!r} is not supported; accepted: {accepted}")


def check_scalars(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), how_v3_bf16_cvt=1,
                  logits_soft_cap=0.0, max_seqlen_q=None, max_seqlen_k=None, min_seqlen_q=0) -> str:
    """AITER's scalar arguments (those its ops' schemas type as int or float), checked before any op sees
    them: torch's dispatcher refuses an int past 64 bits without naming the accepted range. Returns the
    round mode; max_seqlen_* None: a dense call."""
    validate.check_dropout_p(dropout_p)
    validate.check_softcap(logits_soft_cap, "logits_soft_cap")
    if softmax_scale is not None:
        checks.check_scale(softmax_scale, 1)
    checks.check_window(window_size, causal)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None:
            validate.check_max(name, value)
    checks.check_int("min_seqlen_q", min_seqlen_q, 0, checks.MAX_SIZE, " (a hint, ignored)")
    if type(how_v3_bf16_cvt) is not int or how_v3_bf16_cvt not in HOW_V3_BF16_CVT:
        raise ValueError(f"how_v3_bf16_cvt={how_v3_bf16_cvt!r} is not supported; accepted: "
                         "0 (RTNE), 1 (RTNA), 2 (RTZ)")
    return HOW_V3_BF16_CVT[how_v3_bf16_cvt]


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), bias: torch.Tensor | None = None,
                    alibi_slopes: torch.Tensor | None = None, deterministic: bool = True, return_lse: bool = False,
                    return_attn_probs: bool = False, how_v3_bf16_cvt: int = 1,
                    cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_kv: torch.Tensor | None = None, *,
                    softcap: float = 0.0):
    """AITER's flash_attn_func (amd-aiter 0.1.7's signature and order) on BSHD tensors, and flash-attn's softcap
    (keyword only, after AITER's parameters).

    q, k, v: bf16 or fp16, one dtype. how_v3_bf16_cvt: 0 = RTNE, 1 = RTNA (AITER's default), 2 = RTZ, for bf16
    conversions only (as its name says): fp16 rounds to nearest even. Returns out, or (out, softmax_lse) when
    return_lse, and S_dmask last when return_attn_probs (AITER's order: the probabilities [B, H, Sq, Sk] fp32, each
    negated where dropout dropped it; formed in torch for tests, reference.s_dmask). Differentiable as forward() is;
    `deterministic` is the backward's (forward()'s; True by default here, as AITER's): the forward gives the same bits
    run to run either way. dropout_p, alibi_slopes (fp32 [H] or [B, H]) and softcap as forward()'s.
    """
    mode = check_scalars(dropout_p, softmax_scale, causal, window_size, how_v3_bf16_cvt)
    if bias is not None:
        _unsupported("bias", type(bias).__name__, "None")
    checks.check_bool("return_attn_probs", return_attn_probs)
    for name, value in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv)):
        if value is not None:
            _unsupported(name, type(value).__name__, "None (packed sequences go to flash_attn_varlen_func)")
    checks.check_bool("deterministic", deterministic)
    res = _dense_call(q, k, v, "bshd", mode, softmax_scale, None, return_lse or return_attn_probs, causal,
                      window_size, deterministic, softcap, alibi_slopes, dropout_p)

    def probs(lse):
        from .ops.attention_fwd import reference
        p = res[2].get("dropout_p", 0.0)
        return reference.s_dmask(q, k, lse, "bshd", validate.checks.check_scale(softmax_scale, q.shape[-1]),
                               checks.check_window(window_size, causal), softcap, alibi_slopes, p,
                               res[2].get("rng_state"))
    return _with_probs(res[:2], return_lse, return_attn_probs, probs)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, min_seqlen_q: int = 0,
                           dropout_p: float = 0.0, softmax_scale: float | None = None,
                           logits_soft_cap: float = 0.0, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                           bias: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                           deterministic: bool = False, return_lse: bool = False, return_attn_probs: bool = False,
                           how_v3_bf16_cvt: int = 1, block_table: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, cu_seqlens_q_padded: torch.Tensor | None = None,
                           cu_seqlens_k_padded: torch.Tensor | None = None, *, k_descale: torch.Tensor | None = None,
                           v_descale: torch.Tensor | None = None, kv_cache_dtype: str = "auto",
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                           softcap: float = 0.0):
    """AITER's flash_attn_varlen_func (amd-aiter 0.1.7's signature and order): packed q [total_q, Hq, D],
    k / v [total_k, Hk, D] or, with block_table, pages [num_pages, page_size, Hk, D]; bf16 or fp16, one dtype.
    how_v3_bf16_cvt applies to bf16 conversions only: fp16 rounds to nearest even.

    Quantized KV caches (keyword only, after AITER's parameters): k_descale / v_descale (FP8 caches), kv_cache_dtype /
    k_scale / v_scale (FP4, paged), as forward_varlen takes them; softcap (flash-attn's name of AITER's
    logits_soft_cap: either, or both equal). alibi_slopes (fp32 [Hq] or [B, Hq]) as forward_varlen's.
    Returns out, or (out, softmax_lse [Hq, total_q]) when return_lse, and S_dmask [B, Hq, max_seqlen_q, max_seqlen_k]
    last when return_attn_probs (k / v packed; as flash_attn_func's). min_seqlen_q is a hint AITER's
    kernels may use; it does not change the result, so it is accepted and ignored.
    Differentiable as forward_varlen() is; `deterministic` is the backward's (forward()'s; False by default here, as
    AITER's): the forward gives the same bits run to run either way.
    """
    mode = check_scalars(dropout_p, softmax_scale, causal, window_size, how_v3_bf16_cvt, logits_soft_cap, max_seqlen_q,
                         max_seqlen_k, min_seqlen_q)
    cap = _one_softcap(logits_soft_cap, softcap)
    for name, value in (("bias", bias), ("cu_seqlens_q_padded", cu_seqlens_q_padded),
                        ("cu_seqlens_k_padded", cu_seqlens_k_padded)):
        if value is not None:
            _unsupported(name, type(value).__name__, "None")
    checks.check_bool("return_attn_probs", return_attn_probs)
    if return_attn_probs and (block_table is not None or kv_cache_dtype != "auto" or k.dtype != q.dtype):
        raise ValueError("return_attn_probs=True with a paged or quantized cache is not supported; accepted: "
                         "return_attn_probs=True with k / v packed in q's dtype (S_dmask is for tests)")
    checks.check_bool("deterministic", deterministic)
    res = _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mode, softmax_scale, out,
                       return_lse or return_attn_probs, causal, window_size, block_table, k_descale, v_descale,
                       kv_cache_dtype, k_scale, v_scale, deterministic, cap, alibi_slopes, dropout_p)

    def probs(lse):
        from .ops.attention_fwd import reference
        return reference.s_dmask_varlen(q, k, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      validate.checks.check_scale(softmax_scale, q.shape[-1]),
                                      checks.check_window(window_size, causal), cap, alibi_slopes,
                                      res[2].get("dropout_p", 0.0), res[2].get("rng_state"))
    return _with_probs(res[:2], return_lse, return_attn_probs, probs)


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                            rotary_cos: torch.Tensor | None = None, rotary_sin: torch.Tensor | None = None,
                            cache_seqlens: int | torch.Tensor | None = None,
                            cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                            block_table: torch.Tensor | None = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: torch.Tensor | None = None,
                            num_splits: int = 0, return_softmax_lse: bool = False, *, how_v3_bf16_cvt: int = 1,
                            out: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                            v_descale: torch.Tensor | None = None, kv_cache_dtype: str = "auto",
                            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None):
    """flash-attn 2.x's flash_attn_with_kvcache (its signature and order), plus AITER's how_v3_bf16_cvt and out=.

    q [B, Sq, Hq, D]; k_cache / v_cache [B_cache, S_max, Hk, D], or with block_table (int32 [B, blocks]) a paged
    cache [num_blocks, page_size, Hk, D]. k / v [B, S_new, Hk, D], when given, are written into the caches in place
    at rows cache_seqlens[b] .. + S_new - 1 before attention (k rotated when rotary_cos / rotary_sin
    [seqlen_ro, rotary_dim / 2] are given; q too, at the same positions when causal or local, all at cache_seqlens[b]
    otherwise). Sequence b attends to its cache rows cache_leftpad[b] .. cache_seqlens[b] + S_new - 1 of cache
    batch cache_batch_idx[b] (contiguous caches), masks aligned bottom-right. num_splits, as flash-attn defines it:
    0 (heuristic), 1 (no split) or n (at most n parts of each sequence's KV range). The gfx942 decode kernel (at most
    16 query rows per sequence) takes its planner's split, none, or its planner's pick of at most n parts; the other
    kernels run these packed calls unsplit whatever num_splits says. Every value meets the same numerics, and a
    given num_splits gives the same bits run to run. Returns out, or (out, softmax_lse [B, Hq, Sq] fp32) when
    return_softmax_lse.
    Quantized caches (docs/numerics.md §10; the baseline kernel serves them): torch.float8_e4m3fn (or
    torch.float8_e4m3fnuz) caches with FA3's k_descale / v_descale (fp32 [B, Hk] or one element; None: 1), k / v
    appended as x / descale rounded to nearest even (saturated); or kv_cache_dtype="fp4_e2m1" with a paged cache uint8
    [num_blocks, Hk, page_size, D / 2] and k_scale / v_scale uint8 [num_blocks, page_size, Hk] (E8M0), k / v appended
    with each row's scale from its amax (rtcattn.quantize_kv's bytes, scales written in place); "fp4_e2m1_native":
    the same cache and append, attended by gfx950's native path (as forward_varlen says).
    softcap and alibi_slopes (fp32 [Hq] or [B, Hq]) as forward()'s, the ALiBi distance within each sequence's keys.
    """
    mode = check_scalars(0.0, softmax_scale, causal, window_size, how_v3_bf16_cvt)
    score = _score_args(softcap, alibi_slopes)
    validate.check_num_splits(num_splits)
    for name, value in (("rotary_interleaved", rotary_interleaved), ("return_softmax_lse", return_softmax_lse)):
        checks.check_bool(name, value)
    tensors = (("q", q, False), ("k_cache", k_cache, False), ("v_cache", v_cache, False), ("k", k, True),
               ("v", v, True), ("rotary_cos", rotary_cos, True), ("rotary_sin", rotary_sin, True),
               ("cache_batch_idx", cache_batch_idx, True), ("cache_leftpad", cache_leftpad, True),
               ("block_table", block_table, True), ("out", out, True))
    for name, t, optional in tensors:
        checks.check_type(name, t, optional)
    cache_seqlens = _seqlens_tensor(cache_seqlens, q, k_cache, k, block_table, kv_cache_dtype)
    left, right = checks.check_window(window_size, causal)
    scale = None if softmax_scale is None else float(softmax_scale)
    quant = _quant_args(k_descale, v_descale, kv_cache_dtype, k_scale, v_scale)
    args = (k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, mode, scale,
            return_softmax_lse, left, right, rotary_interleaved, num_splits)
    if out is None:
        out, lse = torch.ops.rtcattn.fwd_kvcache(q, k_cache, v_cache, *args, **quant, **score)
    else:
        lse = torch.ops.rtcattn.fwd_kvcache_out(q, k_cache, v_cache, out, *args, **quant, **score)
    return (out, lse) if return_softmax_lse else out


def quantize_kv(k: torch.Tensor, v: torch.Tensor, kv_cache_dtype: str = "fp8_e4m3",
                k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None):
    """Quantizes a prompt's K and V (bf16 / fp16, [B, S, Hk, D] or packed rows [S, Hk, D], one shape for both) for a
    quantized KV cache, on their device with no host read (docs/numerics.md, "Quantized KV caches").

    kv_cache_dtype "fp8_e4m3": returns (k, v) as torch.float8_e4m3fn of the same shape, x / descale rounded to nearest
    even and saturated at +-448; k_descale / v_descale (FA3's convention: the cache value times descale is the value)
    are fp32 tensors of one element or [B, Hk] (4-D k), default 1. "fp8_e4m3fnuz": the same as
    torch.float8_e4m3fnuz (MI300X's), saturated at +-240.
    kv_cache_dtype "fp4_e2m1": returns (k, v, k_scale, v_scale): two E2M1 values a byte, element 2i in the low
    nibble (uint8 [..., D / 2]), and one E8M0 scale byte per (position, head) (uint8 [..., Hk]), 2^(floor(log2 amax)
    - 2) as OCP MX sets it; no descales."""
    from .ops.attention_fwd import kvquant
    for name, t in (("k", k), ("v", v)):
        checks.check_type(name, t)
        if t.dtype not in validate.DTYPES:
            raise ValueError(f"{name}.dtype={t.dtype} is not supported by quantize_kv; accepted: torch.bfloat16, "
                             "torch.float16")
        if t.dim() not in (3, 4):
            raise ValueError(f"{name}.shape={tuple(t.shape)} is not supported by quantize_kv; accepted: [B, S, Hk, D] "
                             "or packed rows [S, Hk, D]")
    if v.shape != k.shape or v.dtype != k.dtype or v.device != k.device:
        raise ValueError(f"v (shape {tuple(v.shape)}, {v.dtype}, {v.device}) is not supported by quantize_kv with k "
                         f"(shape {tuple(k.shape)}, {k.dtype}, {k.device}); accepted: the same shape, dtype and device")
    checks.check_choice("kv_cache_dtype", kv_cache_dtype, kvquant.KV_CACHE_DTYPES)
    if kv_cache_dtype == "fp4_e2m1":
        for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
            if t is not None:
                raise ValueError(f"{name} is not supported with kv_cache_dtype='fp4_e2m1' (its scales are computed per "
                                 "position and head); accepted: None")
        if k.shape[-1] % 2:
            raise ValueError(f"k.shape[-1]={k.shape[-1]} is not supported with kv_cache_dtype='fp4_e2m1'; accepted: "
                             "an even head dim (two values a byte)")
        (kq, ks), (vq, vs) = kvquant.quantize_fp4(k), kvquant.quantize_fp4(v)
        return kq, vq, ks, vs
    descales = []
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            descales.append(torch.ones((), dtype=torch.float32, device=k.device))
            continue
        checks.check_type(name, t)
        per_head = k.dim() == 4 and tuple(t.shape) == (k.shape[0], k.shape[2])
        if t.dtype != torch.float32 or t.device != k.device or not (t.numel() == 1 or per_head):
            raise ValueError(f"{name} (shape {tuple(t.shape)}, {t.dtype}, {t.device}) is not supported; accepted: "
                             f"float32 on {k.device}, one element or [B, Hk]" +
                             (f" = [{k.shape[0]}, {k.shape[2]}]" if k.dim() == 4 else " (with 4-D k)"))
        descales.append(kvquant.descale_rows(t, k.shape[0], k.device))
    dtype = kvquant.FP8_DTYPES[kv_cache_dtype]
    return kvquant.quantize_fp8(k, descales[0], dtype), kvquant.quantize_fp8(v, descales[1], dtype)


def _seqlens_tensor(cache_seqlens, q, k_cache, k, block_table, kv_cache_dtype="auto"):
    """cache_seqlens as the op takes it: None or a tensor as given; an int (every sequence's length, as flash-attn
    takes it) checked against the cache here, where it is known, and made an int32 [B] tensor on q's device."""
    if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or k_cache.dim() != 4:
        return cache_seqlens  # the op's checks name what is wrong with q or the cache
    page = k_cache.shape[2 if validate.is_fp4(kv_cache_dtype) else 1]  # an FP4 cache's pages are HND
    capacity = page * (block_table.shape[1] if isinstance(block_table, torch.Tensor)
                                   and block_table.dim() == 2 else 1)
    new = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else 0
    checks.check_int("cache_seqlens", cache_seqlens, 0, max(capacity - new, 0),
                     f" (an int: every sequence's cached keys; the cache holds {capacity} per sequence, "
                     f"k adds {new})")
    return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
