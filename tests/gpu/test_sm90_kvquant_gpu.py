"""The sm_90a prefill kernel (sm90) over quantized KV caches (FP8 E4M3 with descales, FP4 E2M1 with E8M0 scales) on the
GPU: the calls of more than 16 query rows a sequence (chunked prefill: K longer than Q), every format the API takes
(FP8 varlen and paged, FP4 paged), bf16 and fp16, buckets 64, 128, 256 and a head dim below its bucket, GQA 4 and 8
and MQA, causal, sliding windows and no mask, per-(sequence, head) and per-tensor descales, shuffled pages of 16 to
256 rows; against the fp64 reference over the exactly dequantized cache with the accuracy rule (err <= 2 err(R) +
1e-5, R on the dequantized cache; normwise bound; LSE within 1e-4: test_kvquant_gpu._check), the kernel pinned and
dispatch's pick asserted. E4M3's NaN codes and E8M0 0xFF scales reach exactly the rows that keep their key (a NaN in
V also the rows of the same sequence that docs/numerics.md §8 allows: its column of them, FP4 all columns); NaN codes
and scales in the rows no sequence owns change no bit; page ids outside the pool read zeros; the same call twice
gives the same bits."""
import pytest

torch = pytest.importorskip("torch")

from test_kvquant_gpu import _check  # noqa: E402
from test_sm90_decode_kvquant_gpu import E4M3_NAN, PADDED_D, _poison_unowned_rows, _quantized  # noqa: E402

import rtcattn  # noqa: E402
import varlen_suite as vs  # noqa: E402
from rtcattn.ops import attention_fwd  # noqa: E402
from rtcattn.ops.attention_fwd import kvquant, reference as ref, validate  # noqa: E402
from rtcattn.runtime import dispatch, manifest  # noqa: E402

pytestmark = pytest.mark.gpu

KERNEL = "sm90"
DEV = "cuda"
BF16, F16 = torch.bfloat16, torch.float16
# Not read from the manifest: a manifest that lost a format must fail here (test_the_cases_cover_the_issue), not
# leave its tests out.
KV_DTYPES = ("fp8_e4m3", "fp4_e2m1")
CAUSAL, FULL = (-1, 0), (-1, -1)
MAX_DECODE_Q = 16  # dispatch gives calls of at most this many query rows a sequence to sm90_decode


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the sm90 kernel runs on sm_90a (H100/H200)")


def _quant(kw) -> validate.KvQuant:
    return validate.KvQuant(kw.get("kv_cache_dtype", "auto"), kw.get("k_descale"), kw.get("v_descale"),
                            kw.get("k_scale"), kw.get("v_scale"))


def _kv_dtype(kw) -> str:
    return "fp4_e2m1" if kw.get("kv_cache_dtype") == "fp4_e2m1" else "fp8_e4m3"


def _selection(b: vs.Batch, k, v, kw, window):
    return attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=window,
                                          block_table=b.block_table, quant=_quant(kw))


def _run(b: vs.Batch, k, v, kw, window):
    """The call pinned to the sm90 kernel (no fallback), and dispatch's own pick for it asserted."""
    sel = _selection(b, k, v, kw, window)
    assert sel.kernel.name == KERNEL and sel.variant["kv_dtype"] == _kv_dtype(kw), (sel.kernel.name, sel.why)
    with dispatch.pinned(kernel=KERNEL):
        out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                          window_size=window, block_table=b.block_table, **kw)
    torch.cuda.synchronize()
    return out, lse


def _same_bits(a, b, tag):
    assert torch.equal(a[0].view(torch.int16), b[0].view(torch.int16)), f"output bits differ: {tag}"
    assert torch.equal(a[1].view(torch.int32), b[1].view(torch.int32)), f"LSE bits differ: {tag}"


