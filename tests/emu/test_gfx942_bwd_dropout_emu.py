"""Dropout in the gfx942 backward kernel (attention_bwd's dropout axis), on the wave emulator: the keep bits each lane
takes from its block's Philox calls (gfx942.hip, DropKeep) against the host's Philox4x32-10 (dropout.dense_keep_mask),
read through dV (dK / dV stage) and dQ (dQ stage); the gradients against the fp64 references with the same mask
(docs/numerics.md, "Dropout"): GQA, causal and not, score modifications, packed sequences, bf16 and fp16; gfx942 and
gfx90a emulation giving the same bits. The forward runs on the baseline kernel (its dropout is tested in
test_dropout_emu.py), the backward pinned to the gfx942 kernel."""
import pytest
import torch

import score_mod_suite as sms
from rtcattn.ops.attention_bwd import reference as bref
from rtcattn.ops.attention_fwd import dropout, reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

BF = torch.bfloat16
RNG = torch.tensor([0x0F1E_2D3C_4B5A_6978 - 2**63, 2**33 + 5], dtype=torch.int64)


@pytest.fixture(autouse=True)
def gfx942(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def _rand(shape, seed, scale=1.0, dtype=BF):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _forward(q, k, v, window, p, rng, **score):
    """(out, lse) of the dense forward with dropout, on the baseline kernel."""
    with dispatch.pinned(kernel="baseline"):
        out, lse = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True, *window, False, **score, dropout_p=p,
                                         rng_state=rng)
    return out, lse


def _backward(dout, q, k, v, out, lse, window, p, rng, **score):
    """(dq, dk, dv) of the dense backward with dropout, on the gfx942 kernel."""
    with dispatch.pinned(kernel="gfx942"):
        return torch.ops.rtcattn.bwd(dout, q, k, v, out, lse, "bshd", "rtne", None, *window, True, None, **score,
                                     dropout_p=p, rng_state=rng)


@pytest.mark.parametrize("causal", [False, True])
def test_keep_bits_are_the_host_philox_bit_for_bit(causal):
    """K's rows one-hot (D >= Sk) and dO's (D >= Sq), one head a K/V head: dV_j[i] = round(P_ij Z_ij), nonzero exactly
    where pair (i, j) is seen and kept (the DKDV stage's bits, every lane's four rows of its key), and dQ_i[j] =
    scale round(dS_ij), dS_ij = P_ij (dP_ij Z_ij - delta_i), within rounding of the host's dS with the host's mask
    where the two values of Z_ij differ enough to tell (the DQ stage's bits, every lane's four keys of its row).
    37 rows and 45 keys: partial tiles, rows and keys in both halves of their 16-groups, a dK / dV block's second
    wave; two batch rows and heads (the counter's last word)."""
    b, h, sq, sk, d, p = 2, 2, 37, 45, 64, 0.4
    window = (-1, 0) if causal else (-1, -1)
    q = _rand((b, sq, h, d), 1, 0.5)
    k = torch.eye(d, dtype=BF)[:sk][None, :, None, :].expand(b, sk, h, d).contiguous()
    v = _rand((b, sk, h, d), 2)
    dout = torch.eye(d, dtype=BF)[:sq][None, :, None, :].expand(b, sq, h, d).contiguous()
    out, lse = _forward(q, k, v, window, p, RNG)
    dq, dk, dv = _backward(dout, q, k, v, out, lse, window, p, RNG)
    keep = dropout.dense_keep_mask(RNG, p, b, h, sq, sk)
    seen = ref.visible(sq, sk, window)
    got = dv.float().permute(0, 2, 3, 1)[:, :, :sq, :] != 0  # [B, H, i, j]
    assert torch.equal(got, keep & seen), f"dV: {int((got != (keep & seen)).sum())} of {got.numel()} differ"
    # dS in fp64 from the call's own out and lse (the kernel recomputes P from lse, delta from out)
    scale = d**-0.5
    s = (q.double().permute(0, 2, 1, 3) @ k.double().permute(0, 2, 3, 1)) * scale
    pr = torch.exp(s - lse.double()[..., None]).masked_fill(~seen, 0.0)
    dp = dout.double().permute(0, 2, 1, 3) @ v.double().permute(0, 2, 3, 1)
    delta = (dout.double() * out.double()).sum(-1).permute(0, 2, 1)[..., None]
    z = keep.double() / (1 - p)
    ds = pr * (dp * z - delta)
    ds_flipped = pr * (dp * (1.0 / (1 - p) - z) - delta)
    got_ds = dq.double().permute(0, 2, 1, 3)[..., :sk] / scale
    tol = 0.02 * ds.abs() + 1e-3 * pr
    telling = (ds - ds_flipped).abs() > 4 * tol
    assert int(telling.sum()) > got_ds.numel() // 4
    assert bool(((got_ds - ds).abs() <= tol).all()), f"dQ: max |dS - host| {(got_ds - ds).abs().max():.3g}"
    assert not bool(((got_ds - ds_flipped).abs() <= tol)[telling].any())


