"""Registers rtcattn as AITER ops: torch.ops.aiter.rtcattn_fwd / rtcattn_varlen_fwd and aiter.rtcattn_fwd /
aiter.rtcattn_varlen_fwd (flash_attn_func's and flash_attn_varlen_func's signatures)."""
from __future__ import annotations

import importlib
import threading

import torch

from . import api, ops  # noqa: F401  (ops registers torch.ops.rtcattn.*, which the aiter op decomposes to)

OP_NAME = "rtcattn_fwd"
# flash_attn_func's parameters in AITER's order (amd-aiter 0.1.7).
SCHEMA = (f"{OP_NAME}(Tensor q, Tensor k, Tensor v, float dropout_p=0.0, float? softmax_scale=None, "
          "bool causal=False, int[2] window_size=[-1, -1], Tensor? bias=None, Tensor? alibi_slopes=None, "
          "bool deterministic=True, bool return_lse=False, bool return_attn_probs=False, int how_v3_bf16_cvt=1, "
          "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_kv=None) -> (Tensor, Tensor)")

VARLEN_OP_NAME = "rtcattn_varlen_fwd"
# flash_attn_varlen_func's parameters in AITER's order (amd-aiter 0.1.7).
VARLEN_SCHEMA = (f"{VARLEN_OP_NAME}(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                 "int max_seqlen_q, int max_seqlen_k, int min_seqlen_q=0, float dropout_p=0.0, "
                 "float? softmax_scale=None, float logits_soft_cap=0.0, bool causal=False, "
                 "int[2] window_size=[-1, -1], Tensor? bias=None, Tensor? alibi_slopes=None, "
                 "bool deterministic=False, bool return_lse=False, bool return_attn_probs=False, "
                 "int how_v3_bf16_cvt=1, Tensor? block_table=None, Tensor? out=None, "
                 "Tensor? cu_seqlens_q_padded=None, Tensor? cu_seqlens_k_padded=None) -> (Tensor, Tensor)")

_lock = threading.Lock()
_fragment = None  # kept alive: a torch Library object unregisters its ops when collected


def _aiter_op_impl(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), bias=None,
                   alibi_slopes=None, deterministic=True, return_lse=False, return_attn_probs=False,
                   how_v3_bf16_cvt=1, cu_seqlens_q=None, cu_seqlens_kv=None):
    # Always (out, lse) so the schema has one return type; lse is empty [0] unless return_lse.
    res = api.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, tuple(window_size), bias, alibi_slopes,
                              deterministic, return_lse, return_attn_probs, how_v3_bf16_cvt, cu_seqlens_q,
                              cu_seqlens_kv)
    if return_lse:
        return res
    return res, res.new_empty((0,), dtype=torch.float32)


def rtcattn_fwd(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), bias=None,
                alibi_slopes=None, deterministic=True, return_lse=False, return_attn_probs=False,
                how_v3_bf16_cvt=1, cu_seqlens_q=None, cu_seqlens_kv=None):
    """aiter.rtcattn_fwd: flash_attn_func's signature and return convention (out, or (out, lse))."""
    api.check_scalars(dropout_p, softmax_scale, causal, window_size, how_v3_bf16_cvt)
    out, lse = torch.ops.aiter.rtcattn_fwd(q, k, v, dropout_p, softmax_scale, causal, list(window_size), bias,
                                           alibi_slopes, deterministic, return_lse, return_attn_probs,
                                           how_v3_bf16_cvt, cu_seqlens_q, cu_seqlens_kv)
    return (out, lse) if return_lse else out


def _aiter_varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q=0,
                       dropout_p=0.0, softmax_scale=None, logits_soft_cap=0.0, causal=False, window_size=(-1, -1),
                       bias=None, alibi_slopes=None, deterministic=False, return_lse=False, return_attn_probs=False,
                       how_v3_bf16_cvt=1, block_table=None, out=None, cu_seqlens_q_padded=None,
                       cu_seqlens_k_padded=None):
    # Always (out, lse), as _aiter_op_impl. With out= given the schema still returns a new tensor
    # (an alias would need an alias annotation AITER's schema does not have): a copy of out.
    res = api.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q,
                                     dropout_p, softmax_scale, logits_soft_cap, causal, tuple(window_size), bias,
                                     alibi_slopes, deterministic, return_lse, return_attn_probs, how_v3_bf16_cvt,
                                     block_table, None, cu_seqlens_q_padded, cu_seqlens_k_padded)
    o, lse = res if return_lse else (res, res.new_empty((0,), dtype=torch.float32))
    if out is not None:
        out.copy_(o)
    return o, lse


def rtcattn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q=0,
                       dropout_p=0.0, softmax_scale=None, logits_soft_cap=0.0, causal=False, window_size=(-1, -1),
                       bias=None, alibi_slopes=None, deterministic=False, return_lse=False, return_attn_probs=False,
                       how_v3_bf16_cvt=1, block_table=None, out=None, cu_seqlens_q_padded=None,
                       cu_seqlens_k_padded=None):
    """aiter.rtcattn_varlen_fwd: flash_attn_varlen_func's signature and return convention (out, or (out, lse))."""
    api.check_scalars(dropout_p, softmax_scale, causal, window_size, how_v3_bf16_cvt, logits_soft_cap, max_seqlen_q,
                      max_seqlen_k, min_seqlen_q)
    o, lse = torch.ops.aiter.rtcattn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                min_seqlen_q, dropout_p, softmax_scale, logits_soft_cap, causal,
                                                list(window_size), bias, alibi_slopes, deterministic, return_lse,
                                                return_attn_probs, how_v3_bf16_cvt, block_table, out,
                                                cu_seqlens_q_padded, cu_seqlens_k_padded)
    if out is not None:
        o = out
    return (o, lse) if return_lse else o


def _import_aiter():
    try:
        return importlib.import_module("aiter")
    except Exception as e:  # aiter raises RuntimeError, not ImportError, on machines without ROCm
        raise ImportError(f"rtcattn.aiter.register() needs AITER (the 'aiter' module, pip package "
                          f"amd-aiter), which cannot be imported: {type(e).__name__}: {e}") from e


def register():
    """Defines aiter::rtcattn_fwd and aiter::rtcattn_varlen_fwd in the "aiter" torch library fragment and sets
    aiter.rtcattn_fwd / aiter.rtcattn_varlen_fwd (idempotent). Returns aiter.rtcattn_fwd."""
    global _fragment
    module = _import_aiter()
    with _lock:
        if not hasattr(torch.ops.aiter, OP_NAME):
            frag = torch.library.Library("aiter", "FRAGMENT")
            frag.define(SCHEMA)
            # Composite: under tracing it decomposes to torch.ops.rtcattn.fwd, whose fake impl gives shapes.
            frag.impl(OP_NAME, _aiter_op_impl, "CompositeImplicitAutograd")
            frag.define(VARLEN_SCHEMA)
            frag.impl(VARLEN_OP_NAME, _aiter_varlen_impl, "CompositeImplicitAutograd")
            _fragment = frag
        module.rtcattn_fwd = rtcattn_fwd
        module.rtcattn_varlen_fwd = rtcattn_varlen_fwd
    return module.rtcattn_fwd
