"""The sm_90a decode kernel over quantized KV caches (FP8 E4M3 with descales, FP4 E2M1 with E8M0 scales) on the GPU:
every format and dtype it lists, buckets 64, 128, 256 and a head dim below its bucket, packed rows (FP8) and shuffled
pages, Sq 1..16, GQA and MQA, causal and windows, per-(sequence, head) and per-tensor descales, splits forced on;
against the fp64 reference over the exactly dequantized cache with the accuracy rule (err <= 2 err(R) + 1e-5, R on
the dequantized cache; normwise bound; LSE within 1e-4), the kernel pinned and dispatch's pick asserted. E4M3's NaN
codes give NaN rows (K) and columns (V), an E8M0 0xFF scale NaN rows (K's and V's); NaN codes and scales in the rows
no sequence owns and bad page ids stay outside the result."""
import pytest

torch = pytest.importorskip("torch")

from test_kvquant_gpu import _check  # noqa: E402

import rtcattn  # noqa: E402
import varlen_suite as vs  # noqa: E402
from rtcattn.ops import attention_fwd  # noqa: E402
from rtcattn.ops.attention_fwd import kvquant, reference as ref, validate  # noqa: E402
from rtcattn.runtime import dispatch, manifest  # noqa: E402

pytestmark = pytest.mark.gpu

KERNEL = "sm90_decode"
DEV = "cuda"
BF16, F16 = torch.bfloat16, torch.float16
KV_DTYPES = [t for t in manifest.load().op(attention_fwd.OP).kernel(KERNEL).axes["kv_dtype"] if t != "same"]
E4M3_NAN = (0x7F, 0xFF)


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the sm90_decode kernel runs on sm_90a (H100/H200)")


def _hnd(t):
    return t.permute(0, 2, 1, 3).contiguous()


def _quantized(b: vs.Batch, kv_dtype: str, per_head: bool, seed: int):
    """(k, v, forward_varlen's quantized-cache arguments, k and v dequantized, k_descale, v_descale). FP4: pages in
    AITER's layout [num_blocks, Hk, page, D / 2] with scales [num_blocks, page, Hk]; no descales."""
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
        k, v = _hnd(kp), _hnd(vp)
        kw = dict(kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs_)
        return k, v, kw, ref.dequantize_cache(k, kv_dtype, ks), ref.dequantize_cache(v, kv_dtype, vs_), None, None
    assert kv_dtype == "fp8_e4m3", kv_dtype
    k, v = (kvquant.quantize_fp8(t, torch.ones((), device=DEV)) for t in (b.k, b.v))
    gen = torch.Generator().manual_seed(seed)
    shape = (b.cu_q.numel() - 1, b.k.shape[-2]) if per_head else (1,)
    kd, vd = ((torch.rand(shape, generator=gen) * 1.75 + 0.25).to(DEV) for _ in range(2))
    return k, v, dict(k_descale=kd, v_descale=vd), ref.dequantize_cache(k), ref.dequantize_cache(v), kd, vd


def _run(b: vs.Batch, k, v, kw, window, splits=0):
    """The call pinned to the decode kernel (no fallback), and dispatch's own pick for it."""
    quant = validate.KvQuant(kw.get("kv_cache_dtype", "auto"), kw.get("k_descale"), kw.get("v_descale"),
                             kw.get("k_scale"), kw.get("v_scale"))
    sel = attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=window,
                                         block_table=b.block_table, quant=quant)
    assert sel.kernel.name == KERNEL, sel.why
    with dispatch.pinned(kernel=KERNEL, tail_split=splits):
        out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                          window_size=window, block_table=b.block_table, **kw)
    torch.cuda.synchronize()
    return out, lse


# (head dim, lens_q, lens_k, Hq, Hk, window, per-(b, h) descales): buckets 64, 128, 256 and one head dim below its
# bucket (None: FP8 80 in bucket 96, FP4 224 in 256: TMA strides a row in multiples of 16 bytes), one to 16 query
# rows, GQA 4 and 8, MQA 32/1, KV lengths 1 .. 1000.
CASES = [
    (64, [1, 16, 3], [17, 300, 1], 8, 2, (-1, 0), True),
    (128, [1, 4], [1000, 129], 32, 8, (-1, 0), True),
    (128, [16, 2, 1], [40, 700, 64], 32, 1, (100, 0), False),
    (256, [1, 8], [300, 77], 8, 2, (-1, -1), True),
    (None, [5, 1], [260, 33], 4, 1, (-1, 0), False),
]
PADDED_D = {"fp8_e4m3": 80, "fp4_e2m1": 224}
# FP4 caches are paged only (the API's form: AITER's FP4 paged attention).
FORMS = [(t, paged) for t in KV_DTYPES for paged in (False, True) if paged or t != "fp4_e2m1"]


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kv_dtype,paged", FORMS, ids=[f"{t}-{'paged' if p else 'varlen'}" for t, p in FORMS])
@pytest.mark.parametrize("case", CASES, ids=[f"d{c[0] or 'pad'}-q{max(c[1])}-g{c[3] // c[4]}" for c in CASES])
def test_against_fp64_over_the_dequantized_cache(case, kv_dtype, paged, dtype):
    d, lens_q, lens_k, hq, hk, window, per_head = case
    d = d or PADDED_D[kv_dtype]
    b = vs.make_batch(lens_q, lens_k, hq, hk, d, DEV, seed=d + hq, dtype=dtype)
    if paged:
        b = vs.to_paged(b, 16 if d != 128 else 64, seed=d)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, per_head, seed=d)
    out, lse = _run(b, k, v, kw, window)
    _check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, window, kd, vd, f"{case} {kv_dtype} {dtype}")


