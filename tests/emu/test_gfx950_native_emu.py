"""The FP4 cache's native path on gfx950 (kv_cache_dtype "fp4_e2m1_native", the manifest's gfx950_decode entry: the
gfx942 decode kernel reading K's FP4 codes through v_mfma_scale_f32_16x16x128_f8f6f4 with q quantized to FP8 E4M3 per
(row, head)), on the gfx950 wave emulator. Its function is attention with q replaced by kvquant.quantize_q_fp8's
values over the exactly dequantized cache (docs/numerics.md §10, "the native path"): the accuracy rule against the
fp64 reference and R of that q; the opt-in changes the numerics (the same call is off the rule against the
unquantized q), the LUT path stays the default; every bucket (64 and 96 with a lane's upper k zeros, 192 with a
second MFMA half zeros), both dtypes, Sq 1..16, GQA 1 / 4 / 8 / 32, KV lengths 1, 17, 300, pages of 16 and 64
shuffled, causal and windows; forced splits the same bits run to run; a q row holding NaN (scale 0xFF) and K's 0xFF
scales give NaN rows; flash_attn_with_kvcache appends into the cache and attends natively; calls the path does not
serve (another arch, more than 16 query rows) are refused by name. Every call is masked and rounds to nearest even."""
import contextlib
import os

import pytest
import torch

import rtcattn
import varlen_suite as vs
from rtcattn.ops.attention_fwd import kvquant, reference as ref, validate
from rtcattn.runtime import dispatch
from test_gfx942_decode_kvquant_emu import same_bits
from test_kvquant_emu import check, hnd

pytestmark = pytest.mark.emu

KERNEL = "gfx950_decode"
CUS = dispatch.emulated_cus("gfx950-emu")
CAUSAL = (-1, 0)
BF16, F16 = torch.bfloat16, torch.float16
NATIVE = "fp4_e2m1_native"


@contextlib.contextmanager
def on(arch="gfx950", **pins):
    """The calls inside run on the emulated arch (gfx950 unless named) with the native kernel pinned, or `kernel`."""
    before = os.environ.get("RTCATTN_EMULATE")
    os.environ["RTCATTN_EMULATE"] = arch
    pins.setdefault("kernel", KERNEL)
    try:
        with dispatch.pinned(num_cus=CUS, **pins):
            yield
    finally:
        if before is None:
            del os.environ["RTCATTN_EMULATE"]
        else:
            os.environ["RTCATTN_EMULATE"] = before


# (dtype, page, d, (Hq, Hk), lens_q, lens_k, window)
CASES = [
    (BF16, 16, 128, (8, 2), [1, 4], [17, 300], CAUSAL),
    (F16, 64, 64, (8, 1), [4, 1, 1], [1, 17, 300], (37, 0)),
    (BF16, 64, 256, (2, 2), [1, 4], [300, 17], CAUSAL),
    (F16, 16, 160, (4, 1), [16, 1], [300, 40], CAUSAL),
    (BF16, 16, 72, (32, 1), [1, 2], [300, 1], (50, 0)),
]
IDS = [f"{'bf16' if c[0] == BF16 else 'fp16'}-page{c[1]}-d{c[2]}-g{c[3][0] // c[3][1]}" for c in CASES]


