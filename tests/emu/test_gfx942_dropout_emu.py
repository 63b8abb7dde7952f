"""Dropout on the gfx942 prefill kernel (the dropout axis, forward), on the wave emulator: its keep mask bit for bit
against the host's Philox4x32-10 (dropout.dense_keep_mask, dropout.keep_mask per packed sequence), its output against
the fp64 references with the same mask, the gradients of the backward that follows it, and gfx942 / gfx90a emulation
giving the same bits (docs/numerics.md, "Dropout")."""
import pytest
import torch

from rtcattn.ops.attention_bwd import reference as bref
from rtcattn.ops.attention_fwd import dropout, reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

KERNEL = "gfx942"
BF = torch.bfloat16
RNG = torch.tensor([0x1234_5678_9ABC_DEF0 - 2**63, 2**40 + 7], dtype=torch.int64)


@pytest.fixture(autouse=True)
def gfx942(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def _rand(shape, seed, scale=1.0, dtype=BF):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _identity_v(rows, hk, d, dtype=BF):
    """V = identity (D = Sk): O_ij = P_ij Z_ij / l_i, nonzero exactly where key j is seen and kept (the scores are
    small, so every seen P_ij > 0)."""
    return torch.eye(d, dtype=dtype)[:rows][:, None, :].expand(rows, hk, d)


def _kernel_mask(p, rng_state, b, hq, hk, sq, sk, causal, tail_split=0):
    """The gfx942 kernel's keep mask [B, Hq, Sq, Sk] of a dense call, read through V = identity."""
    q, k = _rand((b, sq, hq, sk), 1, 0.3), _rand((b, sk, hk, sk), 2, 0.3)
    v = _identity_v(sk, hk, sk)[None].expand(b, sk, hk, sk).contiguous()
    with dispatch.pinned(kernel=KERNEL, tail_split=tail_split):
        out = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, False, -1, 0 if causal else -1, False,
                                    dropout_p=p, rng_state=rng_state)[0]
    return out.float().permute(0, 2, 1, 3) != 0


@pytest.mark.parametrize("p, sq, sk, causal, tail_split", [
    (0.3, 37, 64, False, 0),
    (0.5, 200, 128, True, 0),
    (0.9, 37, 128, False, 2),     # a tail split: the KV blocks in two workgroups, merged after
    (0.2, 21, 192, True, 0),      # bucket 192: the draws inside the softmax (mainloop.h, kDrawTileFirst)
])
def test_kernel_mask_is_the_host_philox_bit_for_bit(p, sq, sk, causal, tail_split):
    """Every lane's draws (rows past a 16-row group, both key halves of each sub-tile, every KV block) against
    dense_keep_mask, in both of the kernel's forms (buckets 64 and 128: drawn before a tile's softmax; 192: inside
    it); under the causal mask the keys a row sees, and zeros elsewhere."""
    b, hq, hk = 2, 3, 1
    got = _kernel_mask(p, RNG, b, hq, hk, sq, sk, causal, tail_split)
    want = dropout.dense_keep_mask(RNG, p, b, hq, sq, sk)
    seen = ref.visible(sq, sk, (-1, 0) if causal else (-1, -1))  # causal 200 x 128: rows 0 .. 71 see no key
    assert torch.equal(got & seen, want & seen), f"{int(((got != want) & seen).sum())} of {int(seen.sum()) * b * hq}"
    assert not bool((got & ~seen).any())


def test_packed_mask_is_each_sequences():
    """Packed sequences (varlen): sequence s's mask is keep_mask(rng, p, s, ...), its rows and keys counted within
    it; a sequence without keys writes zeros."""
    lens_q, lens_k, hq, d, p = (5, 19, 0, 40), (64, 3, 20, 50), 2, 64, 0.4
    q, k = _rand((sum(lens_q), hq, d), 3, 0.3), _rand((sum(lens_k), 1, d), 4, 0.3)
    v = torch.cat([_identity_v(n, 1, d) for n in lens_k]).contiguous()
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
                  for lens in (lens_q, lens_k))
    with dispatch.pinned(kernel=KERNEL):
        out = torch.ops.rtcattn.fwd_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), "rtne", None, False, -1,
                                           -1, dropout_p=p, rng_state=RNG)[0]
    oq = 0
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        got = out[oq:oq + lq, :, :lk].float().permute(1, 0, 2) != 0
        assert torch.equal(got, dropout.keep_mask(RNG, p, s, hq, lq, lk)), s
        assert not bool(out[oq:oq + lq, :, lk:].any()), s
        oq += lq


