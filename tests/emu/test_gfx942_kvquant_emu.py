"""The gfx942 prefill kernel on quantized caches (FP8 E4M3, E4M3 FNUZ with descales; FP4 E2M1 + E8M0), on the wave
emulator: every format x both dtypes x varlen / paged (FP4 paged only, as the API takes it), the buckets spread over
the cases (64, 96 (d72, d96), 128, 192 (d160), 256), prefill-sized sequences (more than 16 query rows, several q
blocks at 256), GQA 1 / 2 / 4, causal, windows and full attention. Each call against the fp64 reference over the
dequantized cache (the accuracy rule: test_kvquant_emu.check); where the scales are powers of two (every FP4 scale,
FP8 descales chosen so) the same bits as this kernel on the dequantized cache in q's dtype; gfx90a and gfx950 giving
gfx942's bits; NaN codes and E8M0 0xFF scales giving NaN rows; bad metadata staying inside the tensors; and dispatch
sending prefill-sized quantized calls here. Every variant's code object: tests/cpu/test_gfx942_isa.py."""
import contextlib
import os

import pytest
import torch

import rtcattn
import varlen_suite as vs
from rtcattn.ops.attention_fwd import kvquant
from rtcattn.runtime import dispatch
from test_gfx942_decode_kvquant_emu import _quant, call, quantized, same_bits
from test_kvquant_emu import check

pytestmark = pytest.mark.emu

KERNEL = "gfx942"
CUS = dispatch.emulated_cus("gfx942-emu")
CAUSAL, FULL = (-1, 0), (-1, -1)
BF16, F16 = torch.bfloat16, torch.float16


@contextlib.contextmanager
def on(arch="gfx942"):
    """The calls inside run on the emulated arch with the prefill kernel pinned (no fallback)."""
    before = os.environ.get("RTCATTN_EMULATE")
    os.environ["RTCATTN_EMULATE"] = arch
    try:
        with dispatch.pinned(kernel=KERNEL, num_cus=CUS):
            yield
    finally:
        if before is None:
            del os.environ["RTCATTN_EMULATE"]
        else:
            os.environ["RTCATTN_EMULATE"] = before


# (kv_dtype, dtype, page (0: varlen), d, (Hq, Hk), lens_q, lens_k, window, descales): descales "pow2" one element
# each (2^-1, 2^1), "head" per (sequence, K/V head) in [0.25, 2), "none" (test_gfx942_decode_kvquant_emu.quantized).
CASES = [
    ("fp8_e4m3", BF16, 0, 128, (8, 2), [40, 1, 150], [100, 17, 300], CAUSAL, "pow2"),
    ("fp8_e4m3", F16, 16, 64, (4, 1), [150, 20], [150, 300], FULL, "head"),
    ("fp8_e4m3", BF16, 16, 160, (4, 2), [20, 200], [64, 257], (20, 5), "none"),
    ("fp8_e4m3", F16, 0, 96, (2, 1), [17, 60], [40, 60], CAUSAL, "pow2"),
    ("fp8_e4m3fnuz", BF16, 64, 256, (2, 2), [130, 5], [300, 64], CAUSAL, "pow2"),
    ("fp8_e4m3fnuz", F16, 0, 72, (8, 2), [100, 33], [100, 65], (37, 0), "head"),
    ("fp8_e4m3fnuz", BF16, 0, 192, (4, 4), [70, 20], [90, 20], FULL, "none"),
    ("fp8_e4m3fnuz", F16, 16, 128, (4, 2), [64, 100], [128, 100], CAUSAL, "none"),
    ("fp4_e2m1", BF16, 16, 128, (8, 2), [150, 1], [300, 17], CAUSAL, "none"),
    ("fp4_e2m1", F16, 64, 256, (4, 1), [60, 140], [60, 200], (50, 0), "none"),
]
IDS = [f"{c[0]}-{'bf16' if c[1] == BF16 else 'fp16'}-{f'page{c[2]}' if c[2] else 'varlen'}-d{c[3]}" for c in CASES]
POW2 = [c for c in CASES if c[8] != "head"]


@pytest.fixture(scope="module")
def runs():
    """Every case's output on gfx942, with its inputs; the heavy part of the file, once."""
    out = {}
    for case in CASES:
        inputs = quantized(case)
        b, k, v, kw = inputs[:4]
        with on():
            out[str(case)] = (call(b, k, v, kw, case[7]), inputs)
    return out


def test_the_cases_cover_the_issue():
    """Every format x dtype x kv form the API takes, every bucket, prefill-sized sequences, GQA, each mask kind."""
    forms = {(c[0], c[1], bool(c[2])) for c in CASES}
    assert forms == {(f, t, p) for f in ("fp8_e4m3", "fp8_e4m3fnuz") for t in (BF16, F16) for p in (False, True)} | {
        ("fp4_e2m1", t, True) for t in (BF16, F16)}
    buckets = (64, 96, 128, 192, 256)
    assert {next(b for b in buckets if c[3] <= b) for c in CASES} == set(buckets)
    assert all(max(c[5]) > 16 for c in CASES) and {c[4][0] // c[4][1] for c in CASES} >= {1, 2, 4}
    assert {CAUSAL, FULL} <= {c[7] for c in CASES} and {c[7] for c in CASES} - {CAUSAL, FULL}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_the_dequantized_fp64_reference(case, runs, monkeypatch):
    """The accuracy rule, and dispatch (nothing pinned) picks this kernel and the cache's variant."""
    (out, lse), (b, k, v, kw, kdq, vdq, kd, vd) = runs[str(case)]
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sel = rtcattn.ops.attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=case[7],
                                                     block_table=b.block_table, quant=_quant(kw))
    assert sel.kernel.name == KERNEL and sel.variant["kv_dtype"] == case[0], sel
    check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, case[7], kd, vd, tag=str(case))


