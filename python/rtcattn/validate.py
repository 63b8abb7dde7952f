"""Argument checks run before anything launches: each error names the argument, the value and what is accepted."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

OP = "attention_fwd"
HOW_V3_BF16_CVT = {0: "rtne", 1: "rtna", 2: "rtz"}   # AITER's encoding of the rounding mode (AITER's fact)
# The tensor layouts a call takes: [B, S, H, D] and [B, H, S, D]. Not an axis of the manifest: the strides
# carry the layout to the kernels, so one code object serves both.
LAYOUTS = ("bshd", "bhsd")


def axis_values(axis: str) -> tuple:
    """The values of one of the op's axes, as the manifest declares them (round_mode, mask, kv)."""
    from .runtime import manifest
    return tuple(manifest.load().op(OP).axis_values(axis))


@dataclass(frozen=True)
class Problem:
    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    scale: float
    heads_k: int = 0          # K/V heads (GQA/MQA: heads is a multiple of it); 0 = heads
    window: tuple = (-1, -1)  # (left, right) keys around the diagonal; -1 unbounded; causal: right 0

    @property
    def masked(self) -> bool:
        return self.window != (-1, -1)


def _shape_of(t: torch.Tensor, layout: str):
    """(B, S, H, D) whatever the layout."""
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == "bshd" else (b, y, x, d)


def check_choice(name: str, value, accepted) -> None:
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"{name}={value!r} is not supported; accepted: {', '.join(map(repr, accepted))}")


def check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: torch.bfloat16")
    if t.dim() != 4:
        raise ValueError(f"{name}.ndim={t.dim()} (shape {tuple(t.shape)}) is not supported; "
                         "accepted: 4 dims, [B, S, H, D] for layout 'bshd' or [B, H, S, D] for 'bhsd'")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1)={t.stride(-1)} (strides {tuple(t.stride())}): the head dim "
                         "must be contiguous; accepted: stride 1 in the last dim (e.g. call .contiguous())")


def head_dim_rule():
    """(supports(d), description) from the manifest's kernels: a head dim is supported when any kernel takes it."""
    global _head_dim_rule
    if _head_dim_rule is None:  # read once per process: every call checks the head dim
        from .runtime import manifest
        specs = {k.axes["head_dim"] for k in manifest.load().op(OP).kernels}
        widest = [s for s in specs if not any(o != s and o.lo <= s.lo and s.hi <= o.hi and o.step <= s.step
                                                for o in specs)]
        text = "; ".join(s.describe() for s in sorted(widest, key=lambda s: s.lo))
        _head_dim_rule = (lambda d: any(s.accepts(d) for s in specs)), text
    return _head_dim_rule


_head_dim_rule = None


# The largest size or window the kernels take: they index with 32-bit ints. The runtime checks every
# size against it (jit/ops/attention_fwd/op.cpp, kMaxSize); Python checks the int arguments against it
# before torch's dispatcher, whose int64 schema cannot even carry the ints past 2**63.
MAX_SIZE = 2**31 - 1


def check_int(name: str, value, lo: int, hi: int, meaning: str = "") -> int:
    """A Python int (not a bool) in lo..hi."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} is not supported; accepted: an int >= {lo} and <= {hi}{meaning}")
    return value


FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38   # the smallest normal float32
# The kernels fold the scale into scale·log2(e) in float32 (numerics §2, §4): past this it is +Inf.
SCALE_MAX = FLOAT32_MAX / 1.4426950408889634


def check_scale(softmax_scale, head_dim: int) -> float:
    """The scale as the kernels get it (a float32): a finite float > 0 that float32 holds as a normal
    number, so 1e39 is refused here rather than reported later as 'inf', and small enough that
    scale·log2(e) is finite in float32 too (above 2.36e38 every row that sees a key would be NaN)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale={softmax_scale!r} ({type(softmax_scale).__name__}) is not supported; "
                        "accepted: None (1/sqrt(D)) or a finite float > 0")
    if not FLOAT32_TINY <= softmax_scale <= SCALE_MAX:  # compared as given: float(10**400) would overflow
        raise ValueError(f"softmax_scale={softmax_scale!r} is not supported; accepted: None (1/sqrt(D)) or a "
                         f"finite float > 0 in [{FLOAT32_TINY:.7g}, {SCALE_MAX:.7g}] (a normal float32 whose "
                         "product with log2(e) is finite in float32)")
    return float(softmax_scale)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) is not supported; accepted: True or False")
    return value


def _check_same(what: str, names, values) -> None:
    # Pairwise ==, not set(): under dynamic-shape tracing the sizes are unhashable SymInts.
    if not all(x == values[0] for x in values[1:]):
        shown = ", ".join(f"{n}={v}" for n, v in zip(names, values))
        raise ValueError(f"mismatched {what}: {shown}; accepted: equal values")


def check_window(window_size, causal: bool = False) -> tuple:
    """(left, right) from FlashAttention's window_size and causal (which makes right 0)."""
    check_bool("causal", causal)
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(type(x) is int and -1 <= x <= MAX_SIZE for x in window_size))
    if not ok:
        raise ValueError(f"window_size={window_size!r} is not supported; accepted: a pair (left, right) of "
                         f"integers >= -1 and <= {MAX_SIZE} (-1: unbounded)")
    left, right = window_size
    return (left, 0 if causal else right)


