"""torch schemas read off annotated Python functions, so each signature is written once.

torch.library.infer_schema does the same job but types every int as SymInt and refuses tuple
defaults (window_size=(-1, -1)); the schemas here keep plain ints and fixed-size int lists, which is
what the ops and AITER's published signatures declare."""
from __future__ import annotations

import inspect
import typing

import torch

# Annotation (as written, with `from __future__ import annotations`) -> schema type.
_TYPES = {
    "torch.Tensor": "Tensor", "torch.Tensor | None": "Tensor?", "int": "int", "int | None": "int?",
    "float": "float", "float | None": "float?", "bool": "bool", "str": "str", "str | None": "str?",
    "tuple[int, int]": "int[2]", "tuple[torch.Tensor, torch.Tensor]": "(Tensor, Tensor)",
    "tuple[torch.Tensor, torch.Tensor, torch.Tensor]": "(Tensor, Tensor, Tensor)",
    # flash-attn's cache_seqlens: an int or a tensor. The Python entries make an int a tensor before the op.
    "int | torch.Tensor | None": "Tensor?",
}


def _type(name: str, annotation) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    if text not in _TYPES:
        raise TypeError(f"parameter {name}: annotation {text!r} has no schema type; known: {', '.join(_TYPES)}")
    return _TYPES[text]


def _default(value) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, str):
        return repr(value)
    raise TypeError(f"default {value!r} has no schema literal")


def schema_of(fn: typing.Callable, name: str, mutates: tuple = (), returns: str | None = None,
              skip: tuple = ()) -> str:
    """"name(<fn's parameters>) -> <returns, or fn's return annotation>"; a parameter in mutates is written
    to (Tensor(a!), the next one Tensor(b!), ...: each its own alias set), one in skip is left out (a Python-only
    parameter)."""
    args = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip:
            continue
        t = _type(p.name, p.annotation)
        if p.name in mutates:
            if t not in ("Tensor", "Tensor?"):
                raise TypeError(f"parameter {p.name}: only a Tensor can be written to")
            t = f"Tensor({'abcdefgh'[mutates.index(p.name)]}!){t[6:]}"  # an optional one: Tensor(c!)?
        default = "" if p.default is inspect.Parameter.empty else "=" + _default(p.default)
        args.append(f"{t} {p.name}{default}")
    ret = returns or _type("return", inspect.signature(fn).return_annotation)
    return f"{name}({', '.join(args)}) -> {ret}"


def define(lib: torch.library.Library, fn: typing.Callable, mutates: tuple = (), returns: str | None = None) -> None:
    """Defines lib's op fn.__name__ with the schema of fn's annotations and registers fn as its CPU and
    CUDA kernel (ROCm tensors are "cuda" tensors to torch)."""
    lib.define(schema_of(fn, fn.__name__, mutates, returns))
    for backend in ("CPU", "CUDA"):
        lib.impl(fn.__name__, fn, backend)
