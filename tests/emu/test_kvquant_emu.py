"""Quantized KV caches (FP8 E4M3 / E4M3 FNUZ with descales, FP4 E2M1 + E8M0) on the emulated gfx942: the baseline
kernel (pinned where a test means it: every arch's reference; the gfx942 kernels' own tests are
test_gfx942_decode_kvquant_emu.py and test_gfx942_kvquant_emu.py) and dispatch's pick, through forward_varlen,
flash_attn_varlen_func and flash_attn_with_kvcache, against the fp64 reference over the exactly dequantized cache
with the accuracy rule of the other emulator tests (err <= 2 err(R) + 1e-5, R on the dequantized cache; normwise
bound; LSE within 1e-4), the special values of docs/numerics.md §10, and the append's bytes against
rtcattn.quantize_kv."""
import math

import pytest
import torch

import rtcattn
import varlen_suite as vs
from numerics_suite import NORMWISE_BOUND
from rtcattn.ops.attention_fwd import kvquant, reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz}


@pytest.fixture(autouse=True)
def emulated(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def hnd(t: torch.Tensor) -> torch.Tensor:
    """A paged pool [num_pages, page, Hk, X] as the FP4 cache's HND layout [num_pages, Hk, page, X]."""
    return t.permute(0, 2, 1, 3).contiguous()


def descales(kind: str, b: int, hk: int, seed: int):
    """(k_descale, v_descale): None, one element, or per (sequence, head) [B, Hk] in [0.25, 2)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None, None
    shape = (1,) if kind == "tensor" else (b, hk)
    return tuple(torch.rand(shape, generator=gen) * 1.75 + 0.25 for _ in range(2))


def check(out, lse, q, kdq, vdq, cu_q, cu_k, table, window, kd=None, vd=None, mode="rtne", tag=""):
    """The accuracy rule over the dequantized cache (kdq / vdq: exact values, fp64), per sequence."""
    args = (q, kdq, vdq, cu_q, cu_k)
    o64, lse64 = ref.reference_varlen(*args, None, None, window, table, kd, vd)
    r = ref.reference_varlen(*args, mode, None, window, table, kd, vd)
    err, nrm = ref.errors(out, o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all(), f"non-finite output from finite inputs: {tag}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    assert nrm < NORMWISE_BOUND[q.dtype], f"normwise error {nrm:.3g}: {tag}"
    close = ref.lse_close(lse, lse64)
    assert bool(close.all()), f"LSE off at {int((~close).sum())} of {close.numel()}: {tag}"


# Every call here is masked (a window wider than every sequence where a test wants every key seen) and rounds to
# nearest even: one variant per (kv form, dtype, cache format), each compiled once for the whole file (CI time).
EVERY_KEY = (100, 100)
# (kv_dtype, paged, (Hq, Hk), lens_q, lens_k, window, descales, dtype): Sq 1 (decode-style) and > 16 (prefill-style)
CASES = [
    ("fp8_e4m3", True, (4, 2), [1, 20], [40, 70], (-1, 0), "head", torch.bfloat16),
    ("fp8_e4m3", False, (2, 2), [17, 3], [33, 50], EVERY_KEY, "tensor", torch.float16),
    ("fp8_e4m3fnuz", False, (4, 1), [1, 18], [35, 18], (8, 0), "head", torch.bfloat16),
    ("fp4_e2m1", True, (4, 2), [1, 20], [40, 70], (-1, 0), "none", torch.bfloat16),
    ("fp4_e2m1", True, (2, 1), [19, 1], [64, 21], (10, 3), "none", torch.float16),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{'paged' if c[1] else 'varlen'}-{c[6]}" for c in CASES])
def test_quantized_cache_against_the_dequantized_reference(case):
    kv_dtype, paged, (hq, hk), lens_q, lens_k, window, kind, dtype = case
    b = vs.make_batch(lens_q, lens_k, hq, hk, 64, "cpu", seed=len(lens_q) + hq, dtype=dtype)
    if paged:
        b = vs.to_paged(b, 16, seed=hk)
    kd, vd = descales(kind, len(lens_q), hk, seed=hq)
    kw, table = {}, b.block_table
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
        k, v = hnd(kp), hnd(vp)
        kw = dict(kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs_)
        kdq, vdq = ref.dequantize_cache(k, "fp4_e2m1", ks), ref.dequantize_cache(v, "fp4_e2m1", vs_)
    else:
        one = torch.ones(())
        k, v = kvquant.quantize_fp8(b.k, one, FP8[kv_dtype]), kvquant.quantize_fp8(b.v, one, FP8[kv_dtype])
        kw = dict(k_descale=kd, v_descale=vd)
        kdq, vdq = ref.dequantize_cache(k), ref.dequantize_cache(v)
    with dispatch.pinned(kernel="baseline"):
        out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                          window_size=window, block_table=table, **kw)
    check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, table, window, kd, vd, tag=str(case))
    # Unpinned, these calls (more than 16 query rows in a sequence) go to the gfx942 prefill kernel.
    sel = rtcattn.ops.attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=window,
                                                     block_table=table, quant=_quant(kw))
    assert sel.kernel.name == "gfx942" and sel.variant["kv_dtype"] == kv_dtype, sel
    if kv_dtype == "fp4_e2m1":
        # Its scales are powers of two, applied exactly: the same bits as the baseline on the dequantized cache
        # (every E2M1 value times its scale here is a bf16 / fp16 value).
        with dispatch.pinned(kernel="baseline"):
            o2, l2 = rtcattn.forward_varlen(b.q, kdq.to(dtype), vdq.to(dtype), b.cu_q, b.cu_k, b.max_q, b.max_k,
                                            return_lse=True, window_size=window, block_table=table)
        assert torch.equal(ref.bf16_bits(out), ref.bf16_bits(o2)) and torch.equal(lse, l2), case


def _quant(kw):
    from rtcattn.ops.attention_fwd import validate
    return validate.KvQuant(kw.get("kv_cache_dtype", "auto"), kw.get("k_descale"), kw.get("v_descale"),
                            kw.get("k_scale"), kw.get("v_scale"))


def test_fp8_power_of_two_descales_equal_the_dequantized_cache():
    """With power-of-two descales the baseline's fp32 multiplies (scores by k_descale, O by v_descale) are exact: the
    same bits as the bf16 baseline on the dequantized cache (numerics §10: per score / per output equals per element
    then)."""
    b = vs.to_paged(vs.make_batch([1, 20], [40, 70], 4, 2, 64, "cpu", seed=9), 16)
    k, v = (kvquant.quantize_fp8(t, torch.ones(())) for t in (b.k, b.v))
    kd, vd = torch.tensor([[0.5, 4.0], [0.125, 2.0]]), torch.tensor([0.25])
    args = (b.cu_q, b.cu_k, b.max_q, b.max_k)
    with dispatch.pinned(kernel="baseline"):
        out, lse = rtcattn.forward_varlen(b.q, k, v, *args, return_lse=True, window_size=(-1, 0),
                                          block_table=b.block_table, k_descale=kd, v_descale=vd)
    kdq = torch.stack([ref.descaled(ref.dequantize_cache(k), kd, s) for s in range(2)])  # per sequence's pages
    used = b.block_table[1, :-(-70 // 16)].long()  # sequence 1's pages (past them, its row holds junk ids)
    k_pool = kdq[0].clone()
    k_pool[used] = kdq[1][used]  # the sequences' pages are disjoint: each with its own descales
    with dispatch.pinned(kernel="baseline"):
        o2, l2 = rtcattn.forward_varlen(b.q, k_pool.to(torch.bfloat16), (ref.dequantize_cache(v) * 0.25).to(
            torch.bfloat16), *args, return_lse=True, window_size=(-1, 0), block_table=b.block_table)
    assert torch.equal(ref.bf16_bits(out), ref.bf16_bits(o2)) and torch.equal(lse, l2)


def test_aiter_entry_takes_the_same_caches():
    """flash_attn_varlen_func (AITER's) with an FP8 cache and its descales: forward_varlen's bits."""
    b = vs.to_paged(vs.make_batch([3, 17], [30, 45], 4, 2, 64, "cpu", seed=5), 16)
    k, v = (kvquant.quantize_fp8(t, torch.ones(())) for t in (b.k, b.v))
    kd, vd = descales("head", 2, 2, seed=3)
    args = (b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k)
    got = rtcattn.flash_attn_varlen_func(*args, causal=True, how_v3_bf16_cvt=0, block_table=b.block_table,
                                         k_descale=kd, v_descale=vd)
    want = rtcattn.forward_varlen(*args, causal=True, block_table=b.block_table, k_descale=kd, v_descale=vd)
    assert torch.equal(ref.bf16_bits(got), ref.bf16_bits(want))


def _special_batch(kv_dtype):
    """Two sequences (3 and 2 query rows, 20 keys each, Hq = Hk = 2); FP8 as varlen (E4M3 fp16, FNUZ bf16: the
    variants of CASES), FP4 paged."""
    dtype = torch.float16 if kv_dtype == "fp8_e4m3" else torch.bfloat16
    b = vs.make_batch([3, 2], [20, 20], 2, 2, 64, "cpu", seed=7, dtype=dtype)
    if kv_dtype == "fp4_e2m1":
        b = vs.to_paged(b, 16)
    return b


def test_fp8_nan_codes_reach_the_rows_that_read_them():
    """An FP8 NaN code (E4M3 S.1111.111; FNUZ 0x80) in K row j: every row of that sequence and head that sees key j is
    NaN; in V[j, d]: column d of those rows. Other sequences and heads stay finite. (E4M3 has no Inf code.)"""
    for kv_dtype, nan_code in (("fp8_e4m3", 0x7F), ("fp8_e4m3fnuz", 0x80)):
        b = _special_batch(kv_dtype)
        k, v = (kvquant.quantize_fp8(t, torch.ones(()), FP8[kv_dtype]) for t in (b.k, b.v))
        k.view(torch.uint8)[5, 1, 3] = nan_code   # sequence 0 (rows 0..19), K/V head 1, key 5
        v.view(torch.uint8)[25, 0, 7] = nan_code  # sequence 1, head 0, key 5, column 7
        out = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window_size=EVERY_KEY)
        nan = torch.isnan(out.float())
        assert nan[0:3, 1].all() and nan[3:5, 0, 7].all(), kv_dtype
        nan[0:3, 1] = False
        nan[3:5, 0, 7] = False
        assert not nan.any(), kv_dtype


def test_fp4_nan_scale_gives_nan_rows():
    """An E8M0 0xFF (NaN) scale on key row j: every row of that sequence and head that sees key j is NaN, for a K
    scale and for a V scale (its whole row of V is NaN); the others stay finite."""
    b = _special_batch("fp4_e2m1")
    (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
    t = b.block_table
    ks[t[0, 0], 4, 1] = kvquant.E8M0_NAN  # sequence 0's key 4, K/V head 1
    vs_[t[1, 1], 2, 0] = kvquant.E8M0_NAN  # sequence 1's key 18, head 0
    out = rtcattn.forward_varlen(b.q, hnd(kp), hnd(vp), b.cu_q, b.cu_k, b.max_q, b.max_k, block_table=t,
                                 window_size=EVERY_KEY, kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs_)
    nan = torch.isnan(out.float())
    assert nan[0:3, 1].all() and nan[3:5, 0].all()
    nan[0:3, 1] = False
    nan[3:5, 0] = False
    assert not nan.any()


def _kvcache_inputs(kv_dtype, sq, seed=0):
    """Caches for 2 sequences (Hk 2), appending 3 rows each: FP8 contiguous [4, 48, 2, 64] with per (sequence, head)
    descales and fp16 new rows, or FP4 paged (HND, 16-row pages, a shuffled table) with its scales and bf16 rows."""
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float16 if kv_dtype == "fp8_e4m3" else torch.bfloat16
    rnd = lambda *s: torch.randn(s, generator=gen).to(dtype)  # noqa: E731
    seqlens = torch.tensor([5 if sq == 1 else 20, 30], dtype=torch.int32)  # every row sees a key
    new = dict(k=rnd(2, 3, 2, 64), v=rnd(2, 3, 2, 64), cache_seqlens=seqlens)
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(rnd(9, 16, 2, 64)), kvquant.quantize_fp4(rnd(9, 16, 2, 64))
        table = torch.randperm(9, generator=gen)[:6].view(2, 3).to(torch.int32)
        return new, dict(k_cache=hnd(kp), v_cache=hnd(vp), block_table=table, kv_cache_dtype="fp4_e2m1",
                         k_scale=ks, v_scale=vs_)
    kd, vd = descales("head", 2, 2, seed)
    kc, vc = (kvquant.quantize_fp8(rnd(4, 48, 2, 64), torch.ones(())) for _ in range(2))
    return new, dict(k_cache=kc, v_cache=vc, k_descale=kd, v_descale=vd)


@pytest.mark.parametrize("sq", [1, 17])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp4_e2m1"])
def test_kvcache_appends_quantize_kv_bytes_and_attends(kv_dtype, sq):
    """flash_attn_with_kvcache into a quantized cache: the appended rows hold quantize_kv's bytes (FP8 with the call's
    descales; FP4 with each row's scale), every other byte is unchanged, and the output meets the accuracy rule over
    the dequantized cache after the append."""
    new, cache = _kvcache_inputs(kv_dtype, sq, seed=sq)
    q = torch.randn(2, sq, 4, 64, generator=torch.Generator().manual_seed(1)).to(new["k"].dtype)
    before = {n: cache[n].view(torch.uint8).clone() for n in ("k_cache", "v_cache", "k_scale", "v_scale") if n in cache}
    out, lse = rtcattn.flash_attn_with_kvcache(q, **cache, **new, causal=True, return_softmax_lse=True,
                                               how_v3_bf16_cvt=0)
    fp4 = kv_dtype == "fp4_e2m1"
    if fp4:
        (kq, vq, kqs, vqs) = rtcattn.quantize_kv(new["k"], new["v"], "fp4_e2m1")
    else:
        (kq, vq), kqs, vqs = rtcattn.quantize_kv(new["k"], new["v"], k_descale=cache["k_descale"],
                                                 v_descale=cache["v_descale"]), None, None
    for b, start in enumerate(new["cache_seqlens"].tolist()):
        for i in range(3):
            r = start + i
            for name, want, swant in (("k_cache", kq, kqs), ("v_cache", vq, vqs)):
                if fp4:
                    page = cache["block_table"][b, r // 16]
                    got = cache[name][page, :, r % 16]
                    sname = name[0] + "_scale"
                    assert torch.equal(cache[sname][page, r % 16], swant[b, i]), (name, b, i)
                    before[sname][page, r % 16] = swant[b, i]
                    before[name][page, :, r % 16] = want[b, i].view(torch.uint8)
                else:
                    got = cache[name][b, r]
                    before[name][b, r] = want[b, i].view(torch.uint8)
                assert torch.equal(got.view(torch.uint8), want[b, i].view(torch.uint8)), (name, b, i)
    for n, t in before.items():  # and nothing else was written
        assert torch.equal(cache[n].view(torch.uint8), t), n
    if fp4:
        kdq = ref.dequantize_cache(cache["k_cache"], "fp4_e2m1", cache["k_scale"])
        vdq = ref.dequantize_cache(cache["v_cache"], "fp4_e2m1", cache["v_scale"])
        extra = dict(block_table=cache["block_table"])
    else:
        kdq, vdq = ref.dequantize_cache(cache["k_cache"]), ref.dequantize_cache(cache["v_cache"])
        extra = dict(k_descale=cache["k_descale"], v_descale=cache["v_descale"])
    seqlens = new["cache_seqlens"] + 3
    _, (o64, lse64) = ref.reference_kvcache(q, kdq, vdq, cache_seqlens=seqlens, window=(-1, 0), **extra)
    _, r = ref.reference_kvcache(q, kdq, vdq, cache_seqlens=seqlens, window=(-1, 0), round_mode="rtne", **extra)
    err, nrm = ref.errors(out, o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all() and err <= 2 * err_r + 1e-5 and nrm < NORMWISE_BOUND[q.dtype], (
        err, err_r, nrm)
    assert bool(ref.lse_close(lse, lse64).all())
    assert not (lse64 == -math.inf).any()
