"""attention_bwd's torch ops, one per form of the forward call (configs/ops.json: the kv axis "dense" or "varlen"):

- torch.ops.rtcattn.bwd: (dq, dk, dv) of a dense call of torch.ops.rtcattn.fwd, from dout, the call's q, k, v, its
  output and its LSE [B, H, Sq];
- torch.ops.rtcattn.bwd_varlen: the same for a packed call of fwd_varlen (LSE [Hq, total_q]); a paged or quantized
  cache takes no gradients.

dlse (optional) is the gradient of the LSE the forward returned: d LSE_i / d s_ij = P_ij, so it joins delta
(docs/numerics.md, the backward). The forward ops' autograd calls these (attention_fwd/autograd.py). As the forward
ops, each schema is read off its Python signature and its fake is the same function with fake=True.
"""
from __future__ import annotations

import torch

from .. import checks, repeat, schema
from ..attention_fwd import validate as fwd_validate
from ..attention_fwd.stub import _pad as pad_head_dim, _strides, dropout_fields, score_fields
from . import OP, validate

_LIB = torch.library.Library("rtcattn", "FRAGMENT")  # kept alive: the ops live as long as this object


def _call(q: torch.Tensor, round_mode: str, problem, kv: str) -> dict:
    """The call's value on each axis of the manifest (fp16 rounds to nearest even whatever the mode)."""
    dtype = fwd_validate.DTYPE_AXIS[q.dtype]
    return {"round_mode": round_mode if dtype == "bf16" else "rtne", "mask": "window" if problem.masked else "none",
            "kv": kv, "head_dim": problem.head_dim, "dtype": dtype, "score_mod": problem.score.axis,
            "dropout": problem.dropout.axis}


def _grad_fields(dout, dlse, dq, dk, dv, strides, deterministic: bool) -> dict:
    """The argument block's gradient fields; strides(t) gives a tensor's (batch, seq, head) element strides."""
    return dict(dout=dout.data_ptr(), dout_strides=strides(dout), dlse=None if dlse is None else dlse.data_ptr(),
                dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr(), dq_strides=strides(dq),
                dk_strides=strides(dk), dv_strides=strides(dv), deterministic=int(deterministic))


def _sizes(problem) -> dict:
    return dict(heads=problem.heads, head_dim=problem.head_dim, heads_k=problem.heads_k or problem.heads,
                window_left=problem.window[0], window_right=problem.window[1], softmax_scale=problem.scale,
                **score_fields(problem.score), **dropout_fields(problem.dropout))


def args_block(dout, q, k, v, out, lse, dlse, dq, dk, dv, layout: str, problem, deterministic: bool):
    """The runtime's argument block of a dense backward call."""
    from ...runtime import dispatch
    return dispatch.lib().op_args(
        OP, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(), lse=lse.data_ptr(),
        q_strides=_strides(q, layout), k_strides=_strides(k, layout), v_strides=_strides(v, layout),
        o_strides=_strides(out, layout), batch=problem.batch, seq_q=problem.seq_q, seq_k=problem.seq_k,
        **_sizes(problem), **_grad_fields(dout, dlse, dq, dk, dv, lambda t: _strides(t, layout), deterministic))


def args_block_varlen(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_q, cu_k, p, deterministic: bool):
    """The runtime's argument block of a packed backward call: rows [total, heads, D], strides (0, row, head)."""
    from ...runtime import dispatch

    def rows(t):
        return 0, t.stride(0), t.stride(1)
    return dispatch.lib().op_args(
        OP, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(), lse=lse.data_ptr(),
        q_strides=rows(q), k_strides=rows(k), v_strides=rows(v), o_strides=rows(out), batch=p.batch,
        seq_q=p.max_seqlen_q, seq_k=p.max_seqlen_k, cu_seqlens_q=cu_q.data_ptr(), cu_seqlens_k=cu_k.data_ptr(),
        total_q=p.total_q, total_k=p.total_k, **_sizes(p),
        **_grad_fields(dout, dlse, dq, dk, dv, rows, deterministic))


