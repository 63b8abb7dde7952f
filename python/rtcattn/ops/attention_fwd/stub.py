"""attention_fwd's torch ops, one per form of the call, over the one runtime op (configs/ops.json: the kv axis
"dense", "varlen" or "paged"):

- torch.ops.rtcattn.fwd / fwd_out: dense q, k, v in layout "bshd" or "bhsd"; LSE [B, H, Sq].
- torch.ops.rtcattn.fwd_varlen / fwd_varlen_out: q [total_q, Hq, D] packed by cu_seqlens_q; k, v packed
  the same way, or with a block table pages [num_pages, page_size, Hk, D]; LSE [Hq, total_q], as AITER
  returns it.

Each op's schema is read off its Python signature below (ops/schema.py); its fake is the same
function with fake=True, so the signature is written once. The ops are defined with torch.library's
Library API rather than the custom_op decorator, whose eager wrapper imports torch._dynamo at the first
call (about 2 s): a process's first forward costs what the later ones do, plus the first load of the code
object.
"""
from __future__ import annotations

import dataclasses

import torch

from .. import backward, checks, repeat, schema
from . import OP, autograd, kvcache, validate

_LIB = torch.library.Library("rtcattn", "DEF")  # kept alive: the ops live as long as this object


def _dense_lse_shape(q: torch.Tensor, layout: str, return_lse: bool):
    b, s, h, _ = validate.shape_of(q, layout)
    return (b, h, s) if return_lse else (0,)


def _packed_lse_shape(q: torch.Tensor, return_lse: bool):
    return (q.shape[1], q.shape[0]) if return_lse else (0,)


def _strides(t, layout: str):
    """Element strides in (batch, seq, head) order, as the argument block wants them (t: a tensor or its strides)."""
    s = t if isinstance(t, tuple) else t.stride()
    return (s[0], s[1], s[2]) if layout == "bshd" else (s[0], s[2], s[1])


def _contiguous_strides(shape) -> tuple:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def split_fields(num_splits: int = 0) -> dict:
    """flash-attn's num_splits as the argument block's split fields: 0, the planner's own pick (tail_split -1,
    max_splits 0); 1, no split (tail_split 0); n >= 2, the planner's pick of at most n parts (max_splits n)."""
    if num_splits == 1:
        return dict(tail_split=0, max_splits=0)
    return dict(tail_split=-1, max_splits=num_splits)


def _fields(problem, machine: dict, num_splits: int = 0) -> dict:
    """The argument block's size fields every form fills alike, the planner's picture of the device (machine:
    dispatch.machine_fields) and the split fields of num_splits (0 but for flash_attn_with_kvcache's)."""
    return dict(heads=problem.heads, head_dim=problem.head_dim, heads_k=problem.heads_k or problem.heads,
                window_left=problem.window[0], window_right=problem.window[1], softmax_scale=problem.scale,
                **machine, **split_fields(num_splits), **score_fields(problem.score),
                **dropout_fields(problem.dropout))


def score_fields(score: validate.ScoreMod) -> dict:
    """The argument block's score-modification fields: the soft cap, and the ALiBi slopes with their (batch, head)
    strides."""
    fields = dict(softcap=score.softcap)
    if score.alibi_slopes is not None:
        fields.update(alibi_slopes=score.alibi_slopes.data_ptr(), alibi_strides=score.strides())
    return fields


def dropout_fields(drop: validate.Dropout) -> dict:
    """The argument block's dropout fields: p, and the generator state's address."""
    return dict(dropout_p=drop.p, **({"rng_state": drop.rng_state.data_ptr()} if drop.rng_state is not None else {}))


