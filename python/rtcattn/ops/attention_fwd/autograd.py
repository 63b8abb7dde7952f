"""The forward ops' backward: torch.ops.rtcattn.fwd and fwd_varlen save their inputs, output and LSE, and their
backward calls torch.ops.rtcattn.bwd / bwd_varlen (ops/attention_bwd). Registered through ops/backward.py.

A call that did not return its LSE (return_lse False: the op's LSE output is empty) gets it in the backward from the
same forward call again (bit-identical: the kernels are deterministic); the public functions ask for it when an input
requires grad (api.py), so that costs nothing there. The LSE's own gradient, when the caller used the LSE, joins the
backward (dlse). A paged or quantized cache, or seqused_k, takes no gradients: its backward raises, naming it.
The forward ops' `deterministic` is the backward's: False lets a kernel add dQ up in fp32 with atomics in any order
(the sm90 kernel's fused dQ: the gradients' bits may differ run to run), True asks for the same bits every run.
"""
from __future__ import annotations

import torch


def _save(ctx, inputs, output, names) -> None:
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = dict(zip(names, inputs[3:]))


def _dout(grad_out, out):
    """The gradient of out as the backward takes it: a contiguous tensor (autograd may hand an expanded one, or
    None when only the LSE was used)."""
    return torch.zeros_like(out) if grad_out is None else grad_out.contiguous()


def _dlse(grad_lse, return_lse: bool):
    return grad_lse.contiguous() if return_lse and grad_lse is not None and grad_lse.numel() else None


_FWD_ARGS = ("layout", "round_mode", "softmax_scale", "return_lse", "window_left", "window_right", "deterministic",
             "softcap", "alibi_slopes", "dropout_p", "rng_state")


def fwd_setup(ctx, inputs, output):
    _save(ctx, inputs, output, _FWD_ARGS)


def fwd_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    a = ctx.args
    call = (a["layout"], a["round_mode"], a["softmax_scale"])
    window = (a["window_left"], a["window_right"])
    score = dict(softcap=a["softcap"], alibi_slopes=a["alibi_slopes"], dropout_p=a["dropout_p"],
                 rng_state=a["rng_state"])
    if not a["return_lse"]:
        with torch.no_grad():
            out, lse = torch.ops.rtcattn.fwd(q, k, v, *call, True, *window, **score)
    grads = torch.ops.rtcattn.bwd(_dout(grad_out, out), q, k, v, out, lse, *call, *window, a["deterministic"],
                                  _dlse(grad_lse, a["return_lse"]), **score)
    return (*grads, *(None,) * len(_FWD_ARGS))


_VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "round_mode", "softmax_scale",
                "return_lse", "window_left", "window_right", "block_table", "seqused_k", "k_descale", "v_descale",
                "k_scale", "v_scale", "kv_cache_dtype", "deterministic", "softcap", "alibi_slopes", "dropout_p",
                "rng_state")
# The packed call's arguments that take no gradients, and what the backward accepts instead.
_NO_GRAD = {"block_table": "None (a paged cache takes no gradients)",
            "seqused_k": "None (each sequence's keys from cu_seqlens_k)",
            "k_descale": "None (a quantized cache takes no gradients)",
            "v_descale": "None (a quantized cache takes no gradients)",
            "k_scale": "None (a quantized cache takes no gradients)",
            "v_scale": "None (a quantized cache takes no gradients)"}


def fwd_varlen_setup(ctx, inputs, output):
    _save(ctx, inputs, output, _VARLEN_ARGS)


def fwd_varlen_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    a = ctx.args
    for name, accepted in _NO_GRAD.items():
        if a[name] is not None:
            raise NotImplementedError(f"the backward of rtcattn.forward_varlen / flash_attn_varlen_func "
                                      f"(torch.ops.rtcattn.fwd_varlen) with {name} set is not available; accepted: "
                                      f"{accepted}")
    if k.dtype != q.dtype:
        raise NotImplementedError(f"the backward of torch.ops.rtcattn.fwd_varlen with k.dtype={k.dtype} is not "
                                  "available; accepted: K / V in q's dtype (a quantized cache takes no gradients)")
    call = (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"], a["round_mode"],
            a["softmax_scale"])
    window = (a["window_left"], a["window_right"])
    score = dict(softcap=a["softcap"], alibi_slopes=a["alibi_slopes"], dropout_p=a["dropout_p"],
                 rng_state=a["rng_state"])
    if not a["return_lse"]:
        with torch.no_grad():
            out, lse = torch.ops.rtcattn.fwd_varlen(q, k, v, *call, True, *window, **score)
    grads = torch.ops.rtcattn.bwd_varlen(_dout(grad_out, out), q, k, v, out, lse, *call, *window,
                                         a["deterministic"], _dlse(grad_lse, a["return_lse"]), **score)
    return (*grads, *(None,) * len(_VARLEN_ARGS))


# The ops with a backward: op -> (setup_context, backward).
RULES = {"fwd": (fwd_setup, fwd_backward), "fwd_varlen": (fwd_varlen_setup, fwd_varlen_backward)}
