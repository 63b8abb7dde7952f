"""The gfx942 kernel at every head-dim bucket on the wave emulator, bf16 and fp16: the numerics contract against the
fp64 reference (dense, causal and sliding windows, GQA, the tail split forced on, packed and paged sequences, special
values), head dims below their bucket (the Python layer pads 59 and 111 to 64 and 112) bit for bit as zero-padded
inputs, and the emulated gfx942 and gfx90a kernels bit for bit. Each bucket is compiled once per dtype, mask and kv
form (the emulator builds a variant in about 2 s), so the cases spread the round modes, layouts and head dims over
the buckets instead of crossing them all."""
import math

import pytest
import torch

import gfx942_driver as drv
import numerics_suite as suite
import rtcattn
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch, manifest

pytestmark = pytest.mark.emu

F16, BF16 = torch.float16, torch.bfloat16
DTYPES = {"bf16": BF16, "fp16": F16}
BUCKETS = list(manifest.load().op(attention_fwd.OP).kernel("gfx942").axes["head_dim"].buckets)
# Head dims per bucket: the bucket itself, the 32, 40, 59, 72, 111, 160, 200 below it (59 and 111 padded) and 8.
HEAD_DIMS = {64: (8, 32, 40, 59, 64), 96: (72, 96), 128: (111, 128), 192: (160, 192), 256: (200, 256)}
CAUSAL = (-1, 0)


