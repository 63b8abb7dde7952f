"""Dropout on the baseline kernel (the dropout axis), forward and backward, on the wave emulator: the kernel's keep
mask bit for bit against the host's Philox4x32-10 (dropout.keep_mask), the keep rate, the output and gradients
against the fp64 references with the same mask (docs/numerics.md, "Dropout"), seeding, S_dmask, bad input."""
import math

import pytest
import torch

import rtcattn
import score_mod_suite as sms
from rtcattn.ops.attention_bwd import reference as bref
from rtcattn.ops.attention_fwd import dropout, reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

KERNEL = "baseline"
BF = torch.bfloat16


@pytest.fixture(autouse=True)
def gfx942(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def _rand(shape, seed, scale=1.0, dtype=BF):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _kernel_mask(p, rng_state, b=3, hq=4, hk=2, sq=37, sk=64, dtype=BF, causal=False):
    """The kernel's keep mask [B, Hq, Sq, Sk], read through V = identity (D = Sk): O_ij = P_ij Z_ij / l_i, nonzero
    exactly where the element is kept (the scores are small, so every P_ij > 0)."""
    q, k = _rand((b, sq, hq, sk), 1, 0.3, dtype), _rand((b, sk, hk, sk), 2, 0.3, dtype)
    v = torch.eye(sk, dtype=dtype)[None, :, None, :].expand(b, sk, hk, sk).contiguous()
    with dispatch.pinned(kernel=KERNEL):
        out = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, False, -1, 0 if causal else -1, False,
                                    dropout_p=p, rng_state=rng_state)[0]
    return out.float().permute(0, 2, 1, 3) != 0


def test_host_philox_matches_random123_known_answers():
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        assert tuple(int(x) for x in dropout.philox4x32_10(*ctr, *key)) == want


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kernel_mask_is_the_host_philox_bit_for_bit(p):
    rng = torch.tensor([0x1234_5678_9ABC_DEF0 - 2**63, 2**40 + 7], dtype=torch.int64)
    got = _kernel_mask(p, rng)
    want = dropout.dense_keep_mask(rng, p, *got.shape)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} differ"


def test_keep_rate_within_four_sigma():
    """The host mask over 10^6 elements (the kernel's, bit for bit above) keeps 1 - p within 4 sigma, at several p."""
    rng = torch.tensor([987654321, 123456789], dtype=torch.int64)
    for p in (0.1, 0.25, 0.5, 0.77):
        keep = dropout.keep_mask(rng, p, 5, 16, 250, 250)
        n = keep.numel()
        sigma = math.sqrt(p * (1 - p) / n)
        assert n >= 10**6 and abs(keep.double().mean().item() - (1 - p)) < 4 * sigma, (p, keep.double().mean())


def test_forward_and_backward_against_fp64_with_the_same_mask():
    """O = (P Z) V with Z = keep / (1 - p), and its gradients, within the contract's rules; GQA, causal and
    not, a soft cap and ALiBi with it."""
    b, sq, sk, hq, hk, d, p = 2, 29, 45, 4, 2, 64, 0.3
    for window, cap, slopes in (((-1, -1), 0.0, None), ((-1, 0), 1.5, sms.slopes("batch", b, hq, "cpu"))):
        q, k, v, dout = _rand((b, sq, hq, d), 3, 1.5), _rand((b, sk, hk, d), 4, 1.5), _rand((b, sk, hk, d), 5), \
            _rand((b, sq, hq, d), 6)
        rng = dropout.draw_rng_state(p, q.device)
        score = dict(softcap=cap, alibi_slopes=slopes)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        with dispatch.pinned(kernel=KERNEL):
            out, lse = torch.ops.rtcattn.fwd(qg, kg, vg, "bshd", "rtne", None, True, *window, False, **score,
                                             dropout_p=p, rng_state=rng)
            out.backward(dout)
        drop = dict(dropout_p=p, rng_state=rng)
        o64, l64 = ref.reference_fp64(q, k, v, "bshd", None, window, **score, **drop)
        r = ref.reference_r(q, k, v, "bshd", "rtne", None, window, **score, **drop)
        err, err_r = ref.errors(out.detach(), o64)[0], ref.errors(r, o64)[0]
        assert err <= 2 * err_r + 1e-5 and bool(ref.lse_close(lse.detach(), l64).all()), (window, err, err_r)
        g64 = bref.grads_fp64(q, k, v, dout, "bshd", None, window, None, **score, **drop)
        gr = bref.grads_r(q, k, v, out.detach(), lse.detach(), dout, "bshd", "rtne", None, window, None, **score,
                          **drop)
        for n, g, xr, x64 in zip("qkv", (qg.grad, kg.grad, vg.grad), gr, g64):
            ok, e, e_r = bref.within_rule(g, xr, x64)
            assert ok, f"window {window} d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"