@pytest.mark.parametrize("window, dtype", [((-1, -1), torch.bfloat16), ((-1, 0), torch.float16)])
def test_forward_against_fp64_with_the_same_mask(window, dtype):
    """O = (P Z) V with Z = keep / (1 - p), the LSE the undropped softmax's, within the contract's rule against
    reference_fp64 / reference_r of the same mask; GQA, causal and not, both dtypes."""
    b, sq, sk, hq, hk, d, p = 2, 29, 100, 4, 2, 64, 0.3
    q, k, v = _rand((b, sq, hq, d), 3, 1.5, dtype), _rand((b, sk, hk, d), 4, 1.5, dtype), _rand((b, sk, hk, d), 5,
                                                                                                   dtype=dtype)
    with dispatch.pinned(kernel=KERNEL):
        out, lse = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True, *window, False, dropout_p=p,
                                         rng_state=RNG)
    drop = dict(dropout_p=p, rng_state=RNG)
    o64, l64 = ref.reference_fp64(q, k, v, "bshd", None, window, **drop)
    r = ref.reference_r(q, k, v, "bshd", "rtne", None, window, **drop)
    err, err_r = ref.errors(out, o64)[0], ref.errors(r, o64)[0]
    assert err <= 2 * err_r + 1e-5 and bool(ref.lse_close(lse, l64).all()), (window, err, err_r)
    with dispatch.pinned(kernel=KERNEL):
        plain = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True, *window, False)
    assert torch.equal(lse.view(torch.int32), plain[1].view(torch.int32))  # the LSE sees every element


def test_backward_of_a_gfx942_dropout_forward():
    """The gradients after a gfx942 dropout forward (the backward, whichever kernel runs it, regenerates the forward's
    mask from the same state) within the rule."""
    b, sq, sk, hq, hk, d, p, window = 1, 21, 70, 2, 1, 64, 0.25, (-1, 0)
    q, k, v, dout = _rand((b, sq, hq, d), 6, 1.5), _rand((b, sk, hk, d), 7, 1.5), _rand((b, sk, hk, d), 8), \
        _rand((b, sq, hq, d), 9)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with dispatch.pinned(kernel=KERNEL):
        out, lse = torch.ops.rtcattn.fwd(qg, kg, vg, "bshd", "rtne", None, True, *window, False, dropout_p=p,
                                         rng_state=RNG)
    out.backward(dout)
    drop = dict(dropout_p=p, rng_state=RNG)
    g64 = bref.grads_fp64(q, k, v, dout, "bshd", None, window, None, **drop)
    gr = bref.grads_r(q, k, v, out.detach(), lse.detach(), dout, "bshd", "rtne", None, window, None, **drop)
    for n, g, xr, x64 in zip("qkv", (qg.grad, kg.grad, vg.grad), gr, g64):
        ok, e, e_r = bref.within_rule(g, xr, x64)
        assert ok, f"d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"


def test_gfx942_and_gfx90a_agree_bit_for_bit(monkeypatch):
    q, k, v = _rand((1, 45, 2, 128), 10), _rand((1, 140, 2, 128), 11), _rand((1, 140, 2, 128), 12)
    outs = []
    for arch in ("gfx942", "gfx90a"):
        monkeypatch.setenv("RTCATTN_EMULATE", arch)
        with dispatch.pinned(kernel=KERNEL):
            outs.append(torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True, -1, 0, False, dropout_p=0.2,
                                              rng_state=RNG))
    assert torch.equal(outs[0][0].view(torch.int16), outs[1][0].view(torch.int16))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))
