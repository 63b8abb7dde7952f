"""The gfx942 decode kernel on quantized caches (FP8 E4M3, E4M3 FNUZ with descales; FP4 E2M1 + E8M0), on the wave
emulator: the accuracy rule against the fp64 reference over the dequantized cache (test_kvquant_emu.check), the same
bits as the decode kernel on the dequantized cache in q's dtype where the scales are powers of two (every FP4 scale;
FP8 descales chosen so: the kernel multiplies the scores and O by them in fp32, exact then), the KV split forced to 1
and n parts (the same bits run to run), gfx90a giving gfx942's bits and gfx950 in FP8 (its FP4, by the scaled
converts, its own bits on the dequantized cache), and the NaN codes and scales of
docs/numerics.md §10. Sq 1 and 4, GQA 1 / 4 / 8, KV lengths 1, 17 and 300, varlen and pages of 16 and 64 in shuffled
order, causal and windows, both dtypes, and the buckets spread over the cases (every variant's code object is
checked in tests/cpu/test_gfx942_decode_isa.py). Every call is masked and rounds to nearest even: each case's
variant is built once for the file."""
import contextlib
import os

import pytest
import torch

import rtcattn
import varlen_suite as vs
from rtcattn.ops.attention_fwd import kvquant, reference as ref
from rtcattn.runtime import dispatch
from test_kvquant_emu import FP8, check, hnd

pytestmark = pytest.mark.emu

KERNEL = "gfx942_decode"
CUS = dispatch.emulated_cus("gfx942-emu")
CAUSAL = (-1, 0)
BF16, F16 = torch.bfloat16, torch.float16


@contextlib.contextmanager
def on(arch="gfx942", **pins):
    """The calls inside run on the emulated arch with the decode kernel pinned (no fallback)."""
    before = os.environ.get("RTCATTN_EMULATE")
    os.environ["RTCATTN_EMULATE"] = arch
    try:
        with dispatch.pinned(kernel=KERNEL, num_cus=CUS, **pins):
            yield
    finally:
        if before is None:
            del os.environ["RTCATTN_EMULATE"]
        else:
            os.environ["RTCATTN_EMULATE"] = before


# (kv_dtype, dtype, page (0: varlen), d, (Hq, Hk), lens_q, lens_k, window, descales): descales "pow2" one element
# each (2^-1, 2^1), "head" per (sequence, K/V head) in [0.25, 2), "none".
CASES = [
    ("fp8_e4m3", BF16, 16, 128, (8, 2), [1, 4], [17, 300], CAUSAL, "pow2"),
    ("fp8_e4m3", F16, 0, 64, (8, 1), [4, 1, 1], [1, 17, 300], (37, 0), "head"),
    ("fp8_e4m3fnuz", BF16, 0, 256, (2, 2), [1, 4], [300, 17], CAUSAL, "pow2"),
    ("fp8_e4m3fnuz", F16, 64, 72, (8, 2), [4, 1], [300, 1], (20, 0), "none"),
    ("fp4_e2m1", BF16, 64, 160, (8, 1), [1, 4], [300, 17], CAUSAL, "none"),
    ("fp4_e2m1", F16, 16, 64, (2, 2), [4, 1, 1], [17, 1, 300], (50, 0), "none"),
    # FP4 at 256: three steps in flight on gfx942 and gfx950, two on gfx90a (params.h decode_ahead)
    ("fp4_e2m1", BF16, 16, 256, (8, 2), [1, 4], [300, 17], CAUSAL, "none"),
]
IDS = [f"{c[0]}-{'bf16' if c[1] == BF16 else 'fp16'}-{f'page{c[2]}' if c[2] else 'varlen'}-d{c[3]}" for c in CASES]


