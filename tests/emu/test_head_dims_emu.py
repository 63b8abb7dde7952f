"""Head dims 8..256 on the emulated gfx942: every multiple of 8 runs as it is, any other head dim runs padded with
zero columns to the next multiple of 8 and sliced back, with the scale of its own head dim. Here the baseline (its
buckets 32..256, pinned: dispatch sends every head dim to the gfx942 kernel, whose buckets
tests/emu/test_gfx942_head_dims_emu.py covers) and the padding: dense, packed and paged calls, causal or not, against
the fp64 reference (the numerics contract); the padded call equals the call on explicitly zero-padded inputs, sliced,
bit for bit. Small shapes: the emulator is slow."""
import math

import pytest
import torch

import numerics_suite as suite
import rtcattn
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

HEAD_DIMS = (8, 16, 24, 32, 40, 59, 72, 111, 160, 200, 250, 256)  # 59, 111, 250 padded
CAUSAL = (-1, 0)


@pytest.fixture(autouse=True)
def emulate(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                           window_size=window)


def pad(t, d):
    """t with zero columns up to head dim d, as a caller would pad it."""
    return torch.nn.functional.pad(t, (0, d - t.shape[-1]))


def same(a, b):
    """Bit for bit: bf16 outputs by their patterns, fp32 LSEs by theirs."""
    if a.dtype == torch.bfloat16:
        return torch.equal(ref.bf16_bits(a), ref.bf16_bits(b))
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_baseline_dense_against_fp64(d, causal):
    """Both layouts, the three round modes and GQA spread over the head dims (one compile per bucket and mode)."""
    layout, mode = suite.LAYOUTS[d % 2], suite.MODES[d % 3]
    q, k, v = suite.make_qkv(layout, 1, 2, 33, 47, d, "cpu", seed=d, hk=1 if d % 16 else None)
    with dispatch.pinned(kernel="baseline"):
        suite.check_accuracy(run, q, k, v, layout, mode, what=f"baseline d={d}", window=CAUSAL if causal else None)


@pytest.mark.parametrize("d", [40, 59, 111, 250])
def test_baseline_dense_explicit_scale_and_cross_lengths(d):
    q, k, v = suite.make_qkv("bshd", 1, 2, 64, 19, d, "cpu", seed=d + 1)
    with dispatch.pinned(kernel="baseline"):
        suite.check_accuracy(run, q, k, v, "bshd", "rtne", scale=0.3, what=f"baseline d={d} scale 0.3")
        suite.check_accuracy(run, q, k, v, "bshd", "rtne", what=f"baseline d={d} Sq > Sk causal", window=CAUSAL)


@pytest.mark.parametrize("d", [8, 24, 40, 59, 111, 200, 256])
def test_baseline_varlen_and_paged_against_fp64(d):
    """Per sequence against the fp64 reference; the paged pool (padded as a copy when D is not a multiple of 8)
    gives the packed call's results bit for bit."""
    b = vs.make_batch([17, 40], [30, 64], 2, 1, d, "cpu", seed=d)
    mode = suite.MODES[d % 3]
    with dispatch.pinned(kernel="baseline"):
        vs.check_accuracy(b, mode, CAUSAL, what=f"baseline varlen d={d}")
        vs.check_accuracy(vs.to_paged(b, 16, seed=d), mode, (-1, -1), what=f"baseline paged d={d}")
        vs.check_paged_equals_packed(b, 16, mode, CAUSAL, seed=d)


# ---- a padded head dim runs on the fast kernel ------------------------------------------------------------------

@pytest.mark.parametrize("d", [121, 123, 127])
def test_padded_to_128_selects_the_gfx942_kernel(d):
    q, k, v = suite.make_qkv("bshd", 1, 2, 20, 30, d, "cpu")
    assert attention_fwd.selection(q, k, v).variant.name == "gfx942-rtne-none-dense-d128-bf16-same-plain-nodrop"
    assert attention_fwd.selection(q, k, v,
                                   window=CAUSAL).variant.name == "gfx942-rtne-window-dense-d128-bf16-same-plain-nodrop"
    b = vs.make_batch([10, 30], [20, 40], 2, 1, d, "cpu")
    p = vs.to_paged(b, 16)
    sel = attention_fwd.selection_varlen
    assert sel(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q,
               b.max_k).variant.name == "gfx942-rtne-none-varlen-d128-bf16-same-plain-nodrop"
    assert sel(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=CAUSAL,
               block_table=p.block_table).variant.name == "gfx942-rtne-window-paged-d128-bf16-same-plain-nodrop"
    q, k, v = suite.make_qkv("bshd", 1, 2, 20, 30, 120, "cpu")  # a multiple of 8 runs as it is, in the same bucket
    assert attention_fwd.selection(q, k, v).variant.name == "gfx942-rtne-none-dense-d128-bf16-same-plain-nodrop"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gfx942_padded_dense_against_fp64(causal):
    q, k, v = suite.make_qkv("bhsd", 1, 2, 40, 64, 123, "cpu", seed=5, hk=1)
    with dispatch.pinned(kernel="gfx942"):
        suite.check_accuracy(run, q, k, v, "bhsd", "rtna", what="gfx942 d=123", window=CAUSAL if causal else None)


