"""Host references of the backward's numerics (docs/numerics.md, the backward), for the tests and tools:

- grads_fp64: dq, dk, dv by fp64 autograd through the forward's fp64 softmax attention (dX64);
- grads_r: the kernels' algorithm plainly in torch at their precision (dX_R): P recomputed from the forward's LSE,
  dP = dO V^T, delta = rowsum(dO o) - dlse, dS = P (dP - delta), P and dS rounded to the element type for their
  products, fp32 accumulation, the gradients rounded as stored;
- within_rule: FlashAttention's accuracy rule, max|dX - dX64| <= 2 max|dX_R - dX64| + 1e-5.
Dense tensors in `layout` ("bshd" or "bhsd"); K/V may have fewer heads than q (GQA/MQA: dK, dV summed over each K/V
head's query heads).
"""
from __future__ import annotations

import math

import torch

from ..attention_fwd.reference import (
    _kv_heads,
    default_scale,
    dropout_factor,
    from_bhsd,
    round_to,
    score_mod,
    to_bhsd,
    visible,
)


def _group_sum(g: torch.Tensor, heads_k: int) -> torch.Tensor:
    """[B, H, S, D] -> [B, Hk, S, D]: the sum over each K/V head's query heads, in head order."""
    b, h, s, d = g.shape
    return g.view(b, heads_k, h // heads_k, s, d).sum(dim=2)


def grads_fp64(q, k, v, dout, layout: str = "bshd", softmax_scale: float | None = None, window=(-1, -1), dlse=None,
               softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0, rng_state=None, first_b: int = 0):
    """(dq, dk, dv) in float64 (in `layout`) of O = softmax(scale Q K^T) V for the gradient dout of O, and dlse
    ([B, H, Sq]) of the LSE when given; rows that see no key have O = 0, LSE -inf and no gradient. softcap /
    alibi_slopes: the forward's score modifications (score_mod); dropout_p / rng_state its dropout (O = (P Z) V,
    dropout_factor)."""
    qd, kd, vd = (to_bhsd(t, layout).detach().to(torch.float64).requires_grad_() for t in (q, k, v))
    kk, vv = (_kv_heads(t, qd.shape[1]) for t in (kd, vd))
    keep = visible(qd.shape[2], kd.shape[2], window, qd.device)
    s = score_mod(qd @ kk.transpose(-1, -2) * default_scale(q.shape[-1], softmax_scale), softcap,
                  alibi_slopes).masked_fill(~keep, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key: 0
    z = dropout_factor(dropout_p, rng_state, tuple(s.shape), first_b)
    loss = ((p if z is None else p * z) @ vv * to_bhsd(dout, layout).to(torch.float64)).sum()
    if dlse is not None:
        seen = keep.any(-1).expand(s.shape[:-1])
        lse = torch.logsumexp(s.masked_fill(~seen[..., None], 0.0), dim=-1)  # no gradient through an empty row
        loss = loss + (lse * dlse.to(torch.float64) * seen).sum()
    loss.backward()
    return tuple(from_bhsd(t.grad, layout) for t in (qd, kd, vd))


def grads_r(q, k, v, out, lse, dout, layout: str, round_mode: str, softmax_scale: float | None = None,
            window=(-1, -1), dlse=None, softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0,
            rng_state=None, first_b: int = 0):
    """(dq, dk, dv) in q's dtype (in `layout`) by the kernels' algorithm in fp32 (the module's docstring); out and
    lse are the forward's (lse [B, H, Sq], natural log). With a soft cap, dS is taken through its derivative
    1 - tanh^2 before its rounding."""
    f32 = torch.float32
    qf, dof, of = (to_bhsd(t, layout).to(f32) for t in (q, dout, out))
    kf, vf = (to_bhsd(t, layout).to(f32) for t in (k, v))
    heads_k = kf.shape[1]
    kk, vv = (_kv_heads(t, qf.shape[1]) for t in (kf, vf))
    scale = default_scale(q.shape[-1], softmax_scale)
    keep = visible(qf.shape[2], kf.shape[2], window, qf.device)
    lse2 = lse.to(f32)[..., None] * 1.4426950408889634
    s = qf @ kk.transpose(-1, -2)
    seen = keep & (lse2 != -math.inf)
    t = score_mod(s * scale, softcap, alibi_slopes) * 1.4426950408889634
    p = torch.where(seen, torch.exp2(t - lse2), torch.zeros((), dtype=f32))
    delta = (dof * of).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.to(f32)[..., None]
    dp = dof @ vv.transpose(-1, -2)
    z = dropout_factor(dropout_p, rng_state, tuple(s.shape), first_b, f32)
    pz, dpz = (p, dp) if z is None else (p * z, dp * z)
    ds = torch.where(seen, p * (dpz - delta), torch.zeros((), dtype=f32))
    if softcap:
        ds = ds * (1 - torch.tanh(s * scale / softcap) ** 2)

    def rounded(x):
        return round_to(x, q.dtype, round_mode).to(f32)
    pb, dsb = rounded(pz), rounded(ds)
    dq = (dsb @ kk) * scale
    dk = _group_sum(dsb.transpose(-1, -2) @ qf, heads_k) * scale
    dv = _group_sum(pb.transpose(-1, -2) @ dof, heads_k)
    return tuple(from_bhsd(round_to(t, q.dtype, round_mode), layout) for t in (dq, dk, dv))


def within_rule(x: torch.Tensor, x_r: torch.Tensor, x64: torch.Tensor) -> tuple[bool, float, float]:
    """FlashAttention's rule for one gradient: (holds, max|x - x64|, max|x_r - x64|)."""
    err = (x.to(torch.float64) - x64).abs().max().item() if x.numel() else 0.0
    err_r = (x_r.to(torch.float64) - x64).abs().max().item() if x.numel() else 0.0
    return err <= 2 * err_r + 1e-5, err, err_r
