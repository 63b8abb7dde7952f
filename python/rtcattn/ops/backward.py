"""The ops' autograd. An op with a backward registers its rule (setup_context, backward: the forward ops',
attention_fwd/autograd.py); through any other op a backward raises, naming the op and the public functions that
call it, instead of leaving the inputs' .grad None.

It raises when the backward runs, not at the forward: inference code often runs on inputs that require
grad (a model's activations outside no_grad) and never calls backward. The raise is itself an op
(no_backward), so a compiled graph records it and raises when its backward runs, not while
AOTAutograd traces the backward at compile time.

The out= ops are the exception: they refuse grad at the forward (see _writing_kernel).
"""
from __future__ import annotations

import torch

_LIB = torch.library.Library("rtcattn", "FRAGMENT")  # kept alive: no_backward lives as long as this object
_LIB.define("no_backward(Tensor grad, SymInt[] q_shape, SymInt[] k_shape, SymInt[] v_shape, str op) "
            "-> (Tensor, Tensor, Tensor)")
_callers: dict = {}  # op -> the public functions that call it (register's argument), for the message


def not_available(op: str) -> str:
    """The error of a backward through an op without a backward rule."""
    return (f"{' / '.join(_callers[op])} (torch.ops.rtcattn.{op}): the backward pass is not available for this op; "
            "call it under torch.no_grad() / torch.inference_mode(), or detach the inputs")


def writes_refused(op: str, written: tuple) -> str:
    """The error of a call that writes tensors (out=, a KV cache's append) with inputs that require grad."""
    what = ("an out= call refuses inputs that require grad at the call, as torch's out= functions do; accepted: the "
            "call without out= (it has a backward)" if "out" in written else
            "a call that appends to a KV cache in place takes no gradients (a cache's attention, for inference); "
            "accepted: inputs that do not require grad")
    return (f"{' / '.join(_callers[op])} (torch.ops.rtcattn.{op}): {what}, or the call under torch.no_grad() / "
            "torch.inference_mode(), or detached inputs")


def _no_backward(grad, q_shape, k_shape, v_shape, op):
    raise NotImplementedError(not_available(op))


_LIB.impl("no_backward", _no_backward, "CompositeExplicitAutograd")


@torch.library.register_fake("rtcattn::no_backward", lib=_LIB)
def _no_backward_fake(grad, q_shape, k_shape, v_shape, op):
    return tuple(grad.new_empty(shape) for shape in (q_shape, k_shape, v_shape))


def _setup_context(ctx, inputs, output):
    ctx.qkv_shapes = tuple(t.shape for t in inputs[:3])  # every op takes q, k, v first


def _backward(op: str):
    """The backward of op: gradients for q, k, v (none for the other arguments); raises when it runs."""
    def backward(ctx, grad_out, grad_lse):
        grads = torch.ops.rtcattn.no_backward(grad_out, *ctx.qkv_shapes, op)
        return (*grads, *(None,) * (len(ctx.needs_input_grad) - 3))
    return backward


def register(lib: torch.library.Library, op: str, callers, rule=None) -> None:
    """Gives torch.ops.rtcattn.<op> (defined in lib) its autograd: rule = (setup_context, backward) when the op has
    a backward, else one that raises; callers name the op in the errors."""
    _callers[op] = tuple(callers)
    overload = getattr(torch.ops.rtcattn, op).default
    written = [i for i, a in enumerate(overload._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    if written:
        lib.impl(op, _writing_kernel(overload, op, written), "Autograd", with_keyset=True)
    elif rule is not None:
        torch.library.register_autograd(f"rtcattn::{op}", rule[1], setup_context=rule[0], lib=lib)
    else:
        torch.library.register_autograd(f"rtcattn::{op}", _backward(op), setup_context=_setup_context, lib=lib)


def _writing_kernel(overload, op: str, written):
    """The Autograd kernel of an op that writes arguments (out=): torch.library.register_autograd refuses
    such an op, and torch's own out= functions refuse autograd at the call. So does this one, when an
    argument requires grad: recording the write for a backward at .backward() time would work eagerly,
    but a compiled graph hides a write made below autograd, and `out` used after the graph would lose
    its history (silently missing gradients). Otherwise it bumps the written tensors' version, as torch's
    in-place ops do, so a backward that saved them before the write raises instead of using new values."""
    names = tuple(overload._schema.arguments[i].name for i in written)

    def kernel(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            raise NotImplementedError(writes_refused(op, names))
        # An optional written argument (an FP4 cache's scales) may be None, or left out when it has its default.
        torch.autograd.graph.increment_version([args[i] for i in written if i < len(args) and args[i] is not None])
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args)
    return kernel