# (head dim, lens_q, lens_k, Hq, Hk, window, per-(b, h) descales, page): buckets 64, 128, 256 and one head dim below
# its bucket (None: FP8 80 in bucket 96, FP4 224 in 256, as the decode test), 17 to 300 query rows, K longer than Q
# (chunked prefill) and equal, KV lengths not a multiple of 128 (129, 777, 257) and of 1 to 5 keys (a few rows that see
# none under the mask), GQA 4 and 8, MQA 32/1 and 8/1, causal, sliding windows and no mask, pages 16, 64, 128, 256.
CASES = [
    (64, [17, 300, 2], [17, 700, 3], 8, 2, CAUSAL, True, 16),
    (128, [200, 40], [1000, 129], 32, 8, CAUSAL, True, 64),
    (128, [64, 150, 20], [64, 777, 5], 32, 1, (100, 0), False, 128),
    (256, [33, 130, 5], [300, 130, 257], 16, 2, FULL, True, 64),
    (None, [100, 17], [260, 1], 8, 1, (37, 5), False, 256),
]
# FP4 caches are paged only (the API's form: AITER's FP4 paged attention).
FORMS = [(t, paged) for t in KV_DTYPES for paged in (False, True) if paged or t != "fp4_e2m1"]


def _bucket(d: int) -> int:
    return next(b for b in manifest.load().op(attention_fwd.OP).kernel(KERNEL).axes["head_dim"].buckets if b >= d)


def test_the_cases_cover_the_issue():
    """The manifest lists both formats for sm90; every bucket asked for and one head dim below its own; prefill-sized
    sequences, K longer than Q, KV lengths off 128 and of a few keys; GQA 4 / 8 and MQA; each mask kind; both descale
    kinds; pages 16, 64 and a larger one."""
    axes = manifest.load().op(attention_fwd.OP).kernel(KERNEL).axes
    assert set(KV_DTYPES) <= set(axes["kv_dtype"]), axes["kv_dtype"]
    dims = {c[0] for c in CASES if c[0]} | set(PADDED_D.values())
    assert {64, 128, 256} <= dims and any(_bucket(d) != d for d in dims)
    assert all(max(c[1]) > MAX_DECODE_Q for c in CASES)
    lens = [(q, k) for c in CASES for q, k in zip(c[1], c[2])]
    assert any(k > q for q, k in lens) and any(k % 128 for _, k in lens) and any(k <= 5 for _, k in lens)
    assert {c[3] // c[4] for c in CASES} >= {4, 8} and any(c[4] == 1 for c in CASES)
    assert {CAUSAL, FULL} <= {c[5] for c in CASES} and {c[5] for c in CASES} - {CAUSAL, FULL}
    assert {c[6] for c in CASES} == {True, False}
    assert {16, 64} <= {c[7] for c in CASES} and {c[7] for c in CASES} & {128, 256}


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kv_dtype,paged", FORMS, ids=[f"{t}-{'paged' if p else 'varlen'}" for t, p in FORMS])
@pytest.mark.parametrize("case", CASES, ids=[f"d{c[0] or 'pad'}-q{max(c[1])}-g{c[3] // c[4]}-p{c[7]}" for c in CASES])
def test_against_fp64_over_the_dequantized_cache(case, kv_dtype, paged, dtype):
    d, lens_q, lens_k, hq, hk, window, per_head, page = case
    d = d or PADDED_D[kv_dtype]
    b = vs.make_batch(lens_q, lens_k, hq, hk, d, DEV, seed=d + hq, dtype=dtype)
    if paged:
        b = vs.to_paged(b, page, seed=d)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, per_head, seed=d)
    out, lse = _run(b, k, v, kw, window)
    _check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, window, kd, vd, f"{case} {kv_dtype} {dtype}")


@needs_hopper
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_the_same_call_twice_gives_the_same_bits(kv_dtype):
    """A longer paged call (2000 keys, GQA 8, causal) meets the contract, and again gives the same output and LSE
    bits."""
    b = vs.to_paged(vs.make_batch([300, 100, 17], [2000, 700, 17], 16, 2, 128, DEV, seed=5), 16, seed=5)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, True, seed=5)
    first = _run(b, k, v, kw, CAUSAL)
    _check(*first, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, CAUSAL, kd, vd, f"repeat {kv_dtype}")
    _same_bits(first, _run(b, k, v, kw, CAUSAL), kv_dtype)