def quantized(case, seed=0):
    """(batch in q's dtype over the exact dequantized keys, quantized call's K, V and keyword arguments, the fp64
    dequantized K and V, the descales for the reference)."""
    kv_dtype, dtype, page, d, (hq, hk), lens_q, lens_k, window, kind = case
    b = vs.make_batch(lens_q, lens_k, hq, hk, d, "cpu", seed=seed + d, dtype=dtype)
    if page:
        b = vs.to_paged(b, page, seed=seed + page)
    kd = vd = None
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
        k, v = hnd(kp), hnd(vp)
        kw = dict(kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs_)
        kdq, vdq = ref.dequantize_cache(k, "fp4_e2m1", ks), ref.dequantize_cache(v, "fp4_e2m1", vs_)
    else:
        k, v = (kvquant.quantize_fp8(t, torch.ones(()), FP8[kv_dtype]) for t in (b.k, b.v))
        if kind == "pow2":
            kd, vd = torch.tensor([0.5]), torch.tensor([2.0])
        elif kind == "head":
            gen = torch.Generator().manual_seed(seed + hq)
            kd, vd = (torch.rand((len(lens_q), hk), generator=gen) * 1.75 + 0.25 for _ in range(2))
        kw = dict(k_descale=kd, v_descale=vd)
        kdq, vdq = ref.dequantize_cache(k), ref.dequantize_cache(v)
    return b, k, v, kw, kdq, vdq, kd, vd


def call(b, k, v, kw, window):
    return rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True, window_size=window,
                                  block_table=b.block_table, **kw)


def same_bits(x, y, tag):
    assert torch.equal(ref.bf16_bits(x[0]), ref.bf16_bits(y[0])), tag
    assert torch.equal(x[1].view(torch.int32), y[1].view(torch.int32)), tag


@pytest.fixture(scope="module")
def runs():
    """Every case's output on gfx942 (planned split), with its inputs; the heavy part of the file, once."""
    out = {}
    for case in CASES:
        b, k, v, kw, kdq, vdq, kd, vd = quantized(case)
        with on():
            res = call(b, k, v, kw, case[7])
        out[str(case)] = (res, (b, k, v, kw, kdq, vdq, kd, vd))
    return out


def test_the_cases_cover_the_issue():
    assert {c[0] for c in CASES} == {"fp8_e4m3", "fp8_e4m3fnuz", "fp4_e2m1"}
    assert {c[1] for c in CASES} == {BF16, F16} and {c[2] for c in CASES} == {0, 16, 64}
    assert {c[4][0] // c[4][1] for c in CASES} == {1, 4, 8}
    assert {n for c in CASES for n in c[5]} == {1, 4} and {n for c in CASES for n in c[6]} == {1, 17, 300}
    assert CAUSAL in {c[7] for c in CASES} and {c[7] for c in CASES} - {CAUSAL}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_the_dequantized_fp64_reference(case, runs, monkeypatch):
    """The accuracy rule, and dispatch (nothing pinned) picks this kernel and the cache's variant."""
    (out, lse), (b, k, v, kw, kdq, vdq, kd, vd) = runs[str(case)]
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sel = rtcattn.ops.attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=case[7],
                                                     block_table=b.block_table, quant=_quant(kw))
    assert sel.kernel.name == KERNEL and sel.variant["kv_dtype"] == case[0], sel
    check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[7], kd, vd, tag=str(case))


def _quant(kw):
    from rtcattn.ops.attention_fwd import validate
    return validate.KvQuant(kw.get("kv_cache_dtype", "auto"), kw.get("k_descale"), kw.get("v_descale"),
                            kw.get("k_scale"), kw.get("v_scale"))


@pytest.mark.parametrize("case", [c for c in CASES if c[8] != "head"], ids=[i for c, i in zip(CASES, IDS)
                                                                              if c[8] != "head"])
def test_power_of_two_scales_give_the_dequantized_cache_bits(case, runs):
    """The expansion is exact and the power-of-two scales are applied exactly: the decode kernel's own bits on the
    dequantized cache (times the descales) in q's dtype."""
    res, (b, k, v, kw, kdq, vdq, kd, vd) = runs[str(case)]
    scale = lambda t, s: t if s is None else t * float(s)  # noqa: E731
    kq, vq = scale(kdq, kd).to(b.q.dtype), scale(vdq, vd).to(b.q.dtype)
    if case[0] == "fp4_e2m1":
        kq, vq = kq.contiguous(), vq.contiguous()
    with on():
        same_bits(res, call(b, kq, vq, {}, case[7]), case)


