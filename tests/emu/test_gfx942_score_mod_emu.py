"""The soft cap and ALiBi (the score_mod axis) on the gfx942 family's kernels on the wave emulator, each kernel pinned
(no fallback): the prefill (gfx942), the decode (gfx942_decode, and gfx950_decode's native FP4 path) and the matrix-core
backward (gfx942), against the fp64 references of docs/numerics.md ("Soft cap and ALiBi") through
tests/score_mod_suite.py: dense (both layouts, bf16 and fp16, head dims 64 and padded ones), packed (varlen, paged),
flash_attn_with_kvcache, the forward's tail split and the decode's KV split (partials merged by their log2-domain
maxima), quantized caches (the modifications on the dequantized score); zero slopes give the plain variant's bits;
gfx90a gives gfx942's bits, and gfx950's builds meet the same rule. Key lengths past one 64-key block, so that the
prefill's steady and window-cut loops both run."""
import contextlib
import os

import pytest
import torch

import rtcattn
import score_mod_suite as sms
import varlen_suite as vs
from rtcattn.ops.attention_fwd import kvquant, reference as ref
from rtcattn.runtime import dispatch
from test_kvquant_emu import hnd

pytestmark = pytest.mark.emu

PREFILL, DECODE, NATIVE, BACKWARD = "gfx942", "gfx942_decode", "gfx950_decode", "gfx942"
BF, FP = torch.bfloat16, torch.float16
CASE = dict(zip(sms.IDS, sms.CASES))
BOTH_WINDOW, BOTH = CASE["both_window"], CASE["both"]
# Packed lengths: empty sequences, one row, sequences of one key, and ones past a 64-key block.
LENS_Q, LENS_K = (5, 1, 70, 0, 17), (9, 130, 70, 3, 200)
DECODE_LENS_Q, DECODE_LENS_K = (5, 1, 16, 0, 3), (9, 130, 70, 3, 200)  # at most 16 query rows: the decode's