# The special-value batch: GQA 4 (K/V head 1 = q heads 4..7), sequence 0 with 40 query rows over 60 keys (its rows sit
# at keys 20..59), the marked key 35: under the causal mask rows 15..39 keep it, under (8, 0) rows 15..23, unmasked
# all 40. Sequence 1 never reads it.
NAN_WINDOWS = [CAUSAL, (8, 0), FULL]
KEY, HEAD, GROUP = 35, 1, 4


def _special_batch(dtype, paged, seed):
    b = vs.make_batch([40, 30], [60, 50], 8, 2, 128, DEV, seed=seed, dtype=dtype)
    return vs.to_paged(b, 16, seed=seed) if paged else b


def _rows(b: vs.Batch, window, key=None):
    """[total_q] bool: the rows of sequence 0 that keep `key` (None: that keep any key)."""
    lq, lk = int(b.cu_q[1] - b.cu_q[0]), int(b.cu_k[1] - b.cu_k[0])
    keep = ref.visible(lq, lk, window)
    rows = torch.zeros(b.q.shape[0], dtype=torch.bool)
    rows[int(b.cu_q[0]):int(b.cu_q[1])] = keep.any(1) if key is None else keep[:, key]
    return rows


def _nan_pattern(out, b: vs.Batch, window, col=None, widen=False, tag=""):
    """NaN in exactly the rows of sequence 0 that keep KEY, in K/V head HEAD's q heads (all columns, or column col);
    with widen, also allowed in that sequence's rows that keep other keys (a NaN in V, docs/numerics.md §8). Every NaN
    written is the canonical one of the dtype; the rest finite."""
    o = out.cpu()
    nan = torch.isnan(o.float())
    bits = ref.bf16_bits(o)
    assert bool((bits[nan] == ref.NAN_BITS[o.dtype]).all()), f"a NaN is not {ref.NAN_BITS[o.dtype]:#x}: {tag}"
    want = torch.zeros_like(nan)
    heads = slice(HEAD * GROUP, (HEAD + 1) * GROUP)
    cols = slice(None) if col is None else slice(col, col + 1)
    want[_rows(b, window, KEY), heads, cols] = True
    assert bool(want.any()) and bool(nan[want].all()), f"a row that keeps the key is not NaN: {tag}"
    may = want.clone()
    if widen:
        may[_rows(b, window), heads, cols] = True
    assert not bool((nan & ~may).any()), f"NaN outside the rows that keep the key: {tag}"
    assert bool(torch.isfinite(o.float())[~may].all()), tag


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("code", E4M3_NAN)
def test_fp8_nan_codes_reach_the_rows_that_keep_the_key(code, dtype):
    """An E4M3 NaN code in K (key 35 of sequence 0, K/V head 1, column 3): exactly the rows that keep the key are NaN,
    all columns, under the causal mask, a window and none. In V (column 37): column 37 of those rows (and at most of
    the sequence's other rows that keep keys). Both NaN codes, both dtypes; 0x7F in a packed cache, 0xFF in pages."""
    paged = code == 0xFF
    b = _special_batch(dtype, paged, seed=7)
    k, v, kw, *_ = _quantized(b, "fp8_e4m3", False, seed=7)
    at = ((int(b.block_table[0, KEY // 16]), KEY % 16) if paged else (int(b.cu_k[0]) + KEY,)) + (HEAD,)
    kn, vn = k.clone(), v.clone()
    kn.view(torch.uint8)[at + (3,)] = code
    vn.view(torch.uint8)[at + (37,)] = code
    for window in NAN_WINDOWS:
        out, _ = _run(b, kn, v, kw, window)
        _nan_pattern(out, b, window, tag=f"K {window}")
        out, _ = _run(b, k, vn, kw, window)
        _nan_pattern(out, b, window, col=37, widen=True, tag=f"V {window}")


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_fp4_nan_scales_reach_the_rows_that_keep_the_key(dtype):
    """An E8M0 0xFF scale of K (key 35 of sequence 0, K/V head 1): exactly the rows that keep the key are NaN, all
    columns; of V: those rows, all columns (and at most the sequence's other rows that keep keys), under the causal
    mask, a window and none."""
    b = _special_batch(dtype, True, seed=9)
    k, v, kw, *_ = _quantized(b, "fp4_e2m1", False, seed=9)
    for name in ("k_scale", "v_scale"):
        bad = dict(kw, **{name: kw[name].clone()})
        bad[name][int(b.block_table[0, KEY // 16]), KEY % 16, HEAD] = kvquant.E8M0_NAN
        for window in NAN_WINDOWS:
            out, _ = _run(b, k, v, bad, window)
            _nan_pattern(out, b, window, widen=name == "v_scale", tag=f"{name} {window}")


def _append_zeros(t, n):
    """t (a cache: FP8 or uint8) with n rows of zero bytes appended along dim 0 (concatenated as bytes)."""
    return torch.cat((t.view(torch.uint8), t.new_zeros((n, *t.shape[1:]), dtype=torch.uint8))).view(t.dtype)


@needs_hopper
@pytest.mark.parametrize("kv_dtype,paged", FORMS, ids=[f"{t}-{'paged' if p else 'varlen'}" for t, p in FORMS])
def test_nan_in_rows_no_sequence_owns_changes_nothing(kv_dtype, paged):
    """NaN in every pool row no sequence owns (page tails, spare pages; packed: rows past cu_seqlens_k's last): E4M3's
    NaN code in the bytes, FP4's 0xFF in the scales. The output and LSE are the bits of the run without them, and meet
    the contract, under the causal mask and none."""
    b = vs.make_batch([40, 200, 17], [100, 260, 17], 8, 2, 128, DEV, seed=8)
    if paged:
        b = vs.to_paged(b, 64, seed=8)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, True, seed=8)
    if not paged:  # 40 rows past the last sequence's
        k, v = (_append_zeros(t, 40) for t in (k, v))
    clean = {w: _run(b, k, v, kw, w) for w in (CAUSAL, FULL)}
    if paged:
        _poison_unowned_rows(b, k, v, kw)
    else:
        for t in (k, v):
            t.view(torch.uint8)[int(b.cu_k[-1]):] = E4M3_NAN[0]
    for w, want in clean.items():
        got = _run(b, k, v, kw, w)
        _same_bits(got, want, f"poisoned spare rows {w}")
        _check(*got, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, w, kd, vd, f"poisoned spare rows {w}")


def _zero_page(k, v, kw):
    """The pool with one page of zeros appended (FP8 code 0; FP4 code 0 with scale 1), as its own arguments."""
    k, v = (_append_zeros(t, 1) for t in (k, v))
    if "k_scale" in kw:
        kw = dict(kw, **{n: torch.cat((kw[n], torch.full_like(kw[n][:1], kvquant.E8M0_BIAS)))
                         for n in ("k_scale", "v_scale")})
    return k, v, kw


@needs_hopper
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_page_ids_outside_the_pool_read_zeros(kv_dtype):
    """Block-table entries outside the pool (-1, num_pages, 2^31 - 1), each a single 16-row page: the call stays
    inside the pool and reads those rows as zeros (scale 1): the bits of the same call with the ids pointing at a page
    of zeros appended to the pool, and the fp64 reference over the dequantized cache with those rows zero; finite,
    shaped as asked. Unmasked and causal."""
    b = vs.to_paged(vs.make_batch([90, 40, 300], [100, 40, 300], 8, 2, 128, DEV, seed=6), 16, seed=6)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, True, seed=6)
    n = k.shape[0]
    table, zeros = b.block_table.clone(), b.block_table.clone()
    for (s, j), bad in zip(((0, 2), (1, 0), (2, 9)), (-1, n, 2 ** 31 - 1)):  # rows 32..47, 0..15, 144..159
        table[s, j], zeros[s, j] = bad, n
    bad_b = vs.Batch(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, table)
    zero_b = vs.Batch(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, zeros)
    kz, vz, kwz = _zero_page(k, v, kw)
    kdqz, vdqz = (torch.cat((t, torch.zeros_like(t[:1]))) for t in (kdq, vdq))
    for w in (FULL, CAUSAL):
        got = _run(bad_b, k, v, kw, w)
        assert got[0].shape == b.q.shape and torch.isfinite(got[0].float()).all(), w
        _same_bits(got, _run(zero_b, kz, vz, kwz, w), f"ids outside the pool {w}")
        _check(*got, b.q, kdqz, vdqz, b.cu_q, b.cu_k, zeros, w, kd, vd, f"ids outside the pool {w}")


@needs_hopper
def test_dispatch_sends_prefill_sized_quantized_calls_here():
    """With no pin: a quantized call (FP8 varlen and paged, FP4 paged) of more than 16 query rows a sequence is sm90's,
    of at most 16 sm90_decode's, the cache's kv_dtype variant either way; an FNUZ cache stays on the baseline."""
    for lens_q, kernel in (([MAX_DECODE_Q + 1, 3], KERNEL), ([MAX_DECODE_Q, 3], "sm90_decode")):
        b = vs.make_batch(lens_q, [40, 20], 8, 2, 128, DEV, seed=4)
        for kv_dtype, paged in FORMS:
            bb = vs.to_paged(b, 16, seed=4) if paged else b
            k, v, kw, *_ = _quantized(bb, kv_dtype, True, seed=4)
            sel = _selection(bb, k, v, kw, CAUSAL)
            assert sel.kernel.name == kernel and sel.variant["kv_dtype"] == kv_dtype, (lens_q, kv_dtype, sel.why)
        fnuz = kvquant.FP8_DTYPES["fp8_e4m3fnuz"]
        k, v = (kvquant.quantize_fp8(t, torch.ones((), device=DEV), fnuz) for t in (b.k, b.v))
        sel = _selection(b, k, v, {}, CAUSAL)
        assert sel.kernel.name == "baseline" and sel.variant["kv_dtype"] == "fp8_e4m3fnuz", (lens_q, sel.why)


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_power_of_two_scales_give_the_dequantized_cache_bits(kv_dtype, dtype):
    """docs/numerics.md §10, the sm90 prefill: with every scale a power of two (FP8 descales -0.5 for K, a negative one
    whose sign the expansion puts into K, and 4 for V; FP4's E8M0 scales always) the kernel gives the bits it gives on
    the dequantized cache in q's dtype (that cache exact: every value times a power of two is a bf16 / fp16 value
    here): O's bits, the expansion being exact and the descales riding on the softmax scale and 1 / l without changing
    a rounding; the LSE within 2 units in the last place of fp32 (the FP8 variant's epilogue reads the tile's scale
    from a register where the bf16 one reads the parameter, and m * scale + log l may contract into one FMA in one
    and not the other: measured on the H200)."""
    b = vs.to_paged(vs.make_batch([300, 40, 17], [900, 300, 17], 16, 2, 128, DEV, seed=11, dtype=dtype), 64, seed=11)
    if kv_dtype == "fp4_e2m1":
        k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, False, seed=11)
    else:
        k, v = (kvquant.quantize_fp8(t, torch.ones((), device=DEV)) for t in (b.k, b.v))
        kd, vd = torch.tensor([-0.5], device=DEV), torch.tensor([4.0], device=DEV)
        kw = dict(k_descale=kd, v_descale=vd)
        kdq, vdq = ref.dequantize_cache(k) * -0.5, ref.dequantize_cache(v) * 4.0
    kq, vq = kdq.to(dtype), vdq.to(dtype)
    assert torch.equal(kq.to(torch.float64), kdq) and torch.equal(vq.to(torch.float64), vdq), "not exact in q's dtype"
    for window in (CAUSAL, FULL):
        got = _run(b, k, v, kw, window)
        with dispatch.pinned(kernel=KERNEL):
            want = rtcattn.forward_varlen(b.q, kq, vq, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                          window_size=window, block_table=b.block_table)
        torch.cuda.synchronize()
        tag = f"{kv_dtype} {dtype} {window}"
        assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16)), f"output bits differ: {tag}"
        ulp = (got[1].view(torch.int32).long() - want[1].view(torch.int32).long()).abs().max().item()
        print(f"{tag}: LSE differs by at most {ulp} ulp")
        assert ulp <= 2, f"LSE differs by {ulp} units in the last place: {tag}"