def args_block(q, k, v, out, lse, layout: str, problem: validate.Problem, machine: dict):
    """The runtime's argument block of a dense call (pointers and element strides; nothing is read through them).

    out may be None: the output does not exist yet and will be contiguous; q's address stands in for
    it until launch, so the runtime can check the call before anything is allocated."""
    from ...runtime import dispatch
    o_ptr, o_strides = (q.data_ptr(), _contiguous_strides(q.shape)) if out is None else (out.data_ptr(), out.stride())
    return dispatch.lib().op_args(
        OP, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o_ptr,
        lse=lse.data_ptr() if lse is not None else None,
        q_strides=_strides(q, layout), k_strides=_strides(k, layout), v_strides=_strides(v, layout),
        o_strides=_strides(o_strides, layout), batch=problem.batch, seq_q=problem.seq_q, seq_k=problem.seq_k,
        **_fields(problem, machine))


def _kv_strides(t, p: validate.VarlenProblem) -> tuple:
    """A cache's (page or batch, row, head) strides: paged [num_pages, page, Hk, D] (FP4: [num_pages, Hk, page,
    D / 2], in bytes), varlen [total_k, Hk, D]."""
    if validate.is_fp4(p.kv_dtype):
        return t.stride(0), t.stride(2), t.stride(1)
    return tuple(t.stride()[:3]) if p.paged else (0, t.stride(0), t.stride(1))


def _quant_fields(p: validate.VarlenProblem, quant: validate.KvQuant) -> dict:
    """The argument block's quantized-cache fields (kv_dtype's value, descales, scales and their strides)."""
    fields = dict(kv_dtype=validate.axis_define("kv_dtype", p.kv_dtype))
    for name in ("k_descale", "v_descale"):
        t = getattr(quant, name)
        if t is not None:
            fields.update({name: t.data_ptr(), f"{name}_strides": validate.descale_strides(t)})
    for name in ("k_scale", "v_scale"):
        t = getattr(quant, name)
        if t is not None:
            fields.update({name: t.data_ptr(), f"{name}_strides": tuple(t.stride())})
    return fields


def args_block_varlen(q, k, v, out, cu_q, cu_k, block_table, p: validate.VarlenProblem, machine: dict,
                      seqused_k=None, num_splits: int = 0, quant: validate.KvQuant = validate.NO_QUANT):
    """The runtime's argument block of a packed call; out None: q's address stands in until launch. num_splits:
    flash-attn's (split_fields); quant: a quantized cache's descales or scales."""
    from ...runtime import dispatch
    o = q if out is None else out
    fields = dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
        q_strides=(0, q.stride(0), q.stride(1)), k_strides=_kv_strides(k, p), v_strides=_kv_strides(v, p),
        o_strides=(0, q.shape[1] * q.shape[2], q.shape[2]) if out is None else (0, out.stride(0), out.stride(1)),
        batch=p.batch, seq_q=p.max_seqlen_q, seq_k=p.max_seqlen_k, cu_seqlens_q=cu_q.data_ptr(),
        cu_seqlens_k=cu_k.data_ptr(), total_q=p.total_q, total_k=p.total_k, **_fields(p, machine, num_splits),
        **_quant_fields(p, quant))
    if p.paged:
        fields.update(block_table=block_table.data_ptr(), page_size=p.page_size, num_pages=p.num_pages,
                      pages_per_seq=p.pages_per_seq, table_stride=block_table.stride(0))
    if seqused_k is not None:
        fields.update(seqused_k=seqused_k.data_ptr())
    return dispatch.lib().op_args(OP, **fields)


def _call(q: torch.Tensor, round_mode: str, problem, kv: str) -> dict:
    """The call's value on each axis of the manifest. round_mode applies to bf16 only: fp16 rounds to nearest even
    (its only variant, the manifest's exclude list leaves out the others), whatever mode the call names. kv_dtype: the
    cache's element type (a dense call's is always "same")."""
    dtype = validate.DTYPE_AXIS[q.dtype]
    return {"round_mode": round_mode if dtype == "bf16" else "rtne", "mask": "window" if problem.masked else "none",
            "kv": kv, "head_dim": problem.head_dim, "dtype": dtype, "kv_dtype": problem.kv_dtype,
            "score_mod": problem.score.axis, "dropout": problem.dropout.axis}


