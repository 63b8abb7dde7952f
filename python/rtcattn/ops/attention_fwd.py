"""attention_fwd's stub: the torch ops torch.ops.rtcattn.fwd / fwd_out, their fakes, and the argument block.

The ops are defined with torch.library's Library API (schema, one Python kernel per backend, a fake
for tracing) rather than the custom_op decorator, whose eager wrapper imports torch._dynamo at the
first call (about 2 s): a process's first forward costs what the later ones do, plus the first
load of the code object.
"""
from __future__ import annotations

import torch

from .. import validate
from . import backward

OP = validate.OP
_LIB = torch.library.Library("rtcattn", "DEF")  # kept alive: the ops live as long as this object
_LIB.define("fwd(Tensor q, Tensor k, Tensor v, str layout, str round_mode, float? softmax_scale, "
            "bool return_lse, int window_left=-1, int window_right=-1) -> (Tensor, Tensor)")
_LIB.define("fwd_out(Tensor q, Tensor k, Tensor v, Tensor(a!) out, str layout, str round_mode, "
            "float? softmax_scale, bool return_lse, int window_left=-1, int window_right=-1) -> Tensor")


def _lse_shape(q: torch.Tensor, layout: str, return_lse: bool):
    b, s, h, _ = validate._shape_of(q, layout)
    return (b, h, s) if return_lse else (0,)


def _strides(t, layout: str):
    """Element strides in (batch, seq, head) order, as the argument block wants them (t: a tensor or its strides)."""
    s = t.stride() if isinstance(t, torch.Tensor) else t
    return (s[0], s[1], s[2]) if layout == "bshd" else (s[0], s[2], s[1])


def _contiguous_strides(shape) -> tuple:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def args_block(q, k, v, out, lse, layout: str, problem: validate.Problem, num_cus: int):
    """The runtime's argument block of a call (pointers and element strides; nothing is read through them).

    out may be None: the output does not exist yet and will be contiguous; q's address stands in for
    it until launch, so the runtime can check the call before anything is allocated."""
    from ..runtime import dispatch
    o_ptr, o_strides = (q.data_ptr(), _contiguous_strides(q.shape)) if out is None else (out.data_ptr(), out.stride())
    return dispatch.lib().op_args(
        OP, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o_ptr,
        lse=lse.data_ptr() if lse is not None else None,
        q_strides=_strides(q, layout), k_strides=_strides(k, layout), v_strides=_strides(v, layout),
        o_strides=_strides(o_strides, layout), batch=problem.batch, heads=problem.heads, seq_q=problem.seq_q,
        seq_k=problem.seq_k, head_dim=problem.head_dim, heads_k=problem.heads_k or problem.heads,
        window_left=problem.window[0], window_right=problem.window[1], softmax_scale=problem.scale, tail_split=-1,
        num_cus=num_cus)


def _call(layout: str, round_mode: str, problem: validate.Problem) -> dict:
    """The call's value on each axis of the manifest."""
    return {"round_mode": round_mode, "mask": "window" if problem.masked else "none", "kv": "dense",
            "head_dim": problem.head_dim}


def selection(q, k, v, layout: str = "bshd", round_mode: str = "rtne", softmax_scale=None, window=(-1, -1)):
    """The kernel and variant a call with these inputs runs (nothing is launched)."""
    from ..runtime import dispatch
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, window=window)
    args = args_block(q, k, v, None, None, layout, problem, dispatch.device_facts(q.device)[1])
    return dispatch.select_for(OP, q.device, _call(layout, round_mode, problem), args)


def launch(q, k, v, out, return_lse: bool, layout: str, round_mode: str, problem: validate.Problem):
    """Checks the call in the runtime, allocates what does not exist yet (out when None, lse), launches.

    Returns (out, lse); lse is [B, H, Sq] fp32 when return_lse, else an empty [0] tensor."""
    from ..runtime import dispatch  # loads the C++ runtime only when something really runs
    args = args_block(q, k, v, out, None, layout, problem, dispatch.device_facts(q.device)[1])
    sel = dispatch.select_for(OP, q.device, _call(layout, round_mode, problem), args)
    if out is None:
        dispatch.check_fits(OP, "the output", q.numel() * q.element_size(), args, q.device)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        args.o = out.data_ptr()
    lse = torch.empty(_lse_shape(q, layout, return_lse), dtype=torch.float32, device=q.device)
    if return_lse:
        args.lse = lse.data_ptr()
    dispatch.launch(OP, q.device, sel, args)
    return out, lse


def _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse, window):
    # The one validation of an eager call: the Python API only checks what the op's schema needs.
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out, validate.check_window(window))
    if q.numel() == 0:  # Sq = 0 (or B = 0 / H = 0): nothing to compute, nothing launched
        empty = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
        return empty, torch.empty(_lse_shape(q, layout, return_lse), dtype=torch.float32, device=q.device)
    return launch(q, k, v, out, return_lse, layout, round_mode, problem)


def fwd(q, k, v, layout, round_mode, softmax_scale, return_lse, window_left=-1, window_right=-1):
    """(out, lse) for q, k, v; lse is [B, H, Sq] fp32 when return_lse, else an empty [0] tensor."""
    return _run(q, k, v, None, layout, round_mode, softmax_scale, return_lse, (window_left, window_right))


def fwd_out(q, k, v, out, layout, round_mode, softmax_scale, return_lse, window_left=-1, window_right=-1):
    """Writes the attention output into out; returns lse as fwd does."""
    return _run(q, k, v, out, layout, round_mode, softmax_scale, return_lse, (window_left, window_right))[1]


for _backend in ("CPU", "CUDA"):  # ROCm tensors are "cuda" tensors to torch
    _LIB.impl("fwd", fwd, _backend)
    _LIB.impl("fwd_out", fwd_out, _backend)
backward.register(_LIB, "fwd", ("rtcattn.forward", "rtcattn.flash_attn_func", "aiter.rtcattn_fwd"))
backward.register(_LIB, "fwd_out", ("rtcattn.forward(out=...)",))


@torch.library.register_fake("rtcattn::fwd", lib=_LIB)
def _fwd_fake(q, k, v, layout, round_mode, softmax_scale, return_lse, window_left=-1, window_right=-1):
    # Shape checks also run while tracing, so a bad call fails at compile time with the same message.
    validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, window=(window_left, window_right))
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, layout, return_lse), dtype=torch.float32)


@torch.library.register_fake("rtcattn::fwd_out", lib=_LIB)
def _fwd_out_fake(q, k, v, out, layout, round_mode, softmax_scale, return_lse, window_left=-1, window_right=-1):
    validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out, (window_left, window_right))
    return q.new_empty(_lse_shape(q, layout, return_lse), dtype=torch.float32)