def test_fp4_v_scales_where_fp16_rounds_give_the_dequantized_cache_bits(runs):
    """FP4 V scales below fp16's normals (2^-20 .. 2^-26: V's elements rounded to fp16 subnormals or to zero, ties
    included) and K scales 2^-8 .. 2^8 (inside fp16's range, for the dequantized K): V's per-row tables hold the
    elements the dequantized cache's fp16 cast gives, so the kernel's bits are still its own on that cache."""
    case = CASES[5]
    _, (b, k, v, kw, *_) = runs[str(case)]
    gen = torch.Generator().manual_seed(5)
    vs_ = (127 - torch.randint(20, 27, kw["v_scale"].shape, generator=gen)).to(torch.uint8)
    ks = (127 + torch.randint(-8, 9, kw["k_scale"].shape, generator=gen)).to(torch.uint8)
    kq = ref.dequantize_cache(k, "fp4_e2m1", ks).to(b.q.dtype).contiguous()
    vq = ref.dequantize_cache(v, "fp4_e2m1", vs_).to(b.q.dtype).contiguous()
    assert (vq == 0).logical_and(ref.dequantize_cache(v, "fp4_e2m1", vs_) != 0).any(), "some elements round to 0"
    with on():
        got = call(b, k, v, dict(kw, k_scale=ks, v_scale=vs_), case[7])
        same_bits(got, call(b, kq, vq, {}, case[7]), case)
    assert torch.isfinite(got[0]).all() and (got[0] != 0).any()


def test_gfx950_fp4_gives_its_own_bits_on_the_dequantized_cache(runs):
    """gfx950's FP4 path (the scaled converts: K's codes, then its scale on the scores; V's elements the code times
    its scale rounded to the element type) gives gfx950's own bits on the dequantized cache in q's dtype, both
    dtypes, at the scale codes' ends: V scales 0 (2^-127: bf16 subnormals, fp16 zeros), 1, 2, fp16's rounding region,
    1.0, fp16's and bf16's overflow (Inf elements) and 0xFF (NaN); K scales 2^-8 .. 2^8. Equal bits, NaN aside (any
    NaN for a NaN)."""
    gen = torch.Generator().manual_seed(9)
    codes = torch.tensor([0, 1, 2, 100, 104, 107, 120, 127, 140, 141, 253, 254, 255], dtype=torch.uint8)
    for case in (CASES[4], CASES[5]):
        _, (b, k, v, kw, *_) = runs[str(case)]
        vs_ = codes[torch.randint(0, len(codes), kw["v_scale"].shape, generator=gen)]
        ks = (127 + torch.randint(-8, 9, kw["k_scale"].shape, generator=gen)).to(torch.uint8)
        kq = ref.dequantize_cache(k, "fp4_e2m1", ks).to(b.q.dtype).contiguous()
        vq = ref.dequantize_cache(v, "fp4_e2m1", vs_).to(b.q.dtype).contiguous()
        with on("gfx950"):
            got = call(b, k, v, dict(kw, k_scale=ks, v_scale=vs_), case[7])
            want = call(b, kq, vq, {}, case[7])
        for x, y in zip(got, want):  # the output, the LSE
            nan = torch.isnan(x.float())
            assert torch.equal(nan, torch.isnan(y.float())), case
            bits = ref.bf16_bits if x.dtype != torch.float32 else lambda t: t.view(torch.int32)
            assert torch.equal(bits(x[~nan]), bits(y[~nan])), case
        out = got[0].float()
        assert torch.isnan(out).any() and torch.isfinite(out).any() and (out != 0).any(), case


def test_forced_splits_1_and_n_repeat_bit_for_bit(runs):
    """One part and 3 parts (FP8 with its descales on O's partials, FP4 with its scales on V), each meeting the rule;
    each the same bits run to run."""
    for case in (CASES[1], CASES[4]):
        _, (b, k, v, kw, kdq, vdq, kd, vd) = runs[str(case)]
        for n in (1, 3):
            with on(tail_split=n):
                first, again = call(b, k, v, kw, case[7]), call(b, k, v, kw, case[7])
            same_bits(first, again, (case, n))
            check(*first, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[7], kd, vd, tag=f"{case} splits={n}")