@needs_hopper
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_forced_splits_meet_the_contract_and_repeat(kv_dtype):
    """One long sequence split in 1, 3 and 7 parts, each against fp64; 3 parts twice give the same bits."""
    b = vs.to_paged(vs.make_batch([2], [3000], 8, 2, 128, DEV, seed=5), 32, seed=5)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, True, seed=5)
    runs = {}
    for n in (1, 3, 7):
        runs[n] = _run(b, k, v, kw, (-1, 0), splits=n)
        _check(*runs[n], b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, (-1, 0), kd, vd, f"splits={n}")
    again = _run(b, k, v, kw, (-1, 0), splits=3)
    assert torch.equal(runs[3][0].view(torch.int16), again[0].view(torch.int16))
    assert torch.equal(runs[3][1].view(torch.int32), again[1].view(torch.int32))


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("code", E4M3_NAN)
def test_fp8_nan_codes_give_nan_rows_and_columns(code, dtype):
    """A NaN code in K (key 5 of sequence 0, K/V head 1): every row of that sequence and head is NaN, the rest finite.
    In V (key 9, column 37, same sequence and head): column 37 of those rows is NaN, their other columns and every
    other row finite. Both E4M3 NaN codes, both dtypes (bf16 places the bits and ORs NaN in; fp16 converts)."""
    b = vs.make_batch([3, 2], [20, 20], 4, 2, 128, DEV, seed=7, dtype=dtype)
    k, v, kw, *_ = _quantized(b, "fp8_e4m3", False, seed=7)
    kn = k.clone()
    kn.view(torch.uint8)[5, 1, 3] = code
    out, _ = _run(b, kn, v, kw, (-1, 0))
    nan = torch.isnan(out.float()).cpu()
    rows = (slice(0, 3), slice(2, 4))  # sequence 0's rows, q heads 2 and 3 of K/V head 1
    assert nan[rows].all()
    nan[rows] = False
    assert not nan.any()
    vn = v.clone()
    vn.view(torch.uint8)[9, 1, 37] = code
    out, _ = _run(b, k, vn, kw, (-1, 0))
    nan = torch.isnan(out.float()).cpu()
    assert nan[0:3, 2:4, 37].all()
    nan[0:3, 2:4, 37] = False
    assert not nan.any()


def _poison_unowned_rows(b: vs.Batch, k, v, kw):
    """NaN in every pool row no sequence owns (page tails, spare pages): E4M3's NaN code in its bytes, FP4's in its
    E8M0 scales. The kernel must mask them (K) and zero them (V), and never read an FP4 scale past a sequence."""
    page = b.k.shape[1]
    owned = torch.zeros((b.k.shape[0], page), dtype=torch.bool)
    for s, n in enumerate((b.cu_k[1:] - b.cu_k[:-1]).tolist()):
        for j in range(n):
            owned[int(b.block_table[s, j // page]), j % page] = True
    if "k_scale" in kw:
        for name in ("k_scale", "v_scale"):
            kw[name][~owned.to(DEV)] = 0xFF
        return
    for t in (k, v):
        t.view(torch.uint8)[~owned.to(DEV)] = 0x7F


@needs_hopper
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("splits", [0, 3])
def test_rows_past_the_sequences_and_bad_page_ids_stay_outside(kv_dtype, splits):
    """NaN codes in every row no sequence owns leave the output finite and within the contract; block-table entries
    outside the pool (-1, num_pages, 2^31 - 1) read as zeros: the call completes, finite, its output shaped as asked
    (compute-sanitizer runs the same kind of call in tests/gpu/sanitizer_smoke.py)."""
    b = vs.to_paged(vs.make_batch([5, 16, 9], [100, 60, 130], 8, 2, 128, DEV, seed=8), 16, seed=8)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, True, seed=8)
    _poison_unowned_rows(b, k, v, kw)
    out, lse = _run(b, k, v, kw, (-1, 0), splits)
    if kv_dtype == "fp8_e4m3":  # the NaN codes are in the bytes (FP4's, in the scales, dequantize to NaN rows)
        kdq, vdq = ref.dequantize_cache(k), ref.dequantize_cache(v)
    _check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, (-1, 0), kd, vd, "poisoned spare rows")
    n = k.shape[0]  # pages of the pool
    for bad in (-1, n, 2 ** 31 - 1):
        table = b.block_table.clone()
        table[1, 1], table[2, 0] = bad, bad
        bb = vs.Batch(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, table)
        out, _ = _run(bb, k, v, kw, (-1, 0), splits)
        assert out.shape == b.q.shape and torch.isfinite(out.float()).all(), bad


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_fp4_nan_scales_give_nan_rows(dtype):
    """An E8M0 0xFF scale of K (key 5 of sequence 0, K/V head 1): every row of that sequence and head is NaN, the rest
    finite; of V (key 9): the same rows are NaN in every column (the scale multiplies p), the rest finite."""
    b = vs.to_paged(vs.make_batch([3, 2], [20, 20], 4, 2, 128, DEV, seed=9, dtype=dtype), 16, seed=9)
    k, v, kw, *_ = _quantized(b, "fp4_e2m1", False, seed=9)
    for name, key in (("k_scale", 5), ("v_scale", 9)):
        bad = dict(kw, **{name: kw[name].clone()})
        bad[name][int(b.block_table[0, key // 16]), key % 16, 1] = 0xFF
        out, _ = _run(b, k, v, bad, (-1, 0))
        nan = torch.isnan(out.float()).cpu()
        assert nan[0:3, 2:4].all(), name
        nan[0:3, 2:4] = False
        assert not nan.any(), name
