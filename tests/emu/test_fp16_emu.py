"""fp16 q, k, v on the wave emulator: the baseline and the gfx942 kernel (each pinned) meet the fp16 part of the
numerics contract (docs/numerics.md §9) against the fp64 reference and the fp16 R reference (P and O rounded to fp16,
nearest even), dense, masked, GQA, packed and paged; O past fp16's largest value is +-Inf; P below fp16's subnormals
drops out of P·V; an fp16 call goes to the gfx942 kernel on gfx942 and to the sm90 kernel on sm_90a.

The shared checks are numerics_suite's and varlen_suite's with dtype=torch.float16; sizes are kept small (the
emulator runs every lane on the host).
"""
import math

import pytest
import torch

import numerics_suite as suite
import rtcattn
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref, stub, validate
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

F16 = torch.float16
OP = attention_fwd.OP
LN2 = math.log(2.0)  # a softmax scale whose scale·log2(e) is 1 (to an fp32 ulp): scores are log2-domain exponents


def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                           window_size=window)


@pytest.fixture(autouse=True)
def gfx942(monkeypatch):
    """Selection through dispatch, nothing pinned unless a test pins a kernel (the `kernel` fixture)."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.delenv("RTCATTN_KERNEL", raising=False)


@pytest.fixture(params=["baseline", "gfx942"])
def kernel(request):
    """The contract's tests run on each kernel that takes fp16 on gfx942, pinned (no fallback)."""
    with dispatch.pinned(kernel=request.param):
        yield request.param


# ---- selection ---------------------------------------------------------------------------------------------------

def test_fp16_selects_the_gfx942_kernel_on_gfx942_emu():
    q, k, v = suite.make_qkv("bshd", 1, 2, 40, 70, 128, "cpu", seed=1, dtype=F16)
    sel = attention_fwd.selection(q, k, v)
    assert sel.kernel.name == "gfx942" and sel.variant.name == "gfx942-rtne-none-dense-d128-fp16-same-plain-nodrop", sel
    assert attention_fwd.selection(*(t.bfloat16() for t in (q, k, v))).variant.name == \
        "gfx942-rtne-none-dense-d128-bf16-same-plain-nodrop"
    lens = [40, 30]
    b = vs.make_batch(lens, lens, 4, 2, 128, "cpu", dtype=F16)
    sel = attention_fwd.selection_varlen(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=(-1, 0))
    assert sel.variant.name == "gfx942-rtne-window-varlen-d128-fp16-same-plain-nodrop", sel.variant.name


@pytest.mark.parametrize("d, bucket", [(128, 128), (40, 64), (8, 32), (200, 256)])
def test_fp16_selects_the_sm90_kernel_on_sm90a(d, bucket):
    """The sm_90a choice without a GPU: the manifest and the runtime's argument check, nothing launched. fp16 goes
    to the sm90 kernel's bucket for D, and every round mode to its one fp16 variant (nearest even)."""
    q = torch.zeros(1, 200, 2, d, dtype=F16)
    p = validate.check_inputs(q, q, q, "bshd", "rtne")
    args = attention_fwd.args_block(q, q, q, None, None, "bshd", p, dict(num_cus=132))
    for mode in ("rtna", "rtne", "rtz"):
        sel = dispatch.select(OP, "sm_90a", stub._call(q, mode, p, "dense"),
                              supports=dispatch.runtime_check(OP, args, "cuda"))
        assert sel.kernel.name == "sm90", (mode, sel.why)
        assert sel.variant.name == f"sm90-rtne-none-dense-d{bucket}-fp16-same-plain-nodrop", (mode, sel.variant.name)
    qb = q.bfloat16()
    pb = validate.check_inputs(qb, qb, qb, "bshd", "rtne")
    argsb = attention_fwd.args_block(qb, qb, qb, None, None, "bshd", pb, dict(num_cus=132))
    assert dispatch.select(OP, "sm_90a", stub._call(qb, "rtz", pb, "dense"),
                           supports=dispatch.runtime_check(OP, argsb, "cuda")).variant.name == \
        f"sm90-rtz-none-dense-d{bucket}-bf16-same-plain-nodrop"