def bucket_of(d: int) -> int:
    return next(b for b in BUCKETS if b >= -(-d // 8) * 8)


def test_every_bucket_has_head_dims_and_every_head_dim_its_bucket():
    assert sorted(HEAD_DIMS) == BUCKETS
    assert all(bucket_of(d) == b for b, dims in HEAD_DIMS.items() for d in dims)
    assert {32, 40, 59, 72, 111, 160, 200, 256} <= {d for dims in HEAD_DIMS.values() for d in dims}


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_head_dim_selects_the_gfx942_kernel_at_its_bucket(emulate_gfx942, dtype):
    """On the emulated MI300X every head dim 8..256 runs on the fast kernel, in the smallest bucket that holds it
    (after the padding to a multiple of 8), dense and packed, for both dtypes."""
    for d in (8, 24, 32, 40, 59, 64, 65, 72, 96, 97, 111, 128, 129, 160, 192, 193, 200, 250, 256):
        q, k, v = suite.make_qkv("bshd", 1, 2, 20, 30, d, "cpu", dtype=DTYPES[dtype])
        name = f"-d{bucket_of(d)}-{dtype}-same-plain-nodrop"
        assert attention_fwd.selection(q, k, v).variant.name == f"gfx942-rtne-none-dense{name}", d
        assert attention_fwd.selection(q, k, v, window=CAUSAL).variant.name == f"gfx942-rtne-window-dense{name}", d
    b = vs.make_batch([10, 30], [20, 40], 2, 1, 200, "cpu", dtype=DTYPES[dtype])
    p = vs.to_paged(b, 16)
    sel = attention_fwd.selection_varlen
    assert (sel(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k).variant.name
            == f"gfx942-rtne-none-varlen-d256-{dtype}-same-plain-nodrop")
    assert sel(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=CAUSAL,
               block_table=p.block_table).variant.name == f"gfx942-rtne-window-paged-d256-{dtype}-same-plain-nodrop"


@pytest.fixture
def emulate_gfx942(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def run_on(arch, tail_split=0):
    def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
        return drv.forward(q, k, v, layout, mode, scale, lse, arch=arch, tail_split=tail_split, window=window)
    return run


# Per (head dim, dtype): a layout, a round mode (bf16; fp16 rounds to nearest even only), GQA or not, a window.
DENSE = [(d, t) for dims in HEAD_DIMS.values() for d in dims for t in DTYPES]


@pytest.mark.parametrize("d,dtype", DENSE, ids=[f"d{d}-{t}" for d, t in DENSE])
def test_dense_against_fp64(d, dtype):
    """Full, causal and a sliding window against the fp64 reference; Sq and Sk across several 64-key blocks and
    partial q tiles, cross attention both ways."""
    layout, mode = suite.LAYOUTS[d % 2], suite.MODES[d % 3] if dtype == "bf16" else "rtne"
    for i, (sq, sk, hk, window) in enumerate(((100, 300, None, None), (130, 77, 1, CAUSAL), (300, 200, 1, (37, 5)))):
        q, k, v = suite.make_qkv(layout, 1, 2, sq, sk, d, "cpu", seed=d + i, hk=hk, dtype=DTYPES[dtype])
        suite.check_accuracy(run_on("gfx942"), q, k, v, layout, mode, what=f"gfx942 d={d}", window=window)


@pytest.mark.parametrize("d", BUCKETS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tail_split_and_explicit_scale(d, dtype):
    """The tail split forced on (the merge stage's column passes: two past 128) meets the contract and is not the
    unsplit result bit for bit; an explicit softmax scale."""
    q, k, v = suite.make_qkv("bhsd", 2, 1, 130, 700, d, "cpu", seed=d, dtype=DTYPES[dtype])
    suite.check_accuracy(run_on("gfx942", 3), q, k, v, "bhsd", "rtne", scale=0.05, what=f"split d={d}")
    a = drv.forward(q, k, v, "bhsd", "rtne", 0.05, tail_split=0)
    b = drv.forward(q, k, v, "bhsd", "rtne", 0.05, tail_split=5)
    assert not torch.equal(ref.bf16_bits(a), ref.bf16_bits(b)), "the split did not run"


@pytest.mark.parametrize("d", BUCKETS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(d, dtype):
    suite.check_special_values(run_on("gfx942"), "cpu", "bshd", "rtne", sq=20, sk=100, d=d, dtype=DTYPES[dtype])


# One packed batch per bucket; its dtype alternates over the buckets (each pairs varlen with paged of the same dtype
# and mask, which the bit-for-bit comparison needs), the other dtype takes the non-causal call.
PACKED = [(b, d, "bf16" if i % 2 == 0 else "fp16") for i, (b, d) in enumerate(((64, 40), (96, 72), (128, 111),
                                                                              (192, 160), (256, 200)))]


@pytest.mark.parametrize("bucket,d,dtype", PACKED, ids=[f"d{d}-{t}" for _, d, t in PACKED])
def test_varlen_and_paged_against_fp64(emulate_gfx942, bucket, d, dtype):
    """Per sequence against the fp64 reference (lengths 0, 1, sub-tile and past one work item's q rows, GQA); the
    paged pool gives the packed call's results bit for bit."""
    with dispatch.pinned(kernel="gfx942"):
        b = vs.make_batch([0, 1, 17, 300, 130], [5, 1, 64, 400, 70], 4, 2, d, "cpu", seed=d, dtype=DTYPES[dtype])
        vs.check_accuracy(b, "rtne", CAUSAL, what=f"gfx942 varlen d={d}")
        vs.check_paged_equals_packed(b, 32, "rtne", CAUSAL, seed=d)
        vs.check_accuracy(vs.to_paged(b, 16, seed=d), "rtne", CAUSAL, what=f"gfx942 paged d={d}")
        other = vs.make_batch([50, 0, 129], [90, 3, 260], 2, 1, d, "cpu", seed=d + 1,
                              dtype=DTYPES["fp16" if dtype == "bf16" else "bf16"])
        vs.check_accuracy(other, "rtne", (-1, -1), what=f"gfx942 varlen d={d}")


@pytest.mark.parametrize("d", BUCKETS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gfx942_and_gfx90a_agree_bit_for_bit(d, dtype):
    """The same source built for the two archs (their MFMA spellings, wait states and register helpers differ)
    gives the same outputs and LSE, causal, with the tail split forced on."""
    q, k, v = suite.make_qkv("bshd", 1, 2, 77, 450, HEAD_DIMS[d][0], "cpu", seed=3, dtype=DTYPES[dtype])
    outs = [drv.forward(q, k, v, "bshd", "rtne", None, True, arch=a, tail_split=3, window=CAUSAL)
            for a in ("gfx942", "gfx90a")]
    assert torch.equal(ref.bf16_bits(outs[0][0]), ref.bf16_bits(outs[1][0]))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))


def pad(t, d):
    return torch.nn.functional.pad(t, (0, d - t.shape[-1]))


@pytest.mark.parametrize("d,dtype", [(40, "fp16"), (59, "bf16"), (72, "fp16"), (111, "bf16"), (200, "fp16")])
def test_head_dim_below_its_bucket_equals_zero_columns(emulate_gfx942, d, dtype):
    """A head dim below its bucket runs the bucket's code on zero columns: the call equals the call on inputs
    zero-padded to the bucket with the scale of d, sliced, output and LSE bit for bit (59 and 111 are padded to
    64 and 112 by the Python layer first). The kernel neither reads nor writes past d: the emulator fails a
    launch on any access outside the tensors, whose rows here end at d."""
    b = bucket_of(d)
    q, k, v = suite.make_qkv("bshd", 1, 2, 33, 100, d, "cpu", seed=d, dtype=DTYPES[dtype])
    with dispatch.pinned(kernel="gfx942"):
        o, lse = rtcattn.forward(q, k, v, return_lse=True, window_size=CAUSAL)
        o_p, lse_p = rtcattn.forward(pad(q, b), pad(k, b), pad(v, b), softmax_scale=1 / math.sqrt(d),
                                     return_lse=True, window_size=CAUSAL)
    assert torch.equal(ref.bf16_bits(o), ref.bf16_bits(o_p[..., :d])), f"d={d} in bucket {b}"
    assert torch.equal(lse.view(torch.int32), lse_p.view(torch.int32)), f"d={d} in bucket {b}"