@pytest.fixture(autouse=True)
def gfx942(monkeypatch):
    """Every test runs on the emulated gfx942 unless it sets another arch."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


@contextlib.contextmanager
def arch(name):
    before = os.environ["RTCATTN_EMULATE"]
    os.environ["RTCATTN_EMULATE"] = name
    try:
        yield
    finally:
        os.environ["RTCATTN_EMULATE"] = before


def _qkv(b, sq, sk, hq, hk, d, dtype=BF, seed=3):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, sq, hq, d, generator=gen) * 1.5).to(dtype)
    k, v = ((torch.randn(b, sk, hk, d, generator=gen) * 1.5).to(dtype) for _ in range(2))
    return q, k, v


def assert_forward(out, lse, o64, lse64, r, tag):
    """The suite's rule: err <= 2 err(R) + 1e-5, the LSE within lse_close, finite outputs."""
    err, _ = ref.errors(out, o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all(), f"non-finite output: {tag}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    assert bool(ref.lse_close(lse, lse64).all()), f"LSE off: {tag}"


# ---- the prefill kernel --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sms.CASES, ids=sms.IDS)
def test_prefill_dense(case):
    sms.check_dense(PREFILL, "cpu", case, d=64, sq=37, sk=200)


@pytest.mark.parametrize("case", sms.CASES[1::2], ids=sms.IDS[1::2])
def test_prefill_dense_fp16_bhsd_padded_head_dim(case):
    sms.check_dense(PREFILL, "cpu", case, d=72, sq=20, sk=150, dtype=FP, layout="bhsd")


def test_prefill_head_dim_200_rtz():
    sms.check_dense(PREFILL, "cpu", BOTH_WINDOW, d=200, sq=20, sk=150, mode="rtz")


@pytest.mark.parametrize("case", sms.CASES[::2], ids=sms.IDS[::2])
@pytest.mark.parametrize("page", [None, 16], ids=["varlen", "paged"])
def test_prefill_packed(case, page):
    sms.check_packed(PREFILL, "cpu", case, lens_q=LENS_Q, lens_k=LENS_K, page=page, hq=4, hk=2)


def test_prefill_tail_split():
    """The dense call's KV blocks split into 3 parts: partials merged by their (modified-score) maxima."""
    _, cap, _, window = BOTH
    q, k, v = _qkv(1, 40, 300, 2, 1, 64)
    al = sms.slopes("heads", 1, 2, "cpu")
    with dispatch.pinned(kernel=PREFILL, tail_split=3, num_cus=dispatch.emulated_cus("gfx942-emu")):
        out, lse = rtcattn.forward(q, k, v, window_size=window, softcap=cap, alibi_slopes=al, return_lse=True)
    score = dict(softcap=cap, alibi_slopes=al)
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd", None, window, **score)
    assert_forward(out, lse, o64, lse64, ref.reference_r(q, k, v, "bshd", "rtne", None, window, **score), "split")


# ---- the decode kernel ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sms.CASES, ids=sms.IDS)
def test_decode_kvcache(case):
    """flash_attn_with_kvcache, 2 query rows a sequence; the fp16 half paged, at head dim 128."""
    i = sms.CASES.index(case)
    if i % 2:
        sms.check_kvcache(DECODE, "cpu", case, d=128, sq=2, cap_rows=160, seqlens=(0, 41, 140), dtype=FP, paged=True)
    else:
        sms.check_kvcache(DECODE, "cpu", case, d=64, sq=2, cap_rows=160, seqlens=(0, 41, 140))


@pytest.mark.parametrize("page", [None, 16], ids=["varlen", "paged"])
def test_decode_packed(page):
    sms.check_packed(DECODE, "cpu", BOTH_WINDOW, d=96, lens_q=DECODE_LENS_Q, lens_k=DECODE_LENS_K, page=page, hq=8,
                     hk=2)


def test_decode_kv_split():
    """The item's KV steps split into 3 parts, merged by the modified scores' maxima."""
    with dispatch.pinned(kernel=DECODE, tail_split=3, num_cus=dispatch.emulated_cus("gfx942-emu")):
        _check_packed_unpinned(BOTH, DECODE_LENS_Q, DECODE_LENS_K, hq=4, hk=1, d=64)


def _check_packed_unpinned(case, lens_q, lens_k, hq, hk, d, dtype=BF):
    """check_packed's call and rule, under the caller's pins."""
    _, cap, kind, window = case
    b = vs.make_batch(lens_q, lens_k, hq, hk, d, "cpu", seed=7, dtype=dtype)
    al = sms.slopes(kind, len(lens_q), hq, "cpu")
    out, lse = rtcattn.forward_varlen(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, window_size=window, softcap=cap,
                                      alibi_slopes=al, return_lse=True)
    args = (b.q, b.k, b.v, b.cu_q, b.cu_k)
    score = dict(softcap=cap, alibi_slopes=al)
    o64, lse64 = ref.reference_varlen(*args, None, None, window, **score)
    assert_forward(out, lse, o64, lse64, ref.reference_varlen(*args, "rtne", None, window, **score), str(case))


# ---- quantized caches: the modifications on the dequantized score -------------------------------------------------

# (kernel, kv_dtype, lens_q, dtype): the prefill with more than 16 query rows, the decode with fewer; FP8 with descales
# per (sequence, head), FP4 with its scales.
QUANT = [(PREFILL, "fp8_e4m3", (3, 70), BF), (PREFILL, "fp4_e2m1", (40, 1), FP), (DECODE, "fp8_e4m3fnuz", (3, 16), FP),
         (DECODE, "fp4_e2m1", (1, 5), BF)]


@pytest.mark.parametrize("kernel,kv_dtype,lens_q,dtype", QUANT, ids=[f"{q[0]}-{q[1]}" for q in QUANT])
def test_quantized_cache(kernel, kv_dtype, lens_q, dtype):
    _, cap, kind, window = BOTH_WINDOW
    b = vs.to_paged(vs.make_batch(lens_q, (90, 140), 4, 2, 64, "cpu", seed=11, dtype=dtype), 16, seed=2)
    al = sms.slopes(kind, 2, 4, "cpu")
    kd = vd = None
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
        k, v = hnd(kp), hnd(vp)
        kw = dict(kv_cache_dtype=kv_dtype, k_scale=ks, v_scale=vs_)
        kdq, vdq = ref.dequantize_cache(k, kv_dtype, ks), ref.dequantize_cache(v, kv_dtype, vs_)
    else:
        fmt = torch.float8_e4m3fn if kv_dtype == "fp8_e4m3" else torch.float8_e4m3fnuz
        k, v = (kvquant.quantize_fp8(t, torch.ones(()), fmt) for t in (b.k, b.v))
        gen = torch.Generator().manual_seed(4)
        kd, vd = (torch.rand((2, 2), generator=gen) * 1.75 + 0.25 for _ in range(2))
        kw = dict(k_descale=kd, v_descale=vd)
        kdq, vdq = ref.dequantize_cache(k), ref.dequantize_cache(v)
    with dispatch.pinned(kernel=kernel):
        out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window_size=window, softcap=cap,
                                          alibi_slopes=al, return_lse=True, block_table=b.block_table, **kw)
    args = (b.q, kdq, vdq, b.cu_q, b.cu_k)
    score = dict(softcap=cap, alibi_slopes=al)
    o64, lse64 = ref.reference_varlen(*args, None, None, window, b.block_table, kd, vd, **score)
    r = ref.reference_varlen(*args, "rtne", None, window, b.block_table, kd, vd, **score)
    assert_forward(out, lse, o64, lse64, r, f"{kernel} {kv_dtype}")