@pytest.mark.parametrize("arch", ["gfx90a", "gfx950"])
def test_other_archs_give_gfx942_bits(arch, runs):
    """The same source built for gfx90a (no FP8 instructions: the same expansion) and gfx950 gives gfx942's bits;
    FNUZ too, which gfx942 converts with its own v_cvt_pk_f32_fp8 and the others place (gfx950's converts read OCP);
    FP4 on gfx90a (the same tables; at 256 two steps in flight where gfx942 keeps three: the same steps and order).
    gfx950 expands FP4 by its scaled converts, K's columns in their own order where the tables interleave them (a
    different order of the MFMA's sum): the next test checks it."""
    for case in (CASES[0], CASES[3]) + ((CASES[5], CASES[6]) if arch == "gfx90a" else ()):
        res, (b, k, v, kw, *_) = runs[str(case)]
        with on(arch):
            same_bits(res, call(b, k, v, kw, case[7]), (arch, case))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_fp8_nan_codes_give_nan_rows(arch, runs):
    """An FP8 NaN code (E4M3 S.1111.111, FNUZ 0x80) in K row j: the rows of that sequence and head that see key j are
    NaN; in V[j, c]: column c of those rows. The rest stays finite. gfx942 converts FNUZ and places E4M3 (the loop's
    NaN test), gfx950 the other way round."""
    for case, code in ((CASES[1], 0xFF), (CASES[3], 0x80)):
        _, (b, k, v, kw, *_) = runs[str(case)]
        k, v = k.clone(), v.clone()
        # (q rows, K/V head, V column) that read the NaN: a key every row of its sequence sees under the window.
        if case[2]:  # paged: sequence 1's key 0 (its only key), K/V head 1; sequence 0's key 290, head 0
            k.view(torch.uint8)[b.block_table[1, 0], 0, 1, 3] = code
            v.view(torch.uint8)[b.block_table[0, 290 // 64], 290 % 64, 0, 7] = code
            nan_k, nan_v = (slice(4, 5), 1, None), (slice(0, 4), 0, 7)
        else:  # varlen: sequence 1's key 0 (row 1); sequence 2's key 290 (row 18 + 290)
            k.view(torch.uint8)[1, 0, 3] = code
            v.view(torch.uint8)[18 + 290, 0, 7] = code
            nan_k, nan_v = (slice(4, 5), 0, None), (slice(5, 6), 0, 7)
        with on(arch):
            out = call(b, k, v, kw, case[7])[0]
        nan = torch.isnan(out.float())
        g = case[4][0] // case[4][1]
        rk, hk, _ = nan_k
        rv, hv, col = nan_v
        assert nan[rk, hk * g:(hk + 1) * g].all(), case
        assert nan[rv, hv * g:(hv + 1) * g, col].all(), case
        nan[rk, hk * g:(hk + 1) * g] = False
        nan[rv, hv * g:(hv + 1) * g, col] = False
        assert not nan.any(), case


def test_fp4_nan_scale_gives_nan_rows(runs):
    """An E8M0 0xFF scale on a K row or a V row: the rows of that sequence and head that see it are NaN (all their
    columns), the rest finite."""
    case = CASES[5]
    _, (b, k, v, kw, *_) = runs[str(case)]
    ks, vs_ = kw["k_scale"].clone(), kw["v_scale"].clone()
    ks[b.block_table[1, 0], 0, 1] = kvquant.E8M0_NAN  # sequence 1's only key, K/V head 1
    vs_[b.block_table[2, 290 // 16], 290 % 16, 0] = kvquant.E8M0_NAN  # sequence 2's key 290, head 0 (seen)
    with on():
        out = call(b, k, v, dict(kw, k_scale=ks, v_scale=vs_), case[7])[0]
    nan = torch.isnan(out.float())
    assert nan[4, 1].all() and nan[5, 0].all()
    nan[4, 1] = False
    nan[5, 0] = False
    assert not nan.any()


def test_bad_metadata_stays_inside_the_tensors(runs):
    """Bad cu_seqlens_k (varlen FP8: decreasing, past the total, negative) and bad block-table ids (paged FP4:
    negative, past the pool): the launches complete, the emulator failing any access outside the cache, its scales
    and descales."""
    _, (b, k, v, kw, *_) = runs[str(CASES[1])]
    t_k = k.shape[0]
    with on(tail_split=2):
        for cu_k in ([0, 1, 0, t_k], [0, 5, t_k + 40, t_k + 999], [-7, 2 ** 31 - 1, -3, 5]):
            bad = vs.Batch(b.q, b.k, b.v, b.cu_q, torch.tensor(cu_k, dtype=torch.int32), b.max_q, b.max_k)
            out, lse = call(bad, k, v, kw, CASES[1][7])
            assert out.shape == b.q.shape
    _, (b, k, v, kw, *_) = runs[str(CASES[5])]
    n = k.shape[0]
    for ids in ((-1, -(2 ** 31)), (n, 2 ** 31 - 1)):
        table = b.block_table.clone()
        table[0, 0], table[2, 5] = ids
        with on():
            call(vs.Batch(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, table), k, v, kw, CASES[5][7])