class _Copy:
    """A tensor's padded copy before it exists, for the runtime's checks: its shape, its contiguous strides and,
    standing in for its address (as q's stands in for an output not allocated yet), the tensor's own rounded down
    to 256 bytes, an alignment the allocator gives the copy."""

    def __init__(self, t: torch.Tensor, d: int):
        self.shape = torch.Size((*t.shape[:-1], d))
        self._strides = _contiguous_strides(self.shape)
        self._ptr = max(t.data_ptr() // 256 * 256, 256)

    def data_ptr(self) -> int:
        return self._ptr

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]


def _padded_head_dim(problem, round_mode: str, kv: str, make_args, tensors, device) -> int | None:
    """The head dim the kernels run a call with when it is not the call's own (one that is not a multiple of 8),
    else None. The op then runs the same call on copies of the tensors with zero columns up to it (they add nothing
    to q·k, and the columns they give the output are dropped) with the call's scale, 1/sqrt of its own head dim by
    default. make_args(padded_problem, copy) fills the padded call's argument block, copy(t) standing in for the
    copy of t: the runtime checks that call, and the device's memory the copies, before they are made."""
    d = validate.padded_head_dim(problem.head_dim)
    if d == problem.head_dim:
        return None
    from ...runtime import dispatch
    padded = dataclasses.replace(problem, head_dim=d)
    args = make_args(padded, lambda t: None if t is None else _Copy(t, d))
    dispatch.select_for(OP, device, _call(tensors[0], round_mode, padded, kv), args)
    copies = [t for t in tensors if t is not None] + [tensors[0]]  # and the padded call's output, q's size
    nbytes = sum(t.numel() // problem.head_dim * d * t.element_size() for t in copies)
    dispatch.check_fits(OP, f"the copies of the inputs and output padded from head dim {problem.head_dim} to {d}",
                        nbytes, args, device)
    return d


def _pad(t: torch.Tensor | None, d: int) -> torch.Tensor | None:
    """A contiguous copy of t (same dim order) with zero columns up to head dim d."""
    if t is None:
        return None
    out = t.new_empty((*t.shape[:-1], d))
    out[..., :t.shape[-1]].copy_(t)
    out[..., t.shape[-1]:].zero_()
    return out


def selection(q, k, v, layout: str = "bshd", round_mode: str = "rtne", softmax_scale=None, window=(-1, -1),
              score: validate.ScoreMod = validate.NO_SCORE_MOD, dropout: validate.Dropout = validate.NO_DROPOUT):
    """The kernel and variant a dense call with these inputs runs (nothing is launched)."""
    from ...runtime import dispatch
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, window=window, score=score,
                                    dropout=dropout)
    machine = dispatch.machine_fields(q.device)
    d = _padded_head_dim(problem, round_mode, "dense",
                         lambda p, copy: args_block(copy(q), copy(k), copy(v), None, None, layout, p, machine),
                         (q, k, v), q.device)
    if d is not None:  # the padded call's selection, as the call runs it
        return selection(_pad(q, d), _pad(k, d), _pad(v, d), layout, round_mode, problem.scale, window, score,
                         dropout)
    args = args_block(q, k, v, None, None, layout, problem, machine)
    return dispatch.select_for(OP, q.device, _call(q, round_mode, problem, "dense"), args)