def test_native_fp4_path_on_gfx950():
    """gfx950_decode (K's FP4 codes through the scaled MFMA, q quantized to FP8 per row): the rule against the
    reference of the quantized q over the dequantized cache, with both modifications."""
    _, cap, kind, window = BOTH
    b = vs.to_paged(vs.make_batch((1, 4), (17, 150), 8, 2, 128, "cpu", seed=5), 16, seed=3)
    (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
    k, v = hnd(kp), hnd(vp)
    kdq, vdq = (ref.dequantize_cache(t, "fp4_e2m1_native", s) for t, s in ((k, ks), (v, vs_)))
    qn = kvquant.dequantize_q_fp8(*kvquant.quantize_q_fp8(b.q)).to(b.q.dtype)
    al = sms.slopes(kind, 2, 8, "cpu")
    with arch("gfx950"), dispatch.pinned(kernel=NATIVE, num_cus=dispatch.emulated_cus("gfx950-emu")):
        out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window_size=window,
                                          block_table=b.block_table, softcap=cap, alibi_slopes=al, return_lse=True,
                                          kv_cache_dtype="fp4_e2m1_native", k_scale=ks, v_scale=vs_)
    args = (qn, kdq, vdq, b.cu_q, b.cu_k)
    score = dict(softcap=cap, alibi_slopes=al)
    o64, lse64 = ref.reference_varlen(*args, None, None, window, b.block_table, **score)
    assert_forward(out, lse, o64, lse64, ref.reference_varlen(*args, "rtne", None, window, b.block_table, **score),
                   "native")


# ---- the backward --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sms.CASES, ids=sms.IDS)
def test_backward_dense(case):
    sms.check_backward_dense(BACKWARD, "cpu", case, d=64, sq=29, sk=150, fwd_kernel=PREFILL)


@pytest.mark.parametrize("case", sms.CASES[1::2], ids=sms.IDS[1::2])
def test_backward_packed_fp16_padded_head_dim(case):
    sms.check_backward_packed(BACKWARD, "cpu", case, d=40, lens_q=(7, 0, 70, 12), lens_k=(20, 5, 90, 1), dtype=FP)


def test_backward_head_dim_192():
    sms.check_backward_dense(BACKWARD, "cpu", BOTH_WINDOW, d=192, sq=20, sk=40, hq=2, hk=1, fwd_kernel=PREFILL)