def test_round_mode_does_not_apply_to_fp16():
    """Every mode runs the one fp16 variant (nearest even): the same bits; the bf16 modes differ."""
    q, k, v = suite.make_qkv("bshd", 1, 2, 20, 33, 64, "cpu", seed=2, dtype=F16)
    names = {attention_fwd.selection(q, k, v, round_mode=m).variant.name for m in suite.MODES}
    assert names == {"gfx942-rtne-none-dense-d64-fp16-same-plain-nodrop"}
    outs = [ref.bf16_bits(run(q, k, v, "bshd", m, None, False)) for m in suite.MODES]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


# ---- the contract against the fp64 reference and R ----------------------------------------------------------------

@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_sizes_cross_attention_and_lse(kernel, layout):
    suite.check_sizes(run, "cpu", layout, "rtne", (1, 17, 128, 300), dtype=F16)


def test_head_dims(kernel):
    suite.check_head_dims(run, "cpu", "bshd", "rtne", (64, 72, 136, 256), sq=17, sk=40, dtype=F16)


@pytest.mark.parametrize("window,heads,layout", [((-1, 0), (8, 2), "bshd"), ((17, 3), (3, 1), "bhsd"),
                                                 ((0, 0), (4, 4), "bshd"), ((-1, 5), (8, 1), "bhsd")])
def test_causal_window_and_gqa(kernel, window, heads, layout):
    hq, hk = heads
    for sq, sk in ((45, 130), (96, 96), (130, 45)):
        q, k, v = suite.make_qkv(layout, 1, hq, sq, sk, 64, "cpu", seed=sq + hk, hk=hk, dtype=F16)
        suite.check_accuracy(run, q, k, v, layout, "rtne", what="fp16 mask", window=window)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_special_values(kernel, layout):
    """The table of §4, with the fp16 canonical NaN 0x7E00."""
    suite.check_special_values(run, "cpu", layout, "rtne", dtype=F16)
    suite.check_window_special_values(run, "cpu", layout, "rtne", (-1, 0), sq=30, sk=20, hk=1, dtype=F16)


def test_strided_views_and_determinism(kernel):
    suite.check_strided(run, "cpu", "bshd", "rtne", dtype=F16)
    suite.check_determinism(run, "cpu", "bhsd", "rtne", sq=40, sk=150, d=64, dtype=F16)


def test_archs_agree_bit_for_bit(kernel, monkeypatch):
    q, k, v = suite.make_qkv("bshd", 1, 2, 40, 77, 128, "cpu", seed=3, dtype=F16)
    outs = []
    for arch in ("gfx942", "gfx90a"):
        monkeypatch.setenv("RTCATTN_EMULATE", arch)
        outs.append(run(q, k, v, "bshd", "rtne", None, False))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_varlen_and_paged(kernel, window):
    lens_q, lens_k = [1, 33, 0, 70], [40, 33, 5, 17]
    b = vs.make_batch(lens_q, lens_k, 4, 2, 64, "cpu", seed=4, dtype=F16)
    vs.check_accuracy(b, "rtne", window, what="fp16 varlen")
    vs.check_paged_equals_packed(b, 16, "rtne", window)
    vs.check_accuracy(vs.to_paged(b, 16), "rtne", window, what="fp16 paged")


# ---- fp16's own range: O past 65504, P below the subnormals ----------------------------------------------------------

def _one_hot_rows(values, d=64):
    """[1, len(values), 1, d] fp16 rows whose element 0 is each value, the rest 0."""
    t = torch.zeros(1, len(values), 1, d, dtype=torch.float32)
    t[0, :, 0, 0] = torch.tensor(values, dtype=torch.float32)
    return t.to(F16)