def check_inputs(q, k, v, layout: str = "bshd", round_mode: str = "rtne", softmax_scale=None,
                 out: torch.Tensor | None = None, window: tuple = (-1, -1)) -> Problem:
    """Every check that needs no device: types, shapes, strides, devices, out. Returns the problem sizes."""
    check_choice("layout", layout, LAYOUTS)
    check_choice("round_mode", round_mode, axis_values("round_mode"))
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    devices = (q.device, k.device, v.device)
    _check_same("devices", ("q.device", "k.device", "v.device"), devices)
    (bq, sq, hq, dq), (bk, sk, hk, dk), (bv, sv, hv, dv) = (_shape_of(t, layout) for t in (q, k, v))
    _check_same(f"batch size (layout {layout!r})", ("q", "k", "v"), (bq, bk, bv))
    _check_same(f"number of heads of k and v (layout {layout!r})", ("k", "v"), (hk, hv))
    if (hk == 0 and hq != 0) or (hk != 0 and hq % hk != 0):
        raise ValueError(f"mismatched number of heads (layout {layout!r}): q={hq}, k=v={hk}; accepted: q heads a "
                         "multiple of the k/v heads (equal, GQA or MQA)")
    _check_same("head dim", ("q", "k", "v"), (dq, dk, dv))
    _check_same(f"key/value sequence length (layout {layout!r})", ("k", "v"), (sk, sv))
    if sk == 0:
        raise ValueError(f"k sequence length Sk=0 (k.shape={tuple(k.shape)}, layout {layout!r}) is not "
                         "supported; accepted: Sk >= 1")
    supports, rule = head_dim_rule()
    if not supports(dq):
        raise ValueError(f"head dim D={dq} (q.shape={tuple(q.shape)}) is not supported; accepted: {rule}")
    if out is not None:
        check_out(out, q, (("q", q), ("k", k), ("v", v)))
    return Problem(bq, hq, sq, sk, dq, check_scale(softmax_scale, dq), hk, tuple(window))


def check_out(out, q: torch.Tensor, inputs=()) -> None:
    """out's type, shape, device and strides; inputs: (name, tensor) of every tensor the kernel reads, none of
    which out may overlap (the kernel would overwrite what other workgroups still read)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None; got {type(out).__name__}")
    if out.dtype != torch.bfloat16:
        raise TypeError(f"out.dtype={out.dtype} is not supported; accepted: torch.bfloat16")
    if tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"out.shape={tuple(out.shape)} is not supported; accepted: q's shape {tuple(q.shape)}")
    if out.device != q.device:
        raise ValueError(f"out.device={out.device} is not supported; accepted: q's device {q.device}")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"out.stride(-1)={out.stride(-1)} is not supported; accepted: 1 (contiguous head dim)")
    if _self_overlapping(out):
        raise ValueError(f"out (shape {tuple(out.shape)}, strides {tuple(out.stride())}) has elements that share "
                         "memory (e.g. an expanded view); accepted: an out whose elements are distinct")
    if _has_storage(out):  # fake tensors (tracing) have no addresses: checked at run time
        for name, t in inputs:
            if _spans_overlap(out, t):
                raise ValueError(f"out overlaps {name} in memory (out bytes {_span(out)}, {name} bytes {_span(t)}); "
                                 f"accepted: an out that shares no memory with any input "
                                 f"({', '.join(n for n, _ in inputs)})")


def _has_storage(t: torch.Tensor) -> bool:
    """Plain tensors only: fake and other subclass tensors (tracing) have no addresses to compare."""
    return type(t) is torch.Tensor


def _self_overlapping(t: torch.Tensor) -> bool:
    """Whether two index tuples reach one element: dims sorted by stride must each step past all the
    smaller ones (the usual non-overlap rule; a stride-0 dim of size > 1 fails it)."""
    extent = 0
    for size, stride in sorted(((n, abs(st)) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda x: x[1]):
        if stride <= extent:
            return True
        extent += (size - 1) * stride
    return False


def _span(t: torch.Tensor) -> tuple:
    """[first byte, last byte] a strided view reaches."""
    lo = hi = t.data_ptr()
    for n, st in zip(t.shape, t.stride()):
        step = (n - 1) * st * t.element_size()
        if step > 0:
            hi += step
        else:
            lo += step
    return lo, hi + t.element_size() - 1


def _spans_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    return alo <= bhi and blo <= ahi


def check_how_v3_bf16_cvt(how_v3_bf16_cvt) -> str:
    """AITER's rounding selector -> our round_mode name."""
    if type(how_v3_bf16_cvt) is not int or how_v3_bf16_cvt not in HOW_V3_BF16_CVT:
        raise ValueError(f"how_v3_bf16_cvt={how_v3_bf16_cvt!r} is not supported; accepted: "
                         "0 (RTNE), 1 (RTNA), 2 (RTZ)")
    return HOW_V3_BF16_CVT[how_v3_bf16_cvt]
