"""Score modifications (the soft cap and ALiBi: the manifest's score_mod axis) against the fp64 references, for any
kernel and device: forward (dense, varlen, paged, flash_attn_with_kvcache) and backward (dense, varlen), each with
the kernel pinned, so a call the kernel does not take fails instead of falling back. The rule is the numerics
contract's (docs/numerics.md, "Soft cap and ALiBi"): err <= 2 err(R) + 1e-5 against the fp64 reference of the same
modified scores, the LSE within 1e-4 max(1, |lse64|), the gradients within FlashAttention's rule."""
from __future__ import annotations

import math

import torch

import rtcattn
from numerics_suite import NORMWISE_BOUND
from rtcattn.ops.attention_bwd import reference as bref
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

# (name, softcap, slopes ("heads": [H], "batch": [B, H], None), window): each modification alone and both, with and
# without a mask. Caps near the scores' size, so that the cap bends them (tanh far from linear).
CASES = [("softcap", 0.7, None, (-1, -1)), ("softcap_causal", 1.5, None, (-1, 0)),
         ("alibi", 0.0, "heads", (-1, -1)), ("alibi_causal_batch", 0.0, "batch", (-1, 0)),
         ("both_window", 0.9, "batch", (9, 3)), ("both", 2.0, "heads", (-1, -1))]
IDS = [c[0] for c in CASES]


def slopes(kind, batch: int, heads: int, device, seed: int = 0):
    """ALiBi slopes as models use them (a geometric series per head, 2^(-8 (h + 1) / H)), times a per-row factor for
    [B, H] so that rows differ; None for kind None."""
    if kind is None:
        return None
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32)
    if kind == "heads":
        return base.to(device)
    gen = torch.Generator().manual_seed(seed)
    return (base[None] * (0.5 + torch.rand(batch, 1, generator=gen))).to(device)


def _qkv(shape_q, shape_k, device, dtype, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(shape_q, generator=gen) * scale).to(dtype).to(device)
    k, v = ((torch.randn(shape_k, generator=gen) * scale).to(dtype).to(device) for _ in range(2))
    return q, k, v


def _assert_forward(out, lse, o64, lse64, r, dtype, tag):
    err, nrm = ref.errors(out.cpu(), o64)
    err_r, _ = ref.errors(r.cpu(), o64)
    assert torch.isfinite(out.float()).all(), f"non-finite output from finite inputs: {tag}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    assert nrm < NORMWISE_BOUND[dtype] or o64.abs().max() == 0, f"normwise error {nrm:.3g}: {tag}"
    close = ref.lse_close(lse.cpu(), lse64)
    assert bool(close.all()), f"LSE off at {int((~close).sum())} rows: {tag}"
    return err


# A model's cap (Gemma 2's 50 on its attention logits) with scores as large as it: q and k scaled so that the scores
# spread over about +-40, where the cap bends them and an approximate tanh's error would show (numerics §12).
LARGE_CAP = ("softcap_large", 50.0, None, (-1, 0))
LARGE_CAP_QK = 5.0


def check_dense(kernel: str, device, case, d=64, b=2, hq=4, hk=2, sq=37, sk=53, dtype=torch.bfloat16, mode="rtne",
                layout="bshd", seed=0, qk=1.5):
    """rtcattn.forward with the case's soft cap / slopes on `kernel`, against reference_fp64 / reference_r. qk: the
    inputs' scale (the scores' spread grows with its square)."""
    name, cap, kind, window = case
    shape = (lambda s, h: (b, s, h, d)) if layout == "bshd" else (lambda s, h: (b, h, s, d))
    q, _, _ = _qkv(shape(sq, hq), shape(sk, hk), device, dtype, seed, qk)
    _, k, v = _qkv(shape(sq, hq), shape(sk, hk), device, dtype, seed + 1, qk)
    al = slopes(kind, b, hq, device, seed)
    with dispatch.pinned(kernel=kernel):
        out, lse = rtcattn.forward(q, k, v, layout=layout, round_mode=mode, window_size=window, softcap=cap,
                                   alibi_slopes=al, return_lse=True)
    score = dict(softcap=cap, alibi_slopes=al)
    o64, lse64 = (t.cpu() for t in ref.reference_fp64(q, k, v, layout, None, window, **score))
    r = ref.reference_r(q, k, v, layout, mode, None, window, **score)
    tag = f"{kernel} {name} {dtype} {layout} d={d} q={tuple(q.shape)} k={tuple(k.shape)}"
    return _assert_forward(out, lse, o64, lse64, r, dtype, tag)


