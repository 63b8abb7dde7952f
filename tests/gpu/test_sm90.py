"""GPU tests of the sm_90a attention kernel (H100/H200) through rtcattn.forward: docs/numerics.md on the product
path."""
import math

import pytest

torch = pytest.importorskip("torch")

from rtc_testing import round_modes  # noqa: E402

pytestmark = pytest.mark.gpu

SIZES = [(1, 1), (17, 17), (1, 17), (17, 1000), (1000, 17), (128, 128), (1000, 1000),
         (4096, 4096), (4096, 1), (128, 16384), (16384, 16384)]
LAYOUTS = ("bshd", "bhsd")
MODES = round_modes()


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _forward(q, k, v, layout, mode, expect="sm90"):
    """rtcattn.forward into a poisoned out (0xFFFF, a NaN nobody writes on purpose); checks which kernel ran."""
    import rtcattn
    from rtcattn.ops import attention_fwd
    from rtcattn.runtime import dispatch
    sel = attention_fwd.selection(q, k, v, layout=layout, round_mode=mode)
    seq_q = q.shape[1] if layout == "bshd" else q.shape[2]
    # Dispatch gives calls of at most 16 query rows to the decode kernel; this file tests sm90 on them too, pinned.
    assert sel.kernel.name == ("sm90_decode" if expect == "sm90" and seq_q <= 16 else expect), (sel, expect)
    out = torch.empty_like(q)
    out.view(torch.int16).fill_(-1)
    with dispatch.pinned(kernel=expect):
        o, lse = rtcattn.forward(q, k, v, layout=layout, round_mode=mode, out=out, return_lse=True)
    assert o is out
    return o, lse


@pytest.fixture(scope="module")
def kernels():
    if not _hopper():
        pytest.skip("the sm_90a kernel needs a Hopper GPU (compute capability 9.x)")
    return {m: (lambda q, k, v, layout, m=m: _forward(q, k, v, layout, m)) for m in MODES}


def _errors(o, q, k, v, layout, mode, scale):
    """(err, normwise err, err of R, lse64) against rtcattn.reference's fp64 output and R."""
    from rtcattn.ops.attention_fwd import reference
    o64, lse64 = reference.reference_fp64(q, k, v, layout, scale)
    err, norm = reference.errors(o, o64)
    err_r, _ = reference.errors(reference.reference_r(q, k, v, layout, mode, scale), o64)
    return err, norm, err_r, lse64


def _inputs(B, H, Sq, Sk, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(S):
        shape = (B, S, H, 128) if layout == "bshd" else (B, H, S, 128)
        return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    return r(Sq), r(Sk), r(Sk)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sq,sk", SIZES)
def test_accuracy_and_lse(kernels, mode, layout, sq, sk):
    from rtcattn.ops.attention_fwd import reference
    B, H = (1, 1) if sq * sk > 2 ** 24 else (2, 3)
    q, k, v = _inputs(B, H, sq, sk, layout, seed=sq * 7919 + sk)
    scale = 1 / math.sqrt(128)
    o, lse = kernels[mode](q, k, v, layout)
    torch.cuda.synchronize()
    assert not (o.view(torch.int16) == -1).any(), "output elements left unwritten"
    assert torch.isfinite(o.float()).all()
    err, norm, err_r, lse64 = _errors(o, q, k, v, layout, mode, scale)
    assert err <= 2 * err_r + 1e-5, (err, err_r)
    assert norm < 1e-2
    assert reference.lse_close(lse, lse64).all()


@pytest.mark.parametrize("mode", MODES)
def test_strided_views_and_determinism(kernels, mode):
    gen = torch.Generator(device="cuda").manual_seed(11)
    qkv = torch.randn(2, 777, 3, 4, 128, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]     # bshd views, nothing copied
    o1, l1 = kernels[mode](q, k, v, "bshd")
    o2, l2 = kernels[mode](q, k, v, "bshd")
    torch.cuda.synchronize()
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)
    err, norm, err_r, _ = _errors(o1, q, k, v, "bshd", mode, 1 / math.sqrt(128))
    assert err <= 2 * err_r + 1e-5 and norm < 1e-2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_output_rounding_bit_exact(kernels, mode, layout):
    """O bit for bit in each mode: the bf16x2 packing of bf16_round.h (the PTX cvt for rtne and rtz, which the host
    tests cannot run; the bias for rtna), the raw pair P goes through too. q = 0 makes every score 0 and every p
    exactly 1, so with two keys O = (v0 + v1) / 2 exactly in fp32 (v in +-[1, 2]: at most 9 significant bits; for
    about a quarter of the elements a tie between two bf16, where the modes disagree) and the only rounding is
    O's."""
    from rtcattn.ops.attention_fwd import reference
    B, H, Sq, Sk = 2, 3, 200, 2
    gen = torch.Generator(device="cuda").manual_seed(23)
    shape = (lambda S: (B, S, H, 128)) if layout == "bshd" else (lambda S: (B, H, S, 128))
    q = torch.zeros(shape(Sq), device="cuda", dtype=torch.bfloat16)
    k = torch.randn(shape(Sk), generator=gen, device="cuda").to(torch.bfloat16)
    sign = torch.randint(0, 2, shape(Sk), generator=gen, device="cuda") * 2 - 1
    v = ((1 + torch.rand(shape(Sk), generator=gen, device="cuda")) * sign).to(torch.bfloat16)
    o, _ = kernels[mode](q, k, v, layout)
    torch.cuda.synchronize()
    vf = reference.to_bhsd(v, layout).float()
    exact = (vf[:, :, :1] + vf[:, :, 1:]) * 0.5                    # [B, H, 1, D], exact in fp32
    want = reference.bf16_bits(reference.round_to_bf16(exact, mode)).expand(B, H, Sq, 128)
    got = reference.bf16_bits(reference.to_bhsd(o, layout))
    zero = (want & 0x7FFF) == 0                                   # v0 = -v1: the sign of the 0 is the GEMM's
    assert torch.equal(torch.where(zero, got & 0x7FFF, got), torch.where(zero, want & 0x7FFF, want)), mode
    ties = (exact.view(torch.int32) & 0xFFFF) == 0x8000
    assert ties.float().mean().item() > 0.1, "the inputs must hold ties, where the modes differ"