def test_gfx942_padded_varlen_and_paged_against_fp64():
    b = vs.make_batch([17, 40], [30, 64], 2, 1, 123, "cpu", seed=6)
    with dispatch.pinned(kernel="gfx942"):
        vs.check_accuracy(b, "rtne", CAUSAL, what="gfx942 varlen d=123")
        vs.check_accuracy(vs.to_paged(b, 16, seed=6), "rtz", (-1, -1), what="gfx942 paged d=123")


# ---- the padded call is the zero-padded call, sliced ----------------------------------------------------------

@pytest.mark.parametrize("kernel,d", [("baseline", 9), ("baseline", 59), ("baseline", 250), ("gfx942", 123)])
def test_padded_dense_call_equals_zero_padded_inputs_sliced(kernel, d):
    """The same output and LSE bit for bit as the caller padding q, k, v to the next multiple of 8 with
    softmax_scale = 1/sqrt(D) of the call's own D; with the padded head dim's default scale they differ."""
    dp = -(-d // 8) * 8
    q, k, v = suite.make_qkv("bshd", 1, 2, 33, 47, d, "cpu", seed=d)
    with dispatch.pinned(kernel=kernel):
        o, lse = run(q, k, v, "bshd", "rtne", None, True, CAUSAL)
        o_p, lse_p = run(pad(q, dp), pad(k, dp), pad(v, dp), "bshd", "rtne", 1 / math.sqrt(d), True, CAUSAL)
        o_dp, _ = run(pad(q, dp), pad(k, dp), pad(v, dp), "bshd", "rtne", None, True, CAUSAL)
        out = torch.full_like(q, float("nan"))
        res, lse_out = rtcattn.forward(q, k, v, softmax_scale=None, out=out, return_lse=True, causal=True)
    assert o.shape == q.shape and o.is_contiguous()
    assert same(o, o_p[..., :d]) and same(lse, lse_p), f"padded call != zero-padded call sliced (d={d})"
    assert not same(o, o_dp[..., :d]), "the default scale is the padded head dim's"
    assert res is out and same(out, o) and same(lse_out, lse)


@pytest.mark.parametrize("kernel,d", [("baseline", 59), ("gfx942", 123)])
@pytest.mark.parametrize("paged", [False, True], ids=["varlen", "paged"])
def test_padded_packed_call_equals_zero_padded_inputs_sliced(kernel, d, paged):
    dp = -(-d // 8) * 8
    b = vs.make_batch([17, 40], [30, 64], 2, 1, d, "cpu", seed=d)
    if paged:
        b = vs.to_paged(b, 16, seed=d)
    padded = vs.Batch(pad(b.q, dp), pad(b.k, dp), pad(b.v, dp), b.cu_q, b.cu_k, b.max_q, b.max_k, b.block_table)
    with dispatch.pinned(kernel=kernel):
        o, lse = vs.run(b, "rtna", CAUSAL)
        o_p, lse_p = vs.run(padded, "rtna", CAUSAL, scale=1 / math.sqrt(d))
        out = torch.full_like(b.q, float("nan"))
        res, lse_out = vs.run(b, "rtna", CAUSAL, out=out)
    assert o.shape == b.q.shape and o.is_contiguous()
    assert same(o, o_p[..., :d]) and same(lse, lse_p), f"padded call != zero-padded call sliced (d={d})"
    assert res is out and same(out, o) and same(lse_out, lse)


# ---- a padded call is checked whole before its copies are made -------------------------------------------------

@pytest.fixture
def no_copies(monkeypatch):
    from rtcattn.ops.attention_fwd import stub
    monkeypatch.setattr(stub, "_pad", lambda *a: pytest.fail("the padding copies were made before the refusal"))


def test_runtime_refusal_comes_before_the_copies(no_copies):
    """The runtime checks the padded call (here: a block table past what the gfx942 kernel's V^T offsets reach)
    on the copies' shapes and strides, before they exist."""
    b = vs.make_batch([4], [4], 1, 1, 123, "cpu")
    pool = torch.zeros((1, 1 << 16, 1, 123), dtype=torch.bfloat16)
    table = torch.zeros((1, 257), dtype=torch.int32)     # 257 pages of 2^16 rows: past 2^24 keys
    with dispatch.pinned(kernel="gfx942"), pytest.raises(ValueError, match=r"block_table.shape\[1\]\*page_size=257"):
        rtcattn.forward_varlen(b.q, pool, pool, b.cu_q, b.cu_k, 4, 4, block_table=table)


def test_copies_larger_than_the_device_are_refused_before_they_are_made(no_copies, monkeypatch):
    q, k, v = suite.make_qkv("bshd", 1, 2, 64, 64, 59, "cpu")
    monkeypatch.setattr(dispatch, "_memory_bytes", lambda device: 4 * 64 * 2 * 64 * 2 - 1)
    with pytest.raises(ValueError, match=r"copies of the inputs and output padded from head dim 59 to 64 of 65536 "
                                         r"bytes .*head_dim=64"):
        rtcattn.forward(q, k, v)
