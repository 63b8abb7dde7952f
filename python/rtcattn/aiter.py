"""Registers rtcattn as an AITER op: torch.ops.aiter.rtcattn_fwd and aiter.rtcattn_fwd."""
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
    out, lse = torch.ops.aiter.rtcattn_fwd(q, k, v, dropout_p, softmax_scale, causal, list(window_size), bias,
                                           alibi_slopes, deterministic, return_lse, return_attn_probs,
                                           how_v3_bf16_cvt, cu_seqlens_q, cu_seqlens_kv)
    return (out, lse) if return_lse else out


def _import_aiter():
    try:
        return importlib.import_module("aiter")
    except Exception as e:  # aiter raises RuntimeError, not ImportError, on machines without ROCm
        raise ImportError(f"rtcattn.aiter.register() needs AITER (the 'aiter' module, pip package "
                          f"amd-aiter), which cannot be imported: {type(e).__name__}: {e}") from e


def register():
    """Defines aiter::rtcattn_fwd in the "aiter" torch library fragment and sets aiter.rtcattn_fwd (idempotent)."""
    global _fragment
    module = _import_aiter()
    with _lock:
        if not hasattr(torch.ops.aiter, OP_NAME):
            frag = torch.library.Library("aiter", "FRAGMENT")
            frag.define(SCHEMA)
            # Composite: under tracing it decomposes to torch.ops.rtcattn.fwd, whose fake impl gives shapes.
            frag.impl(OP_NAME, _aiter_op_impl, "CompositeImplicitAutograd")
            _fragment = frag
        module.rtcattn_fwd = rtcattn_fwd
    return module.rtcattn_fwd