@pytest.mark.parametrize("mode", MODES)
def test_special_values(kernels, mode):
    q, k, v = _inputs(1, 2, 200, 300, "bhsd", seed=5)
    k[..., 0] = k[..., 0].abs() + 0.1
    q[0, 0, 3] = float("nan")                            # NaN row of Q -> NaN row
    q[0, 0, 10] = 0
    q[0, 0, 10, 0] = float("-inf")                       # every score -inf, keys seen -> NaN row, LSE NaN
    q[0, 0, 20] = 0
    q[0, 0, 20, 0] = float("inf")                        # +inf score -> NaN row
    k[0, 1, 7] = float("nan")                            # NaN key row -> head 1 all NaN
    v[0, 0, 5, 9] = float("nan")                         # NaN in V[j, d] -> column d NaN (head 0)
    o, lse = kernels[mode](q, k, v, "bhsd")
    torch.cuda.synchronize()
    bits = o.view(torch.int16)
    canon = bits == 0x7FFF
    assert canon[0, 0, 3].all() and canon[0, 0, 20].all() and canon[0, 1].all()
    # A row that sees keys whose scores are all -inf is NaN, not an empty row's 0 (docs/numerics.md §4).
    assert canon[0, 0, 10].all() and torch.isnan(lse[0, 0, 10]).item()
    assert canon[0, 0, :, 9].all()
    rest = [i for i in range(200) if i not in (3, 10, 20)]
    cols = [c for c in range(128) if c != 9]
    assert torch.isfinite(o[0, 0, rest][:, cols].float()).all()
    assert not (torch.isnan(o.float()) & ~canon).any(), "every NaN must be the canonical 0x7FFF"


@pytest.mark.parametrize("B,H,S", [(2, 4, 1000), (1, 8, 4096)])
def test_side_by_side_with_torch_backends(kernels, B, H, S, record_property):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from rtcattn.ops.attention_fwd import reference
    q, k, v = _inputs(B, H, S, S, "bhsd", seed=S)
    o, _ = kernels["rtne"](q, k, v, "bhsd")
    o64, _ = reference.reference_fp64(q, k, v, "bhsd", 1 / math.sqrt(128))
    theirs = []
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        with sdpa_kernel([be]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        theirs.append(reference.errors(out, o64))
        record_property(f"{name}_err_normwise", theirs[-1])
        record_property(f"within_1ulp_of_{name}", reference.share_within_ulp(o, out))
    err, norm = reference.errors(o, o64)
    record_property("ours_err_normwise", (err, norm))
    assert err <= 1.25 * min(t[0] for t in theirs), (err, theirs)
    assert norm <= 1.25 * min(t[1] for t in theirs), (norm, theirs)


def test_fallback_to_baseline_with_reason(kernels, capfd, monkeypatch):
    """A misaligned view runs the baseline; the reason is logged under RTCATTN_LOG=1."""
    from rtcattn.runtime import dispatch
    monkeypatch.setenv("RTCATTN_LOG", "1")
    monkeypatch.setattr(dispatch, "_logged", set())
    gen = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn(1, 300, 2, 136, generator=gen, device="cuda").to(torch.bfloat16)
    qv = base[..., 1:129]                                # 2-byte offset: TMA cannot take it
    o, _ = _forward(qv, qv, qv, "bshd", "rtne", expect="baseline")
    torch.cuda.synchronize()
    assert "sm90: q pointer is not 16-byte aligned" in capfd.readouterr().err
    err, norm, err_r, _ = _errors(o, qv, qv, qv, "bshd", "rtne", 1 / math.sqrt(128))
    assert err <= 2 * err_r + 1e-5 and norm < 1e-2