def check_packed(kernel: str, device, case, d=64, lens_q=(5, 1, 40, 0, 17), lens_k=(9, 30, 40, 3, 17), hq=4, hk=1,
                 page=None, dtype=torch.bfloat16, mode="rtne", seed=0):
    """rtcattn.forward_varlen (page: a paged cache of that page size) with the case's modifications on `kernel`,
    each sequence against its own references (ALiBi's distance within the sequence, [B, H] slopes by sequence)."""
    name, cap, kind, window = case
    q, _, _ = _qkv((sum(lens_q), hq, d), (1,), device, dtype, seed, 1.5)
    _, k, v = _qkv((1,), (sum(lens_k), hk, d), device, dtype, seed + 1, 1.5)
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
          for lens in (lens_q, lens_k)]
    al = slopes(kind, len(lens_q), hq, device, seed)
    kk, vv, table, cu_k = k, v, None, cu[1]
    if page is not None:  # each sequence's keys in its own pages, in a shuffled pool
        pages = [-(-n // page) for n in lens_k]
        order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed)).tolist()
        pool = [torch.zeros((sum(pages), page, hk, d), dtype=dtype, device=device) for _ in range(2)]
        table = torch.zeros((len(lens_k), max(max(pages), 1)), dtype=torch.int32)
        at = first = 0
        for s, n in enumerate(lens_k):
            for p in range(pages[s]):
                rows = slice(first + p * page, first + min((p + 1) * page, n))
                m = rows.stop - rows.start
                pool[0][order[at], :m], pool[1][order[at], :m] = k[rows], v[rows]
                table[s, p] = order[at]
                at += 1
            first += n
        kk, vv, table = pool[0], pool[1], table.to(device)
    with dispatch.pinned(kernel=kernel):
        out, lse = rtcattn.forward_varlen(q, kk, vv, cu[0], cu_k, max(lens_q), max(lens_k), round_mode=mode,
                                          window_size=window, softcap=cap, alibi_slopes=al, return_lse=True,
                                          block_table=table)
    args = (q, k, v, cu[0].cpu(), cu[1].cpu())
    score = dict(softcap=cap, alibi_slopes=al)
    o64, lse64 = (t.cpu() for t in ref.reference_varlen(*args, None, None, window, **score))
    r = ref.reference_varlen(*args, mode, None, window, **score)
    tag = f"{kernel} {name} {dtype} d={d} lens_q={lens_q} lens_k={lens_k} page={page}"
    err = _assert_forward(out, lse, o64, lse64, r, dtype, tag)
    empty = (lse64 == -math.inf).T
    assert bool((ref.bf16_bits(out.cpu())[empty] == 0).all()), f"a row that sees no key is not +0: {tag}"
    return err


def check_kvcache(kernel: str, device, case, d=64, b=3, sq=1, hq=8, hk=2, cap_rows=80, seqlens=(0, 41, 77),
                  dtype=torch.bfloat16, mode="rtne", seed=0, paged=False):
    """flash_attn_with_kvcache (decode: sq query rows a sequence, one new key appended) with the case's
    modifications on `kernel`."""
    name, cap, kind, window = case
    q, _, _ = _qkv((b, sq, hq, d), (1,), device, dtype, seed, 1.5)
    _, kc, vc = _qkv((1,), (b, cap_rows, hk, d), device, dtype, seed + 1, 1.5)
    _, kn, vn = _qkv((1,), (b, 1, hk, d), device, dtype, seed + 2, 1.5)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    table = None
    if paged:  # pages of 16 rows, sequence s in its own pages
        page = 16
        per = cap_rows // page
        kc, vc = (t.reshape(b * per, page, hk, d).contiguous() for t in (kc, vc))
        table = torch.arange(b * per, dtype=torch.int32, device=device).reshape(b, per)
    al = slopes(kind, b, hq, device, seed)
    causal = window == (-1, 0)
    win = (-1, -1) if causal else window
    (k_ref, v_ref), _ = ref.reference_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                              window=window, softcap=cap, alibi_slopes=al)
    kc2, vc2 = kc.clone(), vc.clone()
    with dispatch.pinned(kernel=kernel):
        out, lse = rtcattn.flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=lens, block_table=table,
                                                   causal=causal, window_size=win, softcap=cap, alibi_slopes=al,
                                                   return_softmax_lse=True, how_v3_bf16_cvt=0)
    assert torch.equal(kc2.cpu(), k_ref) and torch.equal(vc2.cpu(), v_ref), "the append wrote other rows"
    score = dict(softcap=cap, alibi_slopes=al)
    _, (o64, lse64) = ref.reference_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, window=window,
                                            **score)
    _, r = ref.reference_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, window=window,
                                 round_mode=mode, **score)
    tag = f"{kernel} {name} {dtype} d={d} b={b} sq={sq} seqlens={seqlens} paged={paged}"
    return _assert_forward(out, lse, o64, lse64, r, dtype, tag)


