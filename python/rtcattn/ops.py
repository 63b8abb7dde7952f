"""The torch custom ops torch.ops.rtcattn.fwd / fwd_out, with fake implementations so torch.compile traces them."""
from __future__ import annotations

from typing import Tuple

import torch

from . import validate


def _lse_shape(q: torch.Tensor, layout: str, return_lse: bool):
    b, s, h, _ = validate._shape_of(q, layout)
    return (b, h, s) if return_lse else (0,)


def _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse) -> torch.Tensor:
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out)
    lse = torch.empty(_lse_shape(q, layout, return_lse), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return lse  # Sq = 0 (or B = 0 / H = 0): nothing to compute, nothing launched
    from . import dispatch  # loads the C++ runtime only when something really runs
    dispatch.run(q, k, v, out, lse if return_lse else None, layout, round_mode, problem)
    return lse


@torch.library.custom_op("rtcattn::fwd", mutates_args=())
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, round_mode: str,
        softmax_scale: float, return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse); lse is [B, H, Sq] fp32 when return_lse, else an empty [0] tensor."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse)
    return out, lse


@fwd.register_fake
def _fwd_fake(q, k, v, layout, round_mode, softmax_scale, return_lse):
    # Shape checks also run while tracing, so a bad call fails at compile time with the same message.
    validate.check_inputs(q, k, v, layout, round_mode, softmax_scale)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, layout, return_lse), dtype=torch.float32)


@torch.library.custom_op("rtcattn::fwd_out", mutates_args=("out",))
def fwd_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layout: str,
            round_mode: str, softmax_scale: float, return_lse: bool) -> torch.Tensor:
    """Writes the attention output into out; returns lse as fwd does."""
    return _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse)


@fwd_out.register_fake
def _fwd_out_fake(q, k, v, out, layout, round_mode, softmax_scale, return_lse):
    validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out)
    return q.new_empty(_lse_shape(q, layout, return_lse), dtype=torch.float32)