def test_gradients_against_fp64_with_the_same_mask():
    """The gradients within the contract's rules against the fp64 references with the same mask: GQA, causal and
    not, bf16 without score modifications, fp16 with a soft cap and ALiBi."""
    b, sq, sk, hq, hk, d, p = 2, 29, 45, 4, 2, 64, 0.3
    for window, cap, slopes, dtype in (((-1, -1), 0.0, None, BF),
                                       ((-1, 0), 1.5, sms.slopes("batch", b, hq, "cpu"), torch.float16)):
        q, k, v, dout = (_rand((b, sq, hq, d), 3, 1.5, dtype), _rand((b, sk, hk, d), 4, 1.5, dtype),
                         _rand((b, sk, hk, d), 5, 1.0, dtype), _rand((b, sq, hq, d), 6, 1.0, dtype))
        rng = dropout.draw_rng_state(p, q.device)
        score = dict(softcap=cap, alibi_slopes=slopes)
        out, lse = _forward(q, k, v, window, p, rng, **score)
        grads = _backward(dout, q, k, v, out, lse, window, p, rng, **score)
        drop = dict(dropout_p=p, rng_state=rng)
        g64 = bref.grads_fp64(q, k, v, dout, "bshd", None, window, None, **score, **drop)
        gr = bref.grads_r(q, k, v, out, lse, dout, "bshd", "rtne", None, window, None, **score, **drop)
        for n, g, xr, x64 in zip("qkv", grads, gr, g64):
            assert g.dtype == dtype
            ok, e, e_r = bref.within_rule(g, xr, x64)
            assert ok, f"window {window} {dtype} d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"


def test_packed_gradients_by_sequence():
    """Packed sequences (the counter's batch word is the sequence) with a causal mask, GQA, bf16: each sequence's
    gradients against the references with its own mask; an empty sequence between."""
    lens_q, lens_k, hq, hk, d, p = (7, 0, 33, 12), (20, 5, 33, 1), 4, 2, 64, 0.2
    q, k, v = _rand((sum(lens_q), hq, d), 7, 1.5), _rand((sum(lens_k), hk, d), 8, 1.5), _rand((sum(lens_k), hk, d), 9)
    dout = _rand((sum(lens_q), hq, d), 10)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
                  for lens in (lens_q, lens_k))
    rng = dropout.draw_rng_state(p, q.device)
    with dispatch.pinned(kernel="baseline"):
        out, lse = torch.ops.rtcattn.fwd_varlen(q, k, v, cu_q, cu_k, 33, 33, "rtne", None, True, -1, 0, dropout_p=p,
                                                rng_state=rng)
    with dispatch.pinned(kernel="gfx942"):
        dq, dk, dv = torch.ops.rtcattn.bwd_varlen(dout, q, k, v, out, lse, cu_q, cu_k, 33, 33, "rtne", None, -1, 0,
                                                  True, None, dropout_p=p, rng_state=rng)
    oq = ok = 0
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rq, rk = slice(oq, oq + lq), slice(ok, ok + lk)
        if lq and lk:
            one = [t[None] for t in (q[rq], k[rk], v[rk])]
            drop = dict(dropout_p=p, rng_state=rng, first_b=s)
            g64 = bref.grads_fp64(*one, dout[rq][None], "bshd", None, (-1, 0), None, **drop)
            gr = bref.grads_r(*one, out[rq][None], lse[:, rq][None], dout[rq][None], "bshd", "rtne", None, (-1, 0),
                              None, **drop)
            for n, g, xr, x64 in zip("qkv", (dq[rq], dk[rk], dv[rk]), gr, g64):
                ok_, e, e_r = bref.within_rule(g[None], xr, x64)
                assert ok_, f"sequence {s} d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"
        oq, ok = oq + lq, ok + lk


def test_gfx942_and_gfx90a_emulation_agree_bit_for_bit(monkeypatch):
    b, sq, sk, hq, hk, d, p = 1, 29, 45, 4, 2, 64, 0.25
    q, k, v, dout = _rand((b, sq, hq, d), 11), _rand((b, sk, hk, d), 12), _rand((b, sk, hk, d), 13), \
        _rand((b, sq, hq, d), 14)
    out, lse = _forward(q, k, v, (-1, 0), p, RNG)
    runs = []
    for arch in ("gfx942", "gfx90a"):
        monkeypatch.setenv("RTCATTN_EMULATE", arch)
        runs.append(_backward(dout, q, k, v, out, lse, (-1, 0), p, RNG))
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(*runs))
