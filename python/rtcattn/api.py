"""The user-facing calls: rtcattn.forward (MoonMath's signature) and flash_attn_func (AITER's)."""
from __future__ import annotations

from typing import Optional

import torch

from . import ops  # noqa: F401  (registers torch.ops.rtcattn.*)
from . import validate


def _schema_types(q, k, v, layout, round_mode, softmax_scale, out) -> None:
    """Type guards for what the op's schema takes, so a wrong type gets our message, not the dispatcher's.
    The values are checked once, inside the op (and its fake while tracing)."""
    for name, t in (("q", q), ("k", k), ("v", v)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    for name, value in (("layout", layout), ("round_mode", round_mode)):
        if not isinstance(value, str):
            validate.check_choice(name, value, validate.axis_values(name))  # raises, listing the values
    if softmax_scale is not None:
        validate.check_scale(softmax_scale, 1)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str = "bshd",
            round_mode: str = "rtne", softmax_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, return_lse: bool = False):
    """O = softmax(scale * Q K^T) V for bf16 q, k, v in layout "bshd" ([B,S,H,D]) or "bhsd" ([B,H,S,D]).

    round_mode ("rtne", "rtna", "rtz") rounds every fp32 -> bf16 conversion (P and O).
    Returns out, or (out, lse) with lse fp32 [B, H, Sq] (natural log) when return_lse.
    """
    _schema_types(q, k, v, layout, round_mode, softmax_scale, out)
    validate.check_bool("return_lse", return_lse)
    scale = None if softmax_scale is None else float(softmax_scale)
    if out is None:
        out, lse = torch.ops.rtcattn.fwd(q, k, v, layout, round_mode, scale, return_lse)
    else:
        lse = torch.ops.rtcattn.fwd_out(q, k, v, out, layout, round_mode, scale, return_lse)
    return (out, lse) if return_lse else out


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    return_lse: bool = False, how_v3_bf16_cvt: int = 1):
    """AITER's flash_attn_func forward on BSHD tensors; how_v3_bf16_cvt: 0 = RTNE, 1 = RTNA, 2 = RTZ.

    Like AITER, returns out, or the tuple (out, softmax_lse) when return_lse.
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p!r} is not supported yet; accepted: 0.0")
    if causal:
        raise NotImplementedError(f"causal={causal!r} is not supported yet; accepted: False")
    mode = validate.check_how_v3_bf16_cvt(how_v3_bf16_cvt)
    return forward(q, k, v, layout="bshd", round_mode=mode, softmax_scale=softmax_scale,
                   return_lse=return_lse)