# A repeat of a backward call (ops/repeat.py): not with dropout (a generator state per call), a padded head dim or
# RTCATTN_CHECK=1 (it reads the offsets' values).
_REPEATS = repeat.Repeats(OP)


def _run(q, args, call, sig=None) -> None:
    from ...runtime import dispatch
    sel = dispatch.select_for(OP, q.device, call, args)
    dispatch.launch(OP, q.device, sel, args)
    if sig is not None:
        _REPEATS.keep(sig, sel, args)


def _signature(named, scalars, dropout, fake: bool):
    """The call's signature when it may repeat, else None."""
    if fake or dropout.p > 0 or torch.compiler.is_compiling():
        return None
    return _REPEATS.signature(named, scalars)


def _named(dout, q, k, v, out, lse, dlse, score, *packed) -> tuple:
    """The call's tensors by their argument-block fields (ops/repeat.py)."""
    return (("dout", dout), ("q", q), ("k", k), ("v", v), ("o", out), ("lse", lse), ("dlse", dlse),
            ("alibi_slopes", score.alibi_slopes), *packed)


def selection(dout, q, k, v, out, lse, layout: str = "bshd", round_mode: str = "rtne", softmax_scale=None,
              window=(-1, -1), score: fwd_validate.ScoreMod = fwd_validate.NO_SCORE_MOD,
              dropout: fwd_validate.Dropout = fwd_validate.NO_DROPOUT):
    """The kernel and variant a dense backward call with these inputs runs (nothing is launched)."""
    from ...runtime import dispatch
    problem = fwd_validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, window=window, score=score,
                                        dropout=dropout)
    d = fwd_validate.padded_head_dim(problem.head_dim)
    if d != problem.head_dim:
        t = [pad_head_dim(x, d) for x in (dout, q, k, v, out)]
        return selection(*t, lse, layout, round_mode, problem.scale, window, score, dropout)
    args = args_block(dout, q, k, v, out, lse, None, q, k, v, layout, problem, True)
    return dispatch.select_for(OP, q.device, _call(q, round_mode, problem, "dense"), args)


def _dense(dout, q, k, v, out, lse, layout, round_mode, softmax_scale, window, deterministic, dlse, fake: bool,
           score: fwd_validate.ScoreMod = fwd_validate.NO_SCORE_MOD,
           dropout: fwd_validate.Dropout = fwd_validate.NO_DROPOUT):
    """(dq, dk, dv) of a dense call; the gradients have q's, k's and v's shapes (contiguous)."""
    named = _named(dout, q, k, v, out, lse, dlse, score)
    sig = _signature(named, ("dense", layout, round_mode, softmax_scale, tuple(window), deterministic, score.softcap),
                     dropout, fake)
    hit = None if sig is None else _REPEATS.get(sig)
    if hit is not None:
        grads = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        _REPEATS.launch(hit, q.device, named, tuple(zip(("dq", "dk", "dv"), grads)))
        return grads
    problem = fwd_validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, None, checks.check_window(window),
                                        score, dropout)
    b, s, h, _ = fwd_validate.shape_of(q, layout)
    validate.check_grad_inputs(q, out, dout, lse, dlse, (b, h, s))
    checks.check_bool("deterministic", deterministic)
    if fake:
        return tuple(t.new_empty(t.shape) for t in (q, k, v))
    if q.numel() == 0:  # no query row (or B = 0, H = 0): nothing reaches k and v
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    d = fwd_validate.padded_head_dim(problem.head_dim)
    if d != problem.head_dim:  # zero columns add nothing to q.k, dO.v or dO.o; their gradients are dropped
        t = [pad_head_dim(x, d) for x in (dout, q, k, v, out)]
        grads = _dense(*t, lse, layout, round_mode, problem.scale, window, deterministic, dlse, False, score,
                       dropout)
        return tuple(g[..., :problem.head_dim].contiguous() for g in grads)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    _run(q, args_block(dout, q, k, v, out, lse, dlse, dq, dk, dv, layout, problem, deterministic),
         _call(q, round_mode, problem, "dense"), sig)
    return dq, dk, dv