def selection_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode="rtne",
                     softmax_scale=None, window=(-1, -1), block_table=None, seqused_k=None, num_splits=0,
                     quant: validate.KvQuant = validate.NO_QUANT, score: validate.ScoreMod = validate.NO_SCORE_MOD,
                     dropout: validate.Dropout = validate.NO_DROPOUT):
    """The kernel and variant a packed call with these inputs runs (nothing is launched)."""
    from ...runtime import dispatch
    p = validate.check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                                     softmax_scale, None, window, block_table, seqused_k, quant, score, dropout)
    machine = dispatch.machine_fields(q.device)
    d = _padded_head_dim(p, round_mode, p.kv, lambda pp, copy: args_block_varlen(
        copy(q), copy(k), copy(v), None, cu_seqlens_q, cu_seqlens_k, block_table, pp, machine, seqused_k, num_splits),
        (q, k, v), q.device)
    if d is not None:  # the padded call's selection, as the call runs it
        return selection_varlen(_pad(q, d), _pad(k, d), _pad(v, d), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, round_mode, p.scale, window, block_table, seqused_k, num_splits,
                                score=score, dropout=dropout)
    args = args_block_varlen(q, k, v, None, cu_seqlens_q, cu_seqlens_k, block_table, p, machine, seqused_k,
                             num_splits, quant)
    return dispatch.select_for(OP, q.device, _call(q, round_mode, p, p.kv), args)


def _machine(q) -> dict:
    from ...runtime import dispatch
    return dispatch.machine_fields(q.device)


def launch(q, k, v, out, return_lse: bool, layout: str, round_mode: str, problem: validate.Problem):
    """A checked dense call: checks it in the runtime, allocates what does not exist yet (out when None, lse),
    launches. Returns (out, lse); lse is [B, H, Sq] fp32 when return_lse, else an empty [0] tensor. The selection
    and argument block it launched with are noted (_REPEATS), for _dense to keep for a repeat."""
    from ...runtime import dispatch  # loads the C++ runtime only when something really runs
    args = args_block(q, k, v, out, None, layout, problem, dispatch.machine_fields(q.device))
    sel = dispatch.select_for(OP, q.device, _call(q, round_mode, problem, "dense"), args)
    if out is None:
        dispatch.check_fits(OP, "the output", q.numel() * q.element_size(), args, q.device)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        args.o = out.data_ptr()
    lse = torch.empty(_dense_lse_shape(q, layout, return_lse), dtype=torch.float32, device=q.device)
    if return_lse:
        args.lse = lse.data_ptr()
    dispatch.launch(OP, q.device, sel, args)
    _REPEATS.note_launch(sel, args)
    return out, lse


# A repeat of a dense or packed call (ops/repeat.py): not with out= (its overlap checks read addresses), dropout (a
# generator state per call), a padded head dim, or RTCATTN_CHECK=1 (it reads the offsets' values).
_REPEATS = repeat.Repeats(OP)


def _repeat(hit, named, q, lse_shape, return_lse: bool, packed: bool):
    """The launch of a kept call: the output and LSE allocated as the whole path allocates them; (out, lse)."""
    if packed:  # rows no sequence owns read as rows that see no key (_packed)
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.full(lse_shape, -torch.inf, dtype=torch.float32, device=q.device)
    else:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    _REPEATS.launch(hit, q.device, named, (("o", out), ("lse", lse if return_lse else None)))
    return out, lse