@pytest.mark.parametrize("case", POW2, ids=[i for c, i in zip(CASES, IDS) if c in POW2])
def test_power_of_two_scales_give_the_dequantized_cache_bits(case, runs):
    """The expansion is exact and the power-of-two scales are applied exactly: this kernel's own bits on the
    dequantized cache (times the descales) in q's dtype."""
    res, (b, k, v, kw, kdq, vdq, kd, vd) = runs[str(case)]
    scale = lambda t, s: t if s is None else t * float(s)  # noqa: E731
    kq, vq = scale(kdq, kd).to(b.q.dtype), scale(vdq, vd).to(b.q.dtype)
    if case[0] == "fp4_e2m1":
        kq, vq = kq.contiguous(), vq.contiguous()
    with on():
        same_bits(res, call(b, kq, vq, {}, case[7]), case)


def test_decode_sized_calls_stay_on_the_decode_kernel(runs, monkeypatch):
    """A quantized call of at most 16 query rows a sequence is the decode kernel's, as before."""
    _, (b, k, v, kw, *_) = runs[str(CASES[0])]
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    sel = rtcattn.ops.attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, 16, b.max_k, window=CAUSAL,
                                                     quant=_quant(kw))
    assert sel.kernel.name == "gfx942_decode", sel


@pytest.mark.parametrize("arch", ["gfx90a", "gfx950"])
def test_other_archs_give_gfx942_bits(arch, runs):
    """The same source built for gfx90a and gfx950 gives gfx942's bits (the expansion is integer work and exact)."""
    for case in (CASES[0], CASES[9]):
        res, (b, k, v, kw, *_) = runs[str(case)]
        with on(arch):
            same_bits(res, call(b, k, v, kw, case[7]), (arch, case))


def _nan_rows(out, seq_rows, hk, group, col=None):
    """Asserts the rows seq_rows of K/V head hk's q heads (all columns, or column col) are NaN and nothing else is."""
    nan = torch.isnan(out.float())
    heads = slice(hk * group, (hk + 1) * group)
    cols = slice(None) if col is None else col
    assert nan[seq_rows, heads, cols].all()
    nan[seq_rows, heads, cols] = False
    assert not nan.any()


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("which", ["k", "v"])
def test_fp8_nan_codes_give_nan_rows(which, arch, runs):
    """An FP8 NaN code (E4M3 S.1111.111 in a varlen cache, FNUZ 0x80 in a paged one) at key 0 of a sequence, which
    every one of its rows sees under the causal mask: in K, those rows of the K/V head's q heads are NaN; in V at
    column c, their column c. The rest stays finite. On gfx942 FNUZ comes through its convert and E4M3 through the
    bit placement and its NaN test; on gfx950 the other way round."""
    for case, code in ((CASES[0], 0xFF), (CASES[7], 0x80)):
        _, (b, k, v, kw, *_) = runs[str(case)]
        t = (k if which == "k" else v).clone()
        if case[2]:  # paged: sequence 1's key 0, K/V head 1
            t.view(torch.uint8)[b.block_table[1, 0], 0, 1, 5] = code
            rows, hk = slice(int(b.cu_q[1]), int(b.cu_q[2])), 1
        else:  # varlen: sequence 2's key 0, K/V head 0
            t.view(torch.uint8)[int(b.cu_k[2]), 0, 5] = code
            rows, hk = slice(int(b.cu_q[2]), int(b.cu_q[3])), 0
        kk, vv = (t, v) if which == "k" else (k, t)
        with on(arch):
            out = call(b, kk, vv, kw, case[7])[0]
        _nan_rows(out, rows, hk, case[4][0] // case[4][1], None if which == "k" else 5)


@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
def test_fp4_nan_scale_gives_nan_rows(which, runs):
    """An E8M0 0xFF scale on key 0 of sequence 0 (seen by all its rows under the causal mask), K/V head 1: those rows
    of the head's q heads are NaN, all their columns (a K scale makes the scores NaN, a V scale the whole row of V);
    the rest stays finite."""
    case = CASES[8]
    _, (b, k, v, kw, *_) = runs[str(case)]
    scales = kw[which].clone()
    scales[b.block_table[0, 0], 0, 1] = kvquant.E8M0_NAN
    with on():
        out = call(b, k, v, dict(kw, **{which: scales}), case[7])[0]
    _nan_rows(out, slice(0, int(b.cu_q[1])), 1, case[4][0] // case[4][1])


def test_bad_metadata_stays_inside_the_tensors(runs):
    """Bad cu_seqlens_k (varlen FP8: decreasing, past the total, negative) and bad block-table ids (paged FP4:
    negative, past the pool): the launches complete, the emulator failing any access outside the cache, its scales,
    descales and the workspace."""
    _, (b, k, v, kw, *_) = runs[str(CASES[3])]
    t_k = k.shape[0]
    with on():
        for cu_k in ([0, 1, t_k], [0, t_k + 40, t_k + 999], [-7, 2 ** 31 - 1, 5]):
            bad = vs.Batch(b.q, b.k, b.v, b.cu_q, torch.tensor(cu_k, dtype=torch.int32), b.max_q, b.max_k)
            out, _ = call(bad, k, v, kw, CASES[3][7])
            assert out.shape == b.q.shape
    _, (b, k, v, kw, *_) = runs[str(CASES[8])]
    n = k.shape[0]
    for ids in ((-1, -(2 ** 31)), (n, 2 ** 31 - 1)):
        table = b.block_table.clone()
        table[0, 0], table[1, 0] = ids
        with on():
            call(vs.Batch(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, table), k, v, kw, CASES[8][7])