def _packed(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, round_mode, softmax_scale, window, deterministic,
            dlse, fake: bool, score: fwd_validate.ScoreMod = fwd_validate.NO_SCORE_MOD,
            dropout: fwd_validate.Dropout = fwd_validate.NO_DROPOUT):
    """(dq, dk, dv) of a packed call; rows no sequence owns get zero gradients."""
    from ...runtime import dispatch
    named = _named(dout, q, k, v, out, lse, dlse, score, ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k))
    sig = None
    if dispatch.knob("RTCATTN_CHECK") != "1":  # the check reads the offsets' values: every call
        sig = _signature(named, ("varlen", max_q, max_k, round_mode, softmax_scale, tuple(window), deterministic,
                                 score.softcap), dropout, fake)
    hit = None if sig is None else _REPEATS.get(sig)
    if hit is not None:
        grads = tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        _REPEATS.launch(hit, q.device, named, tuple(zip(("dq", "dk", "dv"), grads)))
        return grads
    p = fwd_validate.check_varlen_inputs(q, k, v, cu_q, cu_k, max_q, max_k, round_mode, softmax_scale, None,
                                         checks.check_window(window), None, None, score=score, dropout=dropout)
    validate.check_grad_inputs(q, out, dout, lse, dlse, (q.shape[1], q.shape[0]))
    checks.check_bool("deterministic", deterministic)
    if fake:
        return tuple(t.new_empty(t.shape) for t in (q, k, v))
    if dispatch.knob("RTCATTN_CHECK") == "1":
        fwd_validate.check_device_metadata(cu_q, cu_k, None, p)
    dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if p.batch == 0 or p.total_q == 0:
        return dq, dk, dv
    d = fwd_validate.padded_head_dim(p.head_dim)
    if d != p.head_dim:
        t = [pad_head_dim(x, d) for x in (dout, q, k, v, out)]
        grads = _packed(*t, lse, cu_q, cu_k, max_q, max_k, round_mode, p.scale, window, deterministic, dlse, False,
                        score, dropout)
        return tuple(g[..., :p.head_dim].contiguous() for g in grads)
    _run(q, args_block_varlen(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_q, cu_k, p, deterministic),
         _call(q, round_mode, p, "varlen"), sig)
    return dq, dk, dv


def _ops(fake: bool) -> tuple:
    """The ops, written once: their signatures are the schemas; fake=True gives their fakes."""
    def bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, layout: str, round_mode: str, softmax_scale: float | None, window_left: int = -1,
            window_right: int = -1, deterministic: bool = True, dlse: torch.Tensor | None = None,
            softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
            rng_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) of fwd(q, k, v, layout, round_mode, softmax_scale, ...) = (out, lse) for the gradient dout
        of out (and dlse of lse, when given); softcap, alibi_slopes, dropout_p and rng_state the forward's."""
        return _dense(dout, q, k, v, out, lse, layout, round_mode, softmax_scale, (window_left, window_right),
                      deterministic, dlse, fake, fwd_validate.ScoreMod(softcap, alibi_slopes),
                      fwd_validate.Dropout(dropout_p, rng_state))

    def bwd_varlen(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                   max_seqlen_k: int, round_mode: str, softmax_scale: float | None, window_left: int = -1,
                   window_right: int = -1, deterministic: bool = True, dlse: torch.Tensor | None = None,
                   softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
                   rng_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) of fwd_varlen's packed call (no block table, no quantized cache)."""
        return _packed(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                       softmax_scale, (window_left, window_right), deterministic, dlse, fake,
                       fwd_validate.ScoreMod(softcap, alibi_slopes), fwd_validate.Dropout(dropout_p, rng_state))

    return bwd, bwd_varlen


for _op, _fake in zip(_ops(False), _ops(True)):
    schema.define(_LIB, _op)
    torch.library.register_fake(f"rtcattn::{_op.__name__}", _fake, lib=_LIB)