@pytest.mark.parametrize("d", [64, 200])
def test_output_past_65504_is_inf_where_r_says(kernel, d):
    """Column 0 of V is 65504 (fp16's largest) on every key, column 1 -65504: the exact mean is 65504, but P is
    rounded to fp16 while l sums the unrounded p. Row 0 sees key 0 at p = 1 and 100 keys at p = 2^-0.99902 =
    0.500338, whose fp16 is 0.500488 (0.3 ulp up): O/l = 65504 · 1.00029 = 65523 >= 65520, so O is +-Inf, as R
    says. Row 1 (every p = 1, nothing rounded) and row 2 (p rounds up on one key of 101) stay 65504. (d = 200: the
    gfx942 kernel's bucket 256, whose columns past 200 are zeros.)"""
    n = 100
    q = _one_hot_rows([1.0, 0.0, -1.0], d)
    k = _one_hot_rows([0.0] + [-(1 - 2**-10)] * n, d)
    v = torch.randn(1, n + 1, 1, d, generator=torch.Generator().manual_seed(9)).to(F16)
    v[..., 0], v[..., 1], v[..., 2] = 65504.0, -65504.0, 60000.0
    out, lse = run(q, k, v, "bshd", "rtne", LN2, True)
    bits = ref.bf16_bits(out)[0, :, 0]
    assert bits[0, :2].tolist() == [0x7C00, 0xFC00], [hex(b) for b in bits[0, :2].tolist()]
    assert bits[1:, 0].tolist() == [0x7BFF, 0x7BFF] and bits[1:, 1].tolist() == [0xFBFF, 0xFBFF]
    r = ref.reference_r(q, k, v, "bshd", "rtne", LN2)
    assert torch.equal(torch.isinf(out), torch.isinf(r)), "Inf where R has none, or the other way round"
    assert int(torch.isinf(out).sum()) == 2 and not torch.isnan(out).any()
    assert torch.isfinite(lse).all()
    o64, _ = ref.reference_fp64(q, k, v, "bshd", LN2)
    fin = torch.isfinite(out)
    exact = torch.full_like(o64[0, :, 0, :2], 65504.0)
    assert torch.allclose(o64[0, :, 0, :2].abs(), exact, rtol=1e-12, atol=0), "the Inf comes from P's rounding"
    err, _ = ref.errors(out.float()[fin], o64[fin])
    assert err <= 65504 * 2**-10, err   # the finite elements: within an ulp or so of fp16 near 65504


def test_p_below_fp16_subnormals_drops_out_of_pv_but_not_out_of_l(kernel):
    """Key 1's p = 2^-26 is below half fp16's smallest subnormal (2^-24): P rounds to 0, so V[1] (60000 in column 0)
    adds nothing, while l = 1 + 2^-26 = 1 in fp32. O[0] is 1 (0x3C00), as R gives it; the fp64 answer
    1 + 60000·2^-26 = 1.000894 would round to 0x3C01. Moved to p = 2^-24.5, key 1's P rounds up to the smallest
    subnormal 2^-24 and does reach O: 1 + 60000·2^-24 = 1.0036 (0x3C04)."""
    q = _one_hot_rows([1.0, 1.0])
    k = _one_hot_rows([0.0, -26.0])
    v = torch.ones(1, 2, 1, 64, dtype=F16)
    v[0, 1, 0, 0] = 60000.0
    out = run(q, k, v, "bshd", "rtne", LN2, False)
    r = ref.reference_r(q, k, v, "bshd", "rtne", LN2)
    assert ref.bf16_bits(out)[0, 0, 0, 0].item() == 0x3C00
    assert torch.equal(ref.bf16_bits(out), ref.bf16_bits(r))
    o64, _ = ref.reference_fp64(q, k, v, "bshd", LN2)
    assert ref.bf16_bits(ref.round_to_fp16(o64[0, 0, 0, :1].float())).item() == 0x3C01
    k = _one_hot_rows([0.0, -24.5])
    out = run(q, k, v, "bshd", "rtne", LN2, False)
    assert ref.bf16_bits(out)[0, 0, 0, 0].item() == 0x3C04
    assert torch.equal(ref.bf16_bits(out), ref.bf16_bits(ref.reference_r(q, k, v, "bshd", "rtne", LN2)))
