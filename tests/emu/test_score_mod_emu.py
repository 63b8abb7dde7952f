"""The soft cap and ALiBi (the score_mod axis) on the baseline kernel, forward and backward, on the wave emulator
(gfx942 and gfx90a): the numerics contract of docs/numerics.md ("Soft cap and ALiBi") against the fp64 references,
the special values, and the exact identities (zero slopes give the plain bits)."""
import pytest
import torch

import rtcattn
import score_mod_suite as sms
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

KERNEL = "baseline"
BF, FP = torch.bfloat16, torch.float16


@pytest.fixture(params=("gfx942", "gfx90a"))
def emulate(request, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", request.param)
    return request.param


@pytest.mark.parametrize("case", sms.CASES, ids=sms.IDS)
def test_dense_forward(emulate, case):
    sms.check_dense(KERNEL, "cpu", case, d=64, dtype=BF if emulate == "gfx942" else FP)


@pytest.mark.parametrize("case", sms.CASES[1::2], ids=sms.IDS[1::2])
def test_dense_forward_bhsd_rtz_and_a_padded_head_dim(monkeypatch, case):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sms.check_dense(KERNEL, "cpu", case, d=40, layout="bhsd", mode="rtz", sq=20, sk=70)


@pytest.mark.parametrize("case", sms.CASES[::2], ids=sms.IDS[::2])
@pytest.mark.parametrize("page", [None, 16], ids=["varlen", "paged"])
def test_packed_forward(monkeypatch, case, page):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sms.check_packed(KERNEL, "cpu", case, page=page)


@pytest.mark.parametrize("case", sms.CASES[3:], ids=sms.IDS[3:])
def test_kvcache_decode(monkeypatch, case):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sms.check_kvcache(KERNEL, "cpu", case, sq=2)


@pytest.mark.parametrize("case", sms.CASES, ids=sms.IDS)
def test_backward_dense(monkeypatch, case):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sms.check_backward_dense(KERNEL, "cpu", case, fwd_kernel=KERNEL)


@pytest.mark.parametrize("case", sms.CASES[1::2], ids=sms.IDS[1::2])
def test_backward_packed_fp16(monkeypatch, case):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx90a")
    sms.check_backward_packed(KERNEL, "cpu", case, dtype=FP)


def test_a_models_cap_over_large_scores(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sms.check_dense(KERNEL, "cpu", sms.LARGE_CAP, d=128, qk=sms.LARGE_CAP_QK, sq=64, sk=200)


def _qkv(b=2, s=33, h=4, d=64, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=gen).to(BF) for _ in range(3)]


def test_zero_slopes_give_the_plain_bits_and_each_modification_changes_the_output(monkeypatch):
    """-0 * |j - i| adds nothing: the ALiBi variant with zero slopes writes the plain variant's bits (another
    variant, the same function). A real cap or slope moves the output (the tests above could not pass a kernel
    that ignores them)."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, k, v = _qkv()
    with dispatch.pinned(kernel=KERNEL):
        plain, lse = rtcattn.forward(q, k, v, causal=True, return_lse=True)
        zero, lse0 = rtcattn.forward(q, k, v, causal=True, return_lse=True, alibi_slopes=torch.zeros(4))
        capped = rtcattn.forward(q, k, v, causal=True, softcap=1.0)
        sloped = rtcattn.forward(q, k, v, causal=True, alibi_slopes=torch.full((4,), 0.25))
    assert torch.equal(zero.view(torch.int16), plain.view(torch.int16)) and torch.equal(lse0, lse)
    for other in (capped, sloped):
        assert (other.float() - plain.float()).abs().max() > 0.05


def test_special_values(monkeypatch):
    """A NaN slope makes its head's rows NaN (out and LSE) and no other head's; the cap bounds every score, so a
    score of +-inf (one element of q 3e38 against +-2 in k: the fp32 product overflows) is capped to +-softcap:
    finite rows, as the fp64 reference's; softcap 0 is the plain kernel, bit for bit."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, k, v = _qkv()
    slopes = torch.tensor([0.5, float("nan"), 0.25, 0.0])
    with dispatch.pinned(kernel=KERNEL):
        out, lse = rtcattn.forward(q, k, v, alibi_slopes=slopes, return_lse=True)
    assert torch.isnan(out[:, :, 1].float()).all() and torch.isnan(lse[:, 1]).all()
    assert torch.isfinite(out[:, :, [0, 2, 3]].float()).all() and torch.isfinite(lse[:, [0, 2, 3]]).all()
    big, kk = q.clone(), k.clone()
    big[0, 5, 0, 0] = torch.tensor(3e38).to(BF)     # row 5 of head 0: scores of +-inf, as column 0 of k's signs say
    kk[..., 0] = torch.where(k[..., 0] < 0, -2.0, 2.0).to(BF)
    with dispatch.pinned(kernel=KERNEL):
        capped, lse_c = rtcattn.forward(big, kk, v, softcap=2.0, return_lse=True)
        plain = rtcattn.forward(q, k, v)
        off = rtcattn.forward(q, k, v, softcap=0.0)
    o64, l64 = ref.reference_fp64(big, kk, v, "bshd", None, (-1, -1), softcap=2.0)
    assert torch.isfinite(capped.float()).all() and torch.isfinite(o64).all()
    err, _ = ref.errors(capped, o64)
    err_r, _ = ref.errors(ref.reference_r(big, kk, v, "bshd", "rtne", None, (-1, -1), softcap=2.0), o64)
    assert err <= 2 * err_r + 1e-5 and bool(ref.lse_close(lse_c, l64).all())
    assert torch.equal(off.view(torch.int16), plain.view(torch.int16))


def test_variant_names_the_modification(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    from rtcattn.ops.attention_fwd import stub, validate
    q, k, v = _qkv()
    names = {cap_al: stub.selection(q, k, v, score=validate.ScoreMod(*cap_al)).variant["score_mod"]
             for cap_al in ((0.0, None), (3.0, None), (0.0, torch.ones(4)), (3.0, torch.ones(2, 4)))}
    assert list(names.values()) == ["plain", "softcap", "alibi", "softcap_alibi"]
