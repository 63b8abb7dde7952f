"""Argument checks every op's validate.py uses. Each error names the argument, the value and what is accepted,
and is raised before anything launches."""
from __future__ import annotations

import math

import torch

# The largest size or window the kernels take: they index with 32-bit ints. The runtime checks every
# size against it (jit/ops/<op>/op.cpp, kMaxSize); Python checks the int arguments against it before
# torch's dispatcher, whose int64 schema cannot even carry the ints past 2**63.
MAX_SIZE = 2**31 - 1

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38   # the smallest normal float32
# The kernels fold the scale into scale·log2(e) in float32 (numerics §2, §4): past this it is +Inf.
SCALE_MAX = FLOAT32_MAX / 1.4426950408889634


def check_choice(name: str, value, accepted) -> None:
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"{name}={value!r} is not supported; accepted: {', '.join(map(repr, accepted))}")


def check_int(name: str, value, lo: int, hi: int, meaning: str = "") -> int:
    """A Python int (not a bool) in lo..hi."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} is not supported; accepted: an int >= {lo} and <= {hi}{meaning}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) is not supported; accepted: True or False")
    return value


def check_type(name: str, t, optional: bool = False) -> None:
    """A torch.Tensor (or None when optional), before anything reads its attributes."""
    if not isinstance(t, torch.Tensor) and not (optional and t is None):
        raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}; got {type(t).__name__}")


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


def check_same(what: str, names, values) -> None:
    # Pairwise ==, not set(): under dynamic-shape tracing the sizes are unhashable SymInts.
    if not all(x == values[0] for x in values[1:]):
        shown = ", ".join(f"{n}={v}" for n, v in zip(names, values))
        raise ValueError(f"mismatched {what}: {shown}; accepted: equal values")


def check_tensor(name: str, t, dtypes: tuple, dims: int, shape_text: str) -> None:
    """A tensor of one of dtypes with dims dims (shape_text says which) and a contiguous last dim."""
    check_type(name, t)
    if t.dtype not in dtypes:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: {', '.join(map(str, dtypes))}")
    if t.dim() != dims:
        raise ValueError(f"{name}.ndim={t.dim()} (shape {tuple(t.shape)}) is not supported; accepted: {dims} dims, "
                         f"{shape_text}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1)={t.stride(-1)} (strides {tuple(t.stride())}): the head dim must be "
                         "contiguous; accepted: stride 1 in the last dim (e.g. call .contiguous())")


def check_same_dtype(tensors, dtypes: tuple) -> None:
    """(name, tensor) pairs that must share one dtype (of dtypes, each already checked): a mismatch names every one."""
    if any(t.dtype != tensors[0][1].dtype for _, t in tensors[1:]):
        shown = ", ".join(f"{name}.dtype={t.dtype}" for name, t in tensors)
        names = ", ".join(name for name, _ in tensors)
        raise TypeError(f"mismatched dtypes: {shown}; accepted: one dtype for all of {names} "
                        f"({' or '.join(map(str, dtypes))})")


def check_index_tensor(name: str, t, dims: int, shape_text: str, device: torch.device) -> None:
    """Metadata the kernels read (sequence offsets, block tables): int32 on the inputs' device."""
    check_type(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: torch.int32")
    if t.dim() != dims:
        raise ValueError(f"{name}.ndim={t.dim()} (shape {tuple(t.shape)}) is not supported; accepted: {shape_text}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1)={t.stride(-1)} is not supported; accepted: 1 (contiguous last dim)")
    if t.device != device:
        raise ValueError(f"{name}.device={t.device} is not supported; accepted: q's device {device}")


def check_out(out, like: torch.Tensor, dtypes: tuple, inputs=()) -> None:
    """out's type, dtype, shape (like's), device and strides; inputs: (name, tensor) of every tensor the
    kernel reads, none of which out may overlap (the kernel would overwrite what other workgroups still read)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None; got {type(out).__name__}")
    if out.dtype not in dtypes:
        raise TypeError(f"out.dtype={out.dtype} is not supported; accepted: {', '.join(map(str, dtypes))}")
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"out.shape={tuple(out.shape)} is not supported; accepted: q's shape {tuple(like.shape)}")
    if out.device != like.device:
        raise ValueError(f"out.device={out.device} is not supported; accepted: q's device {like.device}")
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
