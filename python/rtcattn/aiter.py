"""Registers rtcattn as AITER ops: torch.ops.aiter.rtcattn_fwd / rtcattn_varlen_fwd and aiter.rtcattn_fwd /
aiter.rtcattn_varlen_fwd, with flash_attn_func's and flash_attn_varlen_func's signatures.

Each op's parameter list is the one of rtcattn.flash_attn_func / flash_attn_varlen_func (api.py, amd-aiter
0.1.7's order): the schemas are read off those signatures, and the functions set on `aiter` bind their
arguments to them."""
from __future__ import annotations

import importlib
import inspect
import threading

import torch

from . import api, ops  # noqa: F401  (ops registers torch.ops.rtcattn.*, which the aiter op decomposes to)
from .ops import schema

# AITER op name -> the rtcattn function whose signature and behaviour it has.
ENTRIES = {"rtcattn_fwd": api.flash_attn_func, "rtcattn_varlen_fwd": api.flash_attn_varlen_func,
           "rtcattn_kvcache_fwd": api.flash_attn_with_kvcache}
OP_NAME, VARLEN_OP_NAME, KVCACHE_OP_NAME = ENTRIES
# What each op writes in place (flash_attn_with_kvcache appends to the caches).
WRITES = {KVCACHE_OP_NAME: ("k_cache", "v_cache", "k_scale", "v_scale")}  # an FP4 cache's scales too
# Always (out, lse), so the schema has one return type; lse is empty [0] unless asked for.
SCHEMAS = {name: schema.schema_of(fn, name, WRITES.get(name, ()), returns="(Tensor, Tensor)")
           for name, fn in ENTRIES.items()}


def _lse_flag(a: dict) -> bool:
    """Whether the call asked for the LSE: flash-attn's kvcache entry names it return_softmax_lse."""
    return a["return_softmax_lse"] if "return_softmax_lse" in a else a["return_lse"]

_lock = threading.Lock()
_fragment = None  # kept alive: a torch Library object unregisters its ops when collected


def _op_impl(fn):
    """The op's composite kernel: fn on the schema's arguments, returning (out, lse). The dispatcher may pass fn's
    keyword-only parameters by position (the schema has them in fn's order), so they bind by position here."""
    sig = inspect.signature(fn)
    sig = sig.replace(parameters=[p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                  for p in sig.parameters.values()])

    def impl(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        a["window_size"] = tuple(a["window_size"])
        # With out= given the schema still returns a new tensor (an alias would need an alias annotation
        # AITER's schema does not have): a copy of out.
        out = a.pop("out", None)
        res = fn(**a)
        o, lse = res if _lse_flag(a) else (res, res.new_empty((0,), dtype=torch.float32))
        if out is not None:
            out.copy_(o)
        return o, lse
    return impl


def _entry(name: str, fn):
    """aiter.<name>: fn's signature and return convention (out, or (out, lse)), through torch.ops.aiter.<name>.

    The scalars are checked before the op: torch's dispatcher refuses an int past 64 bits without naming
    the accepted range."""
    sig = inspect.signature(fn)
    scalars = inspect.signature(api.check_scalars).parameters

    def call(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        api.check_scalars(**{k: a[k] for k in scalars if k in a})
        a["window_size"] = list(a["window_size"])
        if "cache_seqlens" in a:  # an int becomes the tensor the schema takes
            a["cache_seqlens"] = api._seqlens_tensor(a["cache_seqlens"], a["q"], a["k_cache"], a["k"], a["block_table"],
                                                     a["kv_cache_dtype"])
        o, lse = getattr(torch.ops.aiter, name)(*bound.args, **bound.kwargs)
        if a.get("out") is not None:
            o = a["out"]
        return (o, lse) if _lse_flag(a) else o
    call.__name__ = call.__qualname__ = name
    call.__signature__ = sig
    call.__doc__ = f"aiter.{name}: {fn.__name__}'s signature and return convention (out, or (out, lse))."
    return call


rtcattn_fwd = _entry(OP_NAME, api.flash_attn_func)
rtcattn_varlen_fwd = _entry(VARLEN_OP_NAME, api.flash_attn_varlen_func)
rtcattn_kvcache_fwd = _entry(KVCACHE_OP_NAME, api.flash_attn_with_kvcache)


def _import_aiter():
    try:
        return importlib.import_module("aiter")
    except Exception as e:  # aiter raises RuntimeError, not ImportError, on machines without ROCm
        raise ImportError(f"rtcattn.aiter.register() needs AITER (the 'aiter' module, pip package "
                          f"amd-aiter), which cannot be imported: {type(e).__name__}: {e}") from e


def register():
    """Defines aiter::rtcattn_fwd and aiter::rtcattn_varlen_fwd in the "aiter" torch library fragment and sets
    aiter.rtcattn_fwd / aiter.rtcattn_varlen_fwd (idempotent). Returns aiter.rtcattn_fwd."""
    global _fragment
    module = _import_aiter()
    with _lock:
        if not hasattr(torch.ops.aiter, OP_NAME):
            frag = torch.library.Library("aiter", "FRAGMENT")
            for name, fn in ENTRIES.items():
                frag.define(SCHEMAS[name])
                # Composite: under tracing it decomposes to torch.ops.rtcattn.*, whose fakes give shapes.
                frag.impl(name, _op_impl(fn), "CompositeImplicitAutograd")
            _fragment = frag
        module.rtcattn_fwd = rtcattn_fwd
        module.rtcattn_varlen_fwd = rtcattn_varlen_fwd
        module.rtcattn_kvcache_fwd = rtcattn_kvcache_fwd
    return module.rtcattn_fwd