# ---- identities and archs ------------------------------------------------------------------------------------------

def test_zero_slopes_give_the_plain_bits_and_a_cap_or_slope_moves_the_output():
    """-0 |j - i| adds nothing: the ALiBi variants of the prefill, the decode and the backward with zero slopes write
    the plain variants' bits (another variant, the same function); a real cap or slope changes the output."""
    q, k, v = _qkv(2, 37, 150, 4, 2, 64)
    zero = torch.zeros(4)
    for kernel, qq in ((PREFILL, q), (DECODE, q[:, :3])):
        with dispatch.pinned(kernel=kernel):
            plain, lse = rtcattn.forward(qq, k, v, causal=True, return_lse=True)
            z, lse_z = rtcattn.forward(qq, k, v, causal=True, return_lse=True, alibi_slopes=zero)
            capped = rtcattn.forward(qq, k, v, causal=True, softcap=1.0)
            sloped = rtcattn.forward(qq, k, v, causal=True, alibi_slopes=torch.full((4,), 0.25))
        assert torch.equal(ref.bf16_bits(z), ref.bf16_bits(plain)) and torch.equal(lse_z, lse), kernel
        for other in (capped, sloped):
            assert (other.float() - plain.float()).abs().max() > 0.05, kernel
    dout = _qkv(2, 37, 1, 4, 1, 64, seed=9)[0]
    with dispatch.pinned(kernel=PREFILL):
        out, lse = rtcattn.forward(q, k, v, causal=True, return_lse=True)
    grads = []
    for slopes in (None, zero):
        with dispatch.pinned(kernel=BACKWARD):
            grads.append(torch.ops.rtcattn.bwd(dout, q, k, v, out, lse, "bshd", "rtne", None, -1, 0, True, None,
                                               alibi_slopes=slopes))
    assert all(torch.equal(ref.bf16_bits(a), ref.bf16_bits(b)) for a, b in zip(*grads))


def test_gfx90a_gives_gfx942_bits():
    """The same source on the emulated gfx90a: the prefill, the decode and the backward, bit for bit."""
    _, cap, kind, window = BOTH_WINDOW
    q, k, v = _qkv(2, 20, 150, 4, 2, 64, seed=8)
    dout = _qkv(2, 20, 1, 4, 1, 64, seed=10)[0]
    al = sms.slopes(kind, 2, 4, "cpu")
    runs = []
    for name in ("gfx942", "gfx90a"):
        with arch(name):
            with dispatch.pinned(kernel=PREFILL):
                out, lse = rtcattn.forward(q, k, v, window_size=window, softcap=cap, alibi_slopes=al, return_lse=True)
            with dispatch.pinned(kernel=DECODE):
                dec = rtcattn.forward(q[:, :4], k, v, window_size=window, softcap=cap, alibi_slopes=al)
            with dispatch.pinned(kernel=BACKWARD):
                grads = torch.ops.rtcattn.bwd(dout, q, k, v, out, lse, "bshd", "rtne", None, *window, True, None,
                                              softcap=cap, alibi_slopes=al)
        runs.append([out, lse, dec, *grads])
    assert all(torch.equal(a.view(torch.int16) if a.dtype == BF else a, b.view(torch.int16) if b.dtype == BF else b)
               for a, b in zip(*runs))


def test_gfx950_builds():
    """gfx950's builds of the three kernels (its own wait states and gfx950 paths of the same source) meet the rule."""
    with arch("gfx950"):
        sms.check_dense(PREFILL, "cpu", BOTH_WINDOW, d=128, sq=20, sk=150)
        sms.check_kvcache(DECODE, "cpu", BOTH, d=64, sq=2, cap_rows=160, seqlens=(0, 41, 140), paged=True)
        sms.check_backward_dense(BACKWARD, "cpu", BOTH, d=64, sq=20, sk=70, fwd_kernel=PREFILL)