def _dense(q, k, v, out, layout, round_mode, softmax_scale, return_lse, window, fake: bool,
           score: validate.ScoreMod = validate.NO_SCORE_MOD, dropout: validate.Dropout = validate.NO_DROPOUT):
    """A dense call: (out, lse) as launch returns them."""
    sig = None
    named = (("q", q), ("k", k), ("v", v), ("alibi_slopes", score.alibi_slopes))
    if not fake and out is None and dropout.p == 0 and not torch.compiler.is_compiling():
        sig = _REPEATS.signature(named, (layout, round_mode, softmax_scale, return_lse, tuple(window), score.softcap))
        hit = _REPEATS.get(sig)
        if hit is not None:
            return _repeat(hit, named, q, _dense_lse_shape(q, layout, return_lse), return_lse, packed=False)
    # The one validation of an eager call (the Python API checks only what the schema needs); it also
    # runs while tracing, so a bad call fails at compile time with the same message.
    problem = validate.check_inputs(q, k, v, layout, round_mode, softmax_scale, out, checks.check_window(window),
                                    score, dropout)
    if fake or q.numel() == 0:  # Sq = 0 (or B = 0 / H = 0): nothing to compute, nothing launched
        lse = q.new_empty(_dense_lse_shape(q, layout, return_lse), dtype=torch.float32)
        return (q.new_empty(q.shape) if out is None else out), lse
    d = _padded_head_dim(problem, round_mode, "dense", lambda p, copy: args_block(
        copy(q), copy(k), copy(v), None, None, layout, p, _machine(q)), (q, k, v), q.device)
    if d is None:
        _REPEATS.forget_launch()
        result = launch(q, k, v, out, return_lse, layout, round_mode, problem)
        _REPEATS.keep_last(sig)
        return result
    # Every output row is written: the padded call's output needs no values of out's. Contiguous, as the fake's.
    o, lse = _dense(_pad(q, d), _pad(k, d), _pad(v, d), None, layout, round_mode, problem.scale, return_lse, window,
                    False, score, dropout)
    o = o[..., :problem.head_dim]
    return (o.contiguous() if out is None else out.copy_(o)), lse


def _packed(q, k, v, out, cu_q, cu_k, max_q, max_k, round_mode, softmax_scale, return_lse, window, block_table,
            fake: bool, seqused_k=None, num_splits: int = 0, quant: validate.KvQuant = validate.NO_QUANT,
            score: validate.ScoreMod = validate.NO_SCORE_MOD, dropout: validate.Dropout = validate.NO_DROPOUT):
    """A packed call: (out, lse); lse is [Hq, total_q] fp32 when return_lse, else an empty [0] tensor. quant: a
    quantized cache's arguments (validate.KvQuant); score: the soft cap and ALiBi slopes (validate.ScoreMod);
    dropout: validate.Dropout."""
    from ...runtime import dispatch
    named = (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k),
             ("block_table", block_table), ("seqused_k", seqused_k), ("alibi_slopes", score.alibi_slopes),
             *quant.tensors())
    sig = None
    if (not fake and out is None and dropout.p == 0 and not torch.compiler.is_compiling()
            and dispatch.knob("RTCATTN_CHECK") != "1"):  # the check reads the offsets' values: every call
        sig = _REPEATS.signature(named, (max_q, max_k, round_mode, softmax_scale, return_lse, tuple(window), num_splits,
                                 quant.kv_cache_dtype, score.softcap))
        hit = _REPEATS.get(sig)
        if hit is not None:
            return _repeat(hit, named, q, _packed_lse_shape(q, return_lse), return_lse, packed=True)
    p = validate.check_varlen_inputs(q, k, v, cu_q, cu_k, max_q, max_k, round_mode, softmax_scale, out,
                                     checks.check_window(window), block_table, seqused_k, quant, score, dropout)
    if fake:
        return (q.new_empty(q.shape) if out is None else out), q.new_empty(_packed_lse_shape(q, return_lse),
                                                                           dtype=torch.float32)
    empty = p.batch == 0 or p.total_q == 0  # no sequence or no query row: nothing to compute, nothing launched
    if not empty:
        machine = dispatch.machine_fields(q.device)
        args = args_block_varlen(q, k, v, out, cu_q, cu_k, block_table, p, machine, seqused_k, num_splits, quant)
        d = _padded_head_dim(p, round_mode, p.kv, lambda pp, copy: args_block_varlen(
            copy(q), copy(k), copy(v), copy(out), cu_q, cu_k, block_table, pp, machine, seqused_k, num_splits),
            (q, k, v, out), q.device)
        if d is not None:
            # A paged pool is copied whole. A given out is copied too, so rows no sequence owns keep its values.
            o, lse = _packed(_pad(q, d), _pad(k, d), _pad(v, d), _pad(out, d), cu_q, cu_k, max_q, max_k,
                             round_mode, p.scale, return_lse, window, block_table, False, seqused_k, num_splits,
                             score=score, dropout=dropout)
            o = o[..., :p.head_dim]
            return (o.contiguous() if out is None else out.copy_(o)), lse
        sel = dispatch.select_for(OP, q.device, _call(q, round_mode, p, p.kv), args)
    else:
        sig = None  # nothing launched: nothing to keep
    if dispatch.knob("RTCATTN_CHECK") == "1":  # an empty call's metadata too: cu_seqlens=[0] with rows is wrong
        validate.check_device_metadata(cu_q, cu_k, block_table, p, seqused_k)
    # The kernels write only rows that a sequence owns; the others (rows past cu_seqlens_q[-1], as padding
    # for a captured graph leaves them, or every row when batch = 0) read as rows that see no key: O = 0,
    # LSE = -inf, never uninitialised memory. A given out keeps its values there.
    lse = torch.full(_packed_lse_shape(q, return_lse), -torch.inf, dtype=torch.float32, device=q.device)
    if empty:
        return (torch.zeros(q.shape, dtype=q.dtype, device=q.device) if out is None else out), lse
    if out is None:
        dispatch.check_fits(OP, "the output", q.numel() * q.element_size(), args, q.device)
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        args.o = out.data_ptr()
    if return_lse:
        args.lse = lse.data_ptr()
    dispatch.launch(OP, q.device, sel, args)
    if sig is not None:
        _REPEATS.keep(sig, sel, args)
    return out, lse


