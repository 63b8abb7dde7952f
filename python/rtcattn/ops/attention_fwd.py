"""attention_fwd's stub: the torch custom ops torch.ops.rtcattn.fwd / fwd_out, their fakes, and the argument block."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import validate

OP = validate.OP


def _lse_shape(q: torch.Tensor, layout: str, return_lse: bool):
    b, s, h, _ = validate._shape_of(q, layout)
    return (b, h, s) if return_lse else (0,)


def _strides(t: torch.Tensor, layout: str):
    """Element strides in (batch, seq, head) order, as the argument block wants them."""
    s = t.stride()
    return (s[0], s[1], s[2]) if layout == "bshd" else (s[0], s[2], s[1])


def args_block(q, k, v, out, lse, layout: str, problem: validate.Problem, num_cus: int):
    """The runtime's argument block of a call (pointers and element strides; nothing is read through them)."""
    from .. import dispatch
    return dispatch.lib().op_args(
        OP, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
        lse=lse.data_ptr() if lse is not None else None,
        q_strides=_strides(q, layout), k_strides=_strides(k, layout), v_strides=_strides(v, layout),
        o_strides=_strides(out, layout), batch=problem.batch, heads=problem.heads, seq_q=problem.seq_q,
        seq_k=problem.seq_k, head_dim=problem.head_dim, softmax_scale=problem.scale, tail_split=-1,
        num_cus=num_cus)


def _call(layout: str, round_mode: str, problem: validate.Problem) -> dict:
    """The call's value on each axis of the manifest."""
    return {"layout": layout, "round_mode": round_mode, "head_dim": problem.head_dim}


def selection(q, k, v, layout: str = "bshd", round_mode: str = "rtne", softmax_scale=None):
    """The kernel and variant a call with these inputs runs (nothing is launched)."""
    from .. import dispatch
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale)
    arch, num_cus = dispatch.device_facts(q.device)
    args = args_block(q, k, v, q, None, layout, problem, num_cus)
    return dispatch.choose(OP, arch, _call(layout, round_mode, problem), args, dispatch.vendor_of(q.device))


def _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse, check_out: bool) -> torch.Tensor:
    # The one validation of an eager call: the Python API only checks what the op's schema needs.
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out if check_out else None)
    lse = torch.empty(_lse_shape(q, layout, return_lse), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return lse  # Sq = 0 (or B = 0 / H = 0): nothing to compute, nothing launched
    launch(q, k, v, out, lse if return_lse else None, layout, round_mode, problem)
    return lse


def launch(q, k, v, out, lse, layout: str, round_mode: str, problem: validate.Problem) -> None:
    """Selects, builds and launches for checked inputs; out (and lse when not None) are written in place."""
    from .. import dispatch  # loads the C++ runtime only when something really runs
    _, num_cus = dispatch.device_facts(q.device)
    args = args_block(q, k, v, out, lse, layout, problem, num_cus)
    dispatch.run(OP, q.device, _call(layout, round_mode, problem), args)


@torch.library.custom_op("rtcattn::fwd", mutates_args=())
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, round_mode: str,
        softmax_scale: Optional[float], return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse); lse is [B, H, Sq] fp32 when return_lse, else an empty [0] tensor."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse, check_out=False)
    return out, lse


@fwd.register_fake
def _fwd_fake(q, k, v, layout, round_mode, softmax_scale, return_lse):
    # Shape checks also run while tracing, so a bad call fails at compile time with the same message.
    validate.check_inputs(q, k, v, layout, round_mode, softmax_scale)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, layout, return_lse), dtype=torch.float32)


@torch.library.custom_op("rtcattn::fwd_out", mutates_args=("out",))
def fwd_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layout: str,
            round_mode: str, softmax_scale: Optional[float], return_lse: bool) -> torch.Tensor:
    """Writes the attention output into out; returns lse as fwd does."""
    return _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse, check_out=True)


@fwd_out.register_fake
def _fwd_out_fake(q, k, v, out, layout, round_mode, softmax_scale, return_lse):
    validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out)
    return q.new_empty(_lse_shape(q, layout, return_lse), dtype=torch.float32)
