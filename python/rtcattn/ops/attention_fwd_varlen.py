"""attention_fwd over packed sequences: the torch ops torch.ops.rtcattn.fwd_varlen / fwd_varlen_out and their fakes.

The same runtime op as the dense call (configs/ops.json: attention_fwd, kv axis "varlen" or
"paged"): this stub fills the argument block's sequence fields. q is [total_q, Hq, D]; k, v are
[total_k, Hk, D] or, with a block table, pages [num_pages, page_size, Hk, D]; the LSE is
[Hq, total_q] fp32, as AITER returns it.
"""
from __future__ import annotations

import torch

from .. import validate, validate_varlen
from . import backward
from .attention_fwd import _LIB

OP = validate.OP
_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
         "int max_seqlen_k, str round_mode, float? softmax_scale, bool return_lse, int window_left=-1, "
         "int window_right=-1, Tensor? block_table=None")
_LIB.define(f"fwd_varlen({_ARGS}) -> (Tensor, Tensor)")
_LIB.define(f"fwd_varlen_out({_ARGS.replace('Tensor cu_seqlens_q', 'Tensor(a!) out, Tensor cu_seqlens_q')}) -> Tensor")


def _lse_shape(q: torch.Tensor, return_lse: bool):
    return (q.shape[1], q.shape[0]) if return_lse else (0,)


def args_block(q, k, v, out, cu_q, cu_k, block_table, p: validate_varlen.VarlenProblem, num_cus: int):
    """The runtime's argument block of a packed call; out None: q's address stands in until launch."""
    from ..runtime import dispatch
    o = q if out is None else out
    kv_strides = (lambda t: tuple(t.stride()[:3])) if p.paged else (lambda t: (0, t.stride(0), t.stride(1)))
    fields = dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
        q_strides=(0, q.stride(0), q.stride(1)), k_strides=kv_strides(k), v_strides=kv_strides(v),
        o_strides=(0, q.shape[1] * q.shape[2], q.shape[2]) if out is None else (0, out.stride(0), out.stride(1)),
        batch=p.batch, heads=p.heads, seq_q=p.max_seqlen_q, seq_k=p.max_seqlen_k, head_dim=p.head_dim,
        heads_k=p.heads_k, window_left=p.window[0], window_right=p.window[1], softmax_scale=p.scale, tail_split=-1,
        num_cus=num_cus, cu_seqlens_q=cu_q.data_ptr(), cu_seqlens_k=cu_k.data_ptr(), total_q=p.total_q,
        total_k=p.total_k)
    if p.paged:
        fields.update(block_table=block_table.data_ptr(), page_size=p.page_size, num_pages=p.num_pages,
                      pages_per_seq=p.pages_per_seq, table_stride=block_table.stride(0))
    return dispatch.lib().op_args(OP, **fields)


def _call(round_mode: str, p: validate_varlen.VarlenProblem) -> dict:
    """The call's value on each axis of the manifest."""
    return {"round_mode": round_mode, "mask": "window" if p.masked else "none", "kv": p.kv, "head_dim": p.head_dim}


def selection(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode="rtne",
              softmax_scale=None, window=(-1, -1), block_table=None):
    """The kernel and variant a packed call with these inputs runs (nothing is launched)."""
    from ..runtime import dispatch
    p = validate_varlen.check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                            round_mode, softmax_scale, None, window, block_table)
    args = args_block(q, k, v, None, cu_seqlens_q, cu_seqlens_k, block_table, p, dispatch.device_facts(q.device)[1])
    return dispatch.select_for(OP, q.device, _call(round_mode, p), args)


def _run(q, k, v, out, cu_q, cu_k, max_q, max_k, round_mode, softmax_scale, return_lse, window, block_table):
    from ..runtime import dispatch
    p = validate_varlen.check_varlen_inputs(q, k, v, cu_q, cu_k, max_q, max_k, round_mode, softmax_scale, out,
                                            validate.check_window(window), block_table)
    empty = p.batch == 0 or p.total_q == 0  # no sequence or no query row: nothing to compute, nothing launched
    if not empty:
        args = args_block(q, k, v, out, cu_q, cu_k, block_table, p, dispatch.device_facts(q.device)[1])
        sel = dispatch.select_for(OP, q.device, _call(round_mode, p), args)
    if dispatch.knob("RTCATTN_CHECK") == "1":  # an empty call's metadata too: cu_seqlens=[0] with rows is wrong
        validate_varlen.check_device_metadata(cu_q, cu_k, block_table, p)
    # The kernels write only rows that a sequence owns; the others (rows past cu_seqlens_q[-1], as padding
    # for a captured graph leaves them, or every row when batch = 0) read as rows that see no key: O = 0,
    # LSE = -inf, never uninitialised memory. A given out keeps its values there.
    lse = torch.full(_lse_shape(q, return_lse), -torch.inf, dtype=torch.float32, device=q.device)
    if empty:
        return (torch.zeros(q.shape, dtype=q.dtype, device=q.device) if out is None else out), lse
    if out is None:
        dispatch.check_fits(OP, "the output", q.numel() * q.element_size(), args, q.device)
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        args.o = out.data_ptr()
    if return_lse:
        args.lse = lse.data_ptr()
    dispatch.launch(OP, q.device, sel, args)
    return out, lse


def fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode, softmax_scale,
               return_lse, window_left=-1, window_right=-1, block_table=None):
    """(out, lse) for packed q, k, v; lse is [Hq, total_q] fp32 when return_lse, else an empty [0] tensor."""
    return _run(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode, softmax_scale,
                return_lse, (window_left, window_right), block_table)


def fwd_varlen_out(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode, softmax_scale,
                   return_lse, window_left=-1, window_right=-1, block_table=None):
    """Writes the output into out; returns lse as fwd_varlen does."""
    return _run(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode, softmax_scale,
                return_lse, (window_left, window_right), block_table)[1]


for _backend in ("CPU", "CUDA"):
    _LIB.impl("fwd_varlen", fwd_varlen, _backend)
    _LIB.impl("fwd_varlen_out", fwd_varlen_out, _backend)
backward.register(_LIB, "fwd_varlen", ("rtcattn.forward_varlen", "rtcattn.flash_attn_varlen_func",
                                       "aiter.rtcattn_varlen_fwd"))
backward.register(_LIB, "fwd_varlen_out", ("rtcattn.forward_varlen(out=...)",
                                           "rtcattn.flash_attn_varlen_func(out=...)"))


@torch.library.register_fake("rtcattn::fwd_varlen", lib=_LIB)
def _fwd_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode, softmax_scale,
                     return_lse, window_left=-1, window_right=-1, block_table=None):
    validate_varlen.check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                                        softmax_scale, None, (window_left, window_right), block_table)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, return_lse), dtype=torch.float32)


@torch.library.register_fake("rtcattn::fwd_varlen_out", lib=_LIB)
def _fwd_varlen_out_fake(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                         softmax_scale, return_lse, window_left=-1, window_right=-1, block_table=None):
    validate_varlen.check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                                        softmax_scale, out, (window_left, window_right), block_table)
    return q.new_empty(_lse_shape(q, return_lse), dtype=torch.float32)