def _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
             block_table, out, round_mode, softmax_scale, return_lse, window, rotary_interleaved, fake: bool,
             num_splits: int = 0, quant: validate.KvQuant = validate.NO_QUANT,
             score: validate.ScoreMod = validate.NO_SCORE_MOD):
    """flash_attn_with_kvcache: (out [B, Sq, Hq, D], lse [B, Hq, Sq] fp32 or an empty [0] tensor). Appends k / v into
    the caches in place, rotates, then runs the packed form with seqused_k (kvcache.py says how, without a sync) and
    num_splits's split fields (split_fields)."""
    p = validate.check_kvcache_inputs(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                      cache_batch_idx, cache_leftpad, block_table, softmax_scale, out, quant, score)
    window = checks.check_window(window)
    validate.check_num_splits(num_splits)
    checks.check_bool("rotary_interleaved", rotary_interleaved)
    lse_shape = (p.batch, p.heads, p.seq_q) if return_lse else (0,)
    if fake:
        return (q.new_empty(q.shape) if out is None else out), q.new_empty(lse_shape, dtype=torch.float32)
    from ...runtime import dispatch
    if dispatch.knob("RTCATTN_CHECK") == "1":  # before anything is written
        kvcache.check_device_values(cache_seqlens, cache_batch_idx, cache_leftpad, block_table, p)
    packed = kvcache.plan(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, p)
    args = (packed.cu_q, packed.cu_k, p.seq_q, packed.max_seqlen_k, round_mode, p.scale)
    if q.numel():  # the runtime's checks of the attention, before the append writes anything
        selection_varlen(packed.q, packed.k, packed.v, *args, window, block_table, packed.seqused_k, num_splits,
                         quant, score)
    # flash-attn's rule: q's rows take their own rotary positions when the call is causal or local, a window side
    # at or past the capacity counting as unbounded.
    per_row = any(0 <= w < p.capacity for w in window)
    packed = kvcache.apply(packed, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           block_table, p, rotary_interleaved, per_row, quant)
    rows = (p.batch * p.seq_q, p.heads, p.head_dim)
    # out= as packed rows when its strides allow, else written through a copy. Every packed row belongs to a sequence
    # (cu_seqlens_q steps by Sq), so the kernels write all of them: the rows need no zeros first (the packed form
    # zeroes an output it allocates, for rows no sequence owns; here there are none: one memset launch fewer).
    direct = out is not None and (out.stride(0) == p.seq_q * out.stride(1) or p.batch <= 1)
    target = out.view(rows) if direct else torch.empty(rows, dtype=q.dtype, device=q.device)
    o, lse = _packed(packed.q, packed.k, packed.v, target, *args, return_lse, window, block_table, False,
                     packed.seqused_k, num_splits, quant, score)
    lse = lse.view(p.heads, p.batch, p.seq_q).permute(1, 0, 2).contiguous() if return_lse else lse
    if out is None:
        return o.view(q.shape), lse
    if not direct:
        out.copy_(o.view(q.shape))
    return out, lse