def native(case, seed=0):
    """(batch, K and V FP4 pools in AITER's layout, the call's keywords, the fp64 dequantized K and V, q quantized the
    kernel's way in q's dtype: exact here)."""
    dtype, page, d, (hq, hk), lens_q, lens_k, _ = case
    b = vs.to_paged(vs.make_batch(lens_q, lens_k, hq, hk, d, "cpu", seed=seed + d, dtype=dtype), page, seed=seed + page)
    (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
    k, v = hnd(kp), hnd(vp)
    kw = dict(kv_cache_dtype=NATIVE, k_scale=ks, v_scale=vs_)
    kdq, vdq = ref.dequantize_cache(k, NATIVE, ks), ref.dequantize_cache(v, NATIVE, vs_)
    qdq = kvquant.dequantize_q_fp8(*kvquant.quantize_q_fp8(b.q))
    qn = qdq.to(dtype)
    assert torch.equal(qn.to(torch.float64), qdq), "the quantized q is a value of q's dtype here"
    return b, k, v, kw, kdq, vdq, qn


def call(b, k, v, kw, window, q=None):
    return rtcattn.forward_varlen(b.q if q is None else q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                  window_size=window, block_table=b.block_table, **kw)


@pytest.fixture(scope="module")
def runs():
    out = {}
    for case in CASES:
        inputs = native(case)
        b, k, v, kw = inputs[:4]
        with on():
            out[str(case)] = (call(b, k, v, kw, case[6]), inputs)
    return out


def test_the_cases_cover_the_issue():
    assert {c[0] for c in CASES} == {BF16, F16} and {c[1] for c in CASES} == {16, 64}
    buckets = {64, 96, 128, 192, 256}
    assert {min(b for b in buckets if b >= c[2]) for c in CASES} == buckets
    assert {c[3][0] // c[3][1] for c in CASES} >= {1, 4, 8, 32}
    assert {n for c in CASES for n in c[4]} >= {1, 16} and {n for c in CASES for n in c[5]} >= {1, 17, 300}
    assert CAUSAL in {c[6] for c in CASES} and {c[6] for c in CASES} - {CAUSAL}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_the_reference_of_the_quantized_q(case, runs):
    """The accuracy rule with q quantized as the kernel does (kvquant.quantize_q_fp8), and dispatch (unpinned) picks
    the native kernel and its variant for the opt-in."""
    (out, lse), (b, k, v, kw, kdq, vdq, qn) = runs[str(case)]
    with on(kernel=None):
        sel = rtcattn.ops.attention_fwd.selection_varlen(
            b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=case[6], block_table=b.block_table,
            quant=validate.KvQuant(NATIVE, k_scale=kw["k_scale"], v_scale=kw["v_scale"]))
    assert sel.kernel.name == KERNEL and sel.variant["kv_dtype"] == NATIVE, sel
    check(out, lse, qn, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[6], tag=str(case))


def test_the_opt_in_changes_the_numerics_and_the_lut_path_stays_the_default(runs):
    """The same cache read as "fp4_e2m1" on gfx950 goes to the LUT path (gfx942_decode) and meets the rule against the
    unquantized q; the native output is off that rule (q lost bits) and differs from it."""
    case = CASES[0]
    (out, lse), (b, k, v, kw, kdq, vdq, qn) = runs[str(case)]
    lut_kw = dict(kw, kv_cache_dtype="fp4_e2m1")
    with on(kernel=None):
        sel = rtcattn.ops.attention_fwd.selection_varlen(
            b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=case[6], block_table=b.block_table,
            quant=validate.KvQuant("fp4_e2m1", k_scale=kw["k_scale"], v_scale=kw["v_scale"]))
        assert sel.kernel.name == "gfx942_decode" and sel.variant["kv_dtype"] == "fp4_e2m1", sel
        lut = call(b, k, v, lut_kw, case[6])
    check(*lut, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[6], tag="LUT path")
    with pytest.raises(AssertionError, match="2\\*err"):
        check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[6], tag="native vs unquantized q")
    assert not torch.equal(out, lut[0])


def test_forced_splits_repeat_bit_for_bit(runs):
    """One part and 3 parts, each meeting the rule, each the same bits run to run."""
    case = CASES[2]
    _, (b, k, v, kw, kdq, vdq, qn) = runs[str(case)]
    for n in (1, 3):
        with on(tail_split=n):
            first, again = call(b, k, v, kw, case[6]), call(b, k, v, kw, case[6])
        same_bits(first, again, n)
        check(*first, qn, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[6], tag=f"splits={n}")


def test_nan_in_q_and_nan_scales_in_k_give_nan_rows(runs):
    """A NaN in q row r (head h): its E8M0 scale is 0xFF and the row's scores are NaN, so exactly that output row is
    NaN; an E8M0 0xFF K scale at key j: the rows that see key j are NaN. The other rows stay as they were."""
    case = CASES[0]
    (base, _), (b, k, v, kw, *_) = runs[str(case)]
    q = b.q.clone()
    q[2, 3, 5] = float("nan")  # sequence 1 (rows 1..4), its second row, head 3
    with on():
        out = call(b, k, v, kw, case[6], q=q)[0]
    bad = torch.isnan(out.float()).any(dim=-1)
    want = torch.zeros_like(bad)
    want[2, 3] = True
    assert torch.equal(bad, want), bad.nonzero().tolist()
    assert torch.isnan(out[2, 3].float()).all()
    keep = ~want.unsqueeze(-1).expand_as(out)
    assert torch.equal(out[keep], base[keep])
    ks = kw["k_scale"].clone()
    ks[b.block_table[0, 0], 5, 1] = 0xFF  # sequence 0's key 5, K/V head 1 (q heads 4..7): its one row sees it
    with on():
        out = call(b, k, v, dict(kw, k_scale=ks), case[6])[0]
    bad = torch.isnan(out.float()).any(dim=-1)
    want = torch.zeros_like(bad)
    want[0, 4:8] = True
    assert torch.equal(bad, want), bad.nonzero().tolist()


def test_flash_attn_with_kvcache_appends_and_attends_natively():
    """flash_attn_with_kvcache over an FP4 paged cache with kv_cache_dtype "fp4_e2m1_native": the new rows are
    appended with quantize_kv's bytes and scales (as the LUT path's call), and the attention is the native path's
    (the same output as forward_varlen over the appended cache, pinned)."""
    torch.manual_seed(4)
    bsz, hq, hk, d, page, blocks = 2, 8, 2, 128, 16, 8
    pool = torch.randn(blocks, page, hk, d).to(BF16)
    (kp, ks), (vp, vs_) = kvquant.quantize_fp4(pool), kvquant.quantize_fp4(pool * 0.5)
    kc, vc = hnd(kp).contiguous(), hnd(vp).contiguous()
    table = torch.tensor([[3, 1, 6, 0], [2, 5, 7, 4]], dtype=torch.int32)
    seqlens = torch.tensor([20, 33], dtype=torch.int32)
    q = torch.randn(bsz, 1, hq, d).to(BF16)
    kn, vn = torch.randn(bsz, 1, hk, d).to(BF16), torch.randn(bsz, 1, hk, d).to(BF16)
    caches = {}
    for name in (NATIVE, "fp4_e2m1"):
        kc_, vc_, ks_, vs2 = kc.clone(), vc.clone(), ks.clone(), vs_.clone()
        with on(kernel=None):
            out = rtcattn.flash_attn_with_kvcache(q, kc_, vc_, kn, vn, cache_seqlens=seqlens, block_table=table,
                                                  causal=True, kv_cache_dtype=name, k_scale=ks_, v_scale=vs2)
        caches[name] = (out, kc_, vc_, ks_, vs2)
    out, kc_, vc_, ks_, vs2 = caches[NATIVE]
    for a, b_ in zip(caches[NATIVE][1:], caches["fp4_e2m1"][1:]):
        assert torch.equal(a, b_), "the append writes the same bytes and scales either way"
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_k = torch.tensor([0, 21, 55], dtype=torch.int32)
    with on():
        want = rtcattn.forward_varlen(q.view(bsz, hq, d), kc_, vc_, cu_q, cu_k, 1, 34, causal=True, block_table=table,
                                      kv_cache_dtype=NATIVE, k_scale=ks_, v_scale=vs2)
    assert torch.equal(ref.bf16_bits(out.view(bsz, hq, d)), ref.bf16_bits(want))
    assert not torch.equal(out, caches["fp4_e2m1"][0])


@pytest.mark.parametrize("arch,rows,needle", [("gfx942", 1, "arch gfx942-emu not in ['gfx950', 'gfx950-emu']"),
                                              ("gfx950", 17, "max_seqlen_q=17 is not accepted by the gfx950_decode")])
def test_calls_the_native_path_does_not_serve_are_refused_by_name(arch, rows, needle):
    """The opt-in is the gfx950 decode kernel's: on another arch, or with more than 16 query rows a sequence, no
    kernel serves kv_dtype 'fp4_e2m1_native' and the call is refused before anything runs, saying why."""
    case = (BF16, 16, 128, (8, 2), [rows, 2], [40, 30], CAUSAL)
    b, k, v, kw, *_ = native(case)
    with on(arch, kernel=None), pytest.raises(ValueError, match="kv_dtype='fp4_e2m1_native'") as e:
        call(b, k, v, kw, CAUSAL)
    assert needle in str(e.value), str(e.value)