def check_backward_dense(kernel: str, device, case, d=64, b=2, hq=4, hk=2, sq=29, sk=45, dtype=torch.bfloat16,
                         mode="rtne", seed=0, fwd_kernel=None):
    """The gradients of rtcattn.forward with the case's modifications, the backward pinned to `kernel` (the forward
    to fwd_kernel, default: dispatch's choice), within FlashAttention's rule of the fp64 gradients."""
    name, cap, kind, window = case
    q, _, _ = _qkv((b, sq, hq, d), (1,), device, dtype, seed, 1.5)
    _, k, v = _qkv((1,), (b, sk, hk, d), device, dtype, seed + 1, 1.5)
    dout = _qkv((b, sq, hq, d), (1,), device, dtype, seed + 2)[0]
    al = slopes(kind, b, hq, device, seed)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with dispatch.pinned(kernel=fwd_kernel):
        out, lse = rtcattn.forward(qg, kg, vg, round_mode=mode, window_size=window, softcap=cap, alibi_slopes=al,
                                   return_lse=True)
    with dispatch.pinned(kernel=kernel):
        dq, dk, dv = torch.ops.rtcattn.bwd(dout, q, k, v, out.detach(), lse.detach(), "bshd", mode, None, *window,
                                           True, None, softcap=cap, alibi_slopes=al)
    cpu = [t.detach().cpu() for t in (q, k, v, out, lse, dout)]
    score = dict(softcap=cap, alibi_slopes=None if al is None else al.cpu())
    g64 = bref.grads_fp64(*cpu[:3], cpu[5], "bshd", None, window, None, **score)
    gr = bref.grads_r(*cpu, "bshd", mode, None, window, None, **score)
    for g, xr, x64, n in zip((dq, dk, dv), gr, g64, "qkv"):
        ok, err, err_r = bref.within_rule(g.cpu(), xr, x64)
        assert ok, f"{kernel} {name} d{n}: max |d{n} - fp64| {err:.3g} > 2 x {err_r:.3g} + 1e-5 (R's)"
    return dq, dk, dv


def check_backward_packed(kernel: str, device, case, d=64, lens_q=(7, 0, 33, 12), lens_k=(20, 5, 33, 1), hq=4, hk=2,
                          dtype=torch.bfloat16, mode="rtne", seed=0):
    """The gradients of rtcattn.forward_varlen with the case's modifications (the backward pinned to `kernel`), each
    sequence against its own fp64 gradients."""
    name, cap, kind, window = case
    q, _, _ = _qkv((sum(lens_q), hq, d), (1,), device, dtype, seed, 1.5)
    _, k, v = _qkv((1,), (sum(lens_k), hk, d), device, dtype, seed + 1, 1.5)
    dout = _qkv((sum(lens_q), hq, d), (1,), device, dtype, seed + 2)[0]
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
          for lens in (lens_q, lens_k)]
    al = slopes(kind, len(lens_q), hq, device, seed)
    out, lse = rtcattn.forward_varlen(q, k, v, cu[0], cu[1], max(lens_q), max(lens_k), round_mode=mode,
                                      window_size=window, softcap=cap, alibi_slopes=al, return_lse=True)
    with dispatch.pinned(kernel=kernel):
        grads = torch.ops.rtcattn.bwd_varlen(dout, q, k, v, out, lse, cu[0], cu[1], max(lens_q), max(lens_k), mode,
                                             None, *window, True, None, softcap=cap, alibi_slopes=al)
    grads = [g.cpu() for g in grads]
    q, k, v, dout, out, lse = (t.cpu() for t in (q, k, v, dout, out, lse))
    oq = ok = 0
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rq, rk = slice(oq, oq + lq), slice(ok, ok + lk)
        if lq and lk:
            one = [t[None] for t in (q[rq], k[rk], v[rk], out[rq])]
            score = dict(softcap=cap, alibi_slopes=ref.sequence_slopes(None if al is None else al.cpu(), s))
            g64 = bref.grads_fp64(*one[:3], dout[rq][None], "bshd", None, window, None, **score)
            gr = bref.grads_r(*one, lse[:, rq][None], dout[rq][None], "bshd", mode, None, window, None, **score)
            for n, x, xr, x64 in zip("qkv", (grads[0][rq], grads[1][rk], grads[2][rk]), gr, g64):
                ok_, err, err_r = bref.within_rule(x[None], xr, x64)
                assert ok_, f"{kernel} {name} sequence ({lq}, {lk}) d{n}: {err:.3g} > 2 x {err_r:.3g} + 1e-5"
        oq, ok = oq + lq, ok + lk
    return grads