def _ops(fake: bool) -> tuple:
    """The ops, written once: their signatures are the schemas; fake=True gives their fakes."""
    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, round_mode: str,
            softmax_scale: float | None, return_lse: bool, window_left: int = -1, window_right: int = -1,
            deterministic: bool = False, softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
            dropout_p: float = 0.0, rng_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) for dense q, k, v. deterministic: the backward's (ops/attention_fwd/autograd.py), not the
        forward's (which is deterministic either way). softcap / alibi_slopes: validate.ScoreMod; dropout_p /
        rng_state: validate.Dropout (the op is a function of its inputs: the caller draws rng_state)."""
        return _dense(q, k, v, None, layout, round_mode, softmax_scale, return_lse, (window_left, window_right), fake,
                      validate.ScoreMod(softcap, alibi_slopes), validate.Dropout(dropout_p, rng_state))

    def fwd_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layout: str, round_mode: str,
                softmax_scale: float | None, return_lse: bool, window_left: int = -1, window_right: int = -1,
                softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
                rng_state: torch.Tensor | None = None) -> torch.Tensor:
        """Writes the output into out; returns lse as fwd does."""
        return _dense(q, k, v, out, layout, round_mode, softmax_scale, return_lse, (window_left, window_right),
                      fake, validate.ScoreMod(softcap, alibi_slopes), validate.Dropout(dropout_p, rng_state))[1]

    def fwd_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, round_mode: str,
                   softmax_scale: float | None, return_lse: bool, window_left: int = -1, window_right: int = -1,
                   block_table: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
                   k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                   k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                   kv_cache_dtype: str = "auto", deterministic: bool = False, softcap: float = 0.0,
                   alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
                   rng_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) for packed q, k, v; seqused_k (int32 [B], optional): sequence b uses seqused_k[b] keys
        from its first key row (flash_attn_with_kvcache's contiguous and paged caches). A quantized cache: an FP8 k / v
        with its descales, or kv_cache_dtype "fp4_e2m1" with its scales (validate.KvQuant). deterministic: the
        backward's, as fwd's."""
        quant = validate.KvQuant(kv_cache_dtype, k_descale, v_descale, k_scale, v_scale)
        return _packed(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                       softmax_scale, return_lse, (window_left, window_right), block_table, fake, seqused_k,
                       quant=quant, score=validate.ScoreMod(softcap, alibi_slopes),
                       dropout=validate.Dropout(dropout_p, rng_state))

    def fwd_varlen_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                       round_mode: str, softmax_scale: float | None, return_lse: bool, window_left: int = -1,
                       window_right: int = -1, block_table: torch.Tensor | None = None,
                       seqused_k: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                       v_descale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None, kv_cache_dtype: str = "auto", softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
                       rng_state: torch.Tensor | None = None) -> torch.Tensor:
        """Writes the output into out; returns lse as fwd_varlen does."""
        quant = validate.KvQuant(kv_cache_dtype, k_descale, v_descale, k_scale, v_scale)
        return _packed(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode,
                       softmax_scale, return_lse, (window_left, window_right), block_table, fake, seqused_k,
                       quant=quant, score=validate.ScoreMod(softcap, alibi_slopes),
                       dropout=validate.Dropout(dropout_p, rng_state))[1]

    def fwd_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None,
                    v: torch.Tensor | None, rotary_cos: torch.Tensor | None, rotary_sin: torch.Tensor | None,
                    cache_seqlens: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
                    cache_leftpad: torch.Tensor | None, block_table: torch.Tensor | None, round_mode: str,
                    softmax_scale: float | None, return_lse: bool, window_left: int = -1, window_right: int = -1,
                    rotary_interleaved: bool = True, num_splits: int = 0, k_descale: torch.Tensor | None = None,
                    v_descale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None, kv_cache_dtype: str = "auto", softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of flash_attn_with_kvcache; k_cache / v_cache (and an FP4 cache's k_scale / v_scale) get k / v
        appended in place."""
        quant = validate.KvQuant(kv_cache_dtype, k_descale, v_descale, k_scale, v_scale)
        return _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                        cache_leftpad, block_table, None, round_mode, softmax_scale, return_lse,
                        (window_left, window_right), rotary_interleaved, fake, num_splits, quant,
                        validate.ScoreMod(softcap, alibi_slopes))

    def fwd_kvcache_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                        k: torch.Tensor | None, v: torch.Tensor | None, rotary_cos: torch.Tensor | None,
                        rotary_sin: torch.Tensor | None, cache_seqlens: torch.Tensor | None,
                        cache_batch_idx: torch.Tensor | None, cache_leftpad: torch.Tensor | None,
                        block_table: torch.Tensor | None, round_mode: str, softmax_scale: float | None,
                        return_lse: bool, window_left: int = -1, window_right: int = -1,
                        rotary_interleaved: bool = True, num_splits: int = 0,
                        k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                        k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                        kv_cache_dtype: str = "auto", softcap: float = 0.0,
                        alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
        """Writes the output into out; returns lse as fwd_kvcache does."""
        quant = validate.KvQuant(kv_cache_dtype, k_descale, v_descale, k_scale, v_scale)
        return _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                        cache_leftpad, block_table, out, round_mode, softmax_scale, return_lse,
                        (window_left, window_right), rotary_interleaved, fake, num_splits, quant,
                        validate.ScoreMod(softcap, alibi_slopes))[1]

    return fwd, fwd_out, fwd_varlen, fwd_varlen_out, fwd_kvcache, fwd_kvcache_out


# The public functions that call each op, named by a backward's error.
_CALLERS = {"fwd": ("rtcattn.forward", "rtcattn.flash_attn_func", "aiter.rtcattn_fwd"),
            "fwd_out": ("rtcattn.forward(out=...)",),
            "fwd_varlen": ("rtcattn.forward_varlen", "rtcattn.flash_attn_varlen_func", "aiter.rtcattn_varlen_fwd"),
            "fwd_varlen_out": ("rtcattn.forward_varlen(out=...)", "rtcattn.flash_attn_varlen_func(out=...)"),
            "fwd_kvcache": ("rtcattn.flash_attn_with_kvcache", "aiter.rtcattn_kvcache_fwd"),
            "fwd_kvcache_out": ("rtcattn.flash_attn_with_kvcache(out=...)",)}
# What each op writes: out=, and the caches that the kvcache ops append to.
# (An FP4 cache's scales are written with it.)
_WRITES = {"fwd_kvcache": ("k_cache", "v_cache", "k_scale", "v_scale"),
           "fwd_kvcache_out": ("k_cache", "v_cache", "out", "k_scale", "v_scale")}

for _op, _fake in zip(_ops(False), _ops(True)):
    schema.define(_LIB, _op, mutates=_WRITES.get(_op.__name__, ("out",)))
    torch.library.register_fake(f"rtcattn::{_op.__name__}", _fake, lib=_LIB)
    backward.register(_LIB, _op.__name__, _CALLERS[_op.__name__], autograd.RULES.get(_op.__name__))