def test_packed_forward_and_backward_by_sequence():
    lens_q, lens_k, hq, d, p = (7, 0, 33, 12), (20, 5, 33, 1), 4, 64, 0.2
    q, k, v = _rand((sum(lens_q), hq, d), 7, 1.5), _rand((sum(lens_k), 2, d), 8, 1.5), _rand((sum(lens_k), 2, d), 9)
    dout = _rand((sum(lens_q), hq, d), 10)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
                  for lens in (lens_q, lens_k))
    rng = dropout.draw_rng_state(p, q.device)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with dispatch.pinned(kernel=KERNEL):
        out, lse = torch.ops.rtcattn.fwd_varlen(qg, kg, vg, cu_q, cu_k, 33, 33, "rtne", None, True, -1, 0,
                                                dropout_p=p, rng_state=rng)
        out.backward(dout)
    o64, l64 = ref.reference_varlen(q, k, v, cu_q, cu_k, None, None, (-1, 0), dropout_p=p, rng_state=rng)
    r = ref.reference_varlen(q, k, v, cu_q, cu_k, "rtne", None, (-1, 0), dropout_p=p, rng_state=rng)
    assert ref.errors(out.detach(), o64)[0] <= 2 * ref.errors(r, o64)[0] + 1e-5
    oq = ok = 0
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rq, rk = slice(oq, oq + lq), slice(ok, ok + lk)
        if lq and lk:
            one = [t[None] for t in (q[rq], k[rk], v[rk])]
            drop = dict(dropout_p=p, rng_state=rng, first_b=s)
            g64 = bref.grads_fp64(*one, dout[rq][None], "bshd", None, (-1, 0), None, **drop)
            gr = bref.grads_r(*one, out.detach()[rq][None], lse.detach()[:, rq][None], dout[rq][None], "bshd", "rtne",
                              None, (-1, 0), None, **drop)
            for n, g, xr, x64 in zip("qkv", (qg.grad[rq], kg.grad[rk], vg.grad[rk]), gr, g64):
                ok_, e, e_r = bref.within_rule(g[None], xr, x64)
                assert ok_, f"sequence {s} d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"
        oq, ok = oq + lq, ok + lk


def test_seeding_repeats_and_each_call_draws_a_new_mask():
    q, k, v = _rand((2, 33, 4, 64), 11), _rand((2, 33, 4, 64), 12), _rand((2, 33, 4, 64), 13)
    with dispatch.pinned(kernel=KERNEL):
        torch.manual_seed(5)
        a = rtcattn.forward(q, k, v, dropout_p=0.4)
        b = rtcattn.forward(q, k, v, dropout_p=0.4)
        torch.manual_seed(5)
        c = rtcattn.forward(q, k, v, dropout_p=0.4)
        plain = rtcattn.forward(q, k, v)
    assert torch.equal(a.view(torch.int16), c.view(torch.int16))
    assert not torch.equal(a, b) and not torch.equal(a, plain)


def test_s_dmask_signs_are_the_mask_and_abs_the_probabilities():
    q, k, v = _rand((2, 21, 4, 64), 14), _rand((2, 30, 4, 64), 15), _rand((2, 30, 4, 64), 16)
    torch.manual_seed(9)
    with dispatch.pinned(kernel=KERNEL):
        out, lse, probs = rtcattn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_lse=True,
                                                  return_attn_probs=True)
    torch.manual_seed(9)
    rng = dropout.draw_rng_state(0.3, q.device)
    keep = dropout.dense_keep_mask(rng, 0.3, 2, 4, 21, 30)
    seen = ref.visible(21, 30, (-1, 0))
    assert probs.shape == (2, 4, 21, 30) and probs.dtype == torch.float32
    assert torch.equal((probs >= 0) | ~seen, keep | ~seen)           # the sign marks the dropped ones
    o64, _ = ref.reference_fp64(q, k, v, "bshd", None, (-1, 0))
    p64 = torch.softmax((ref.to_bhsd(q, "bshd").double() @ ref.to_bhsd(k, "bshd").double().transpose(-1, -2)
                         / 8.0).masked_fill(~seen, -math.inf), -1)
    assert (probs.abs().double() - p64).abs().max() < 1e-5
    with dispatch.pinned(kernel=KERNEL):
        cu = torch.tensor([0, 21], dtype=torch.int32)
        cuk = torch.tensor([0, 30], dtype=torch.int32)
        _, pv = rtcattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cuk, 21, 30, dropout_p=0.0, causal=True,
                                               return_attn_probs=True)
    assert pv.shape == (1, 4, 21, 30) and bool((pv >= 0).all()) and (pv.double() - p64[:1]).abs().max() < 1e-5


@pytest.mark.parametrize("p, err, match", [
    (1.0, ValueError, r"dropout_p=1.0 is not supported; accepted: a float in \[0, 1\)"),
    (-0.1, ValueError, r"dropout_p=-0.1 is not supported"),
    (math.nan, ValueError, r"dropout_p=nan is not supported"),
    (True, TypeError, r"dropout_p=True \(bool\) is not supported"),
])
def test_bad_dropout_p_is_refused(p, err, match):
    q = torch.zeros(1, 4, 2, 64, dtype=BF)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    for call in (lambda: rtcattn.forward(q, q, q, dropout_p=p), lambda: rtcattn.flash_attn_func(q, q, q, p),
                 lambda: rtcattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 4, 4, dropout_p=p)):
        with pytest.raises(err, match=match):
            call()


def test_the_op_refuses_a_state_without_dropout_and_dropout_without_a_state():
    q = torch.zeros(1, 4, 2, 64, dtype=BF)
    with pytest.raises(ValueError, match=r"rng_state=None with dropout_p=0.5 is not supported"):
        torch.ops.rtcattn.fwd(q, q, q, "bshd", "rtne", None, False, dropout_p=0.5)
    with pytest.raises(ValueError, match=r"rng_state is set with dropout_p=0.0"):
        torch.ops.rtcattn.fwd(q, q, q, "bshd", "rtne", None, False, rng_state=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"rng_state \(shape \(3,\), torch.int64, cpu\) is not supported"):
        torch.ops.rtcattn.fwd(q, q, q, "bshd", "rtne", None, False, dropout_p=0.5,
                              rng_state=torch.zeros(3, dtype=torch.int64))
