"""Head dims 8..256 on a GPU: every multiple of 8 and some that are padded (to the next multiple of 8, inside the call)
against the fp64 reference, dense and packed, causal or not. The arch's fast kernel (sm90 on Hopper) runs every
head dim at every one of its buckets, bf16 and fp16: dense (full, causal, a sliding window; GQA), varlen and paged;
a head dim below its bucket equals the call on inputs explicitly zero-padded to the bucket, sliced, bit for bit."""
import math

import pytest
import torch

import numerics_suite as suite
import rtcattn
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import validate
from rtcattn.runtime import dispatch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")]

DEV = "cuda"
PADDED = (9, 59, 111, 123, 250, 255)
# Each bucket of the fast kernel at and below its size, padded dims (59, 111, 123) among them.
FAST_DIMS = (8, 32, 40, 59, 64, 72, 96, 111, 123, 128, 160, 192, 200, 256)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CAUSAL = (-1, 0)


def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                           window_size=window)


def pad(t, d):
    return torch.nn.functional.pad(t, (0, d - t.shape[-1]))


def same(a, b):
    """Bit for bit: 16-bit elements as int16, the fp32 LSE as int32."""
    bits = torch.int16 if a.element_size() == 2 else torch.int32
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def fast_kernel():
    """The manifest's first prefill kernel on this GPU's arch that is not the baseline (sm90 on Hopper), or None: a
    decode kernel (declines_at_run_time) leaves these tests' calls of more than 16 query rows to it."""
    from rtcattn.runtime import manifest
    arch = dispatch.arch_of(torch.device(DEV))
    spec = manifest.load().op("attention_fwd")
    return next((k for k in spec.kernels if arch in k.archs and k.name != "baseline" and not k.declines_at_run_time),
                None)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_baseline_every_head_dim(causal):
    dims = sorted({*range(8, 257, 8), *PADDED})
    with dispatch.pinned(kernel="baseline"):
        for d in dims:
            q, k, v = suite.make_qkv("bshd", 2, 3, 33, 47, d, DEV, seed=d)
            suite.check_accuracy(run, q, k, v, "bshd", "rtne", scale=0.3 if d % 16 else None, what=f"d={d}",
                                 window=CAUSAL if causal else None)


@pytest.mark.parametrize("d", [8, 40, 59, 111, 250])
def test_baseline_varlen_and_paged(d):
    b = vs.make_batch([1, 17, 300, 0], [5, 130, 300, 9], 4, 2, d, DEV, seed=d)
    with dispatch.pinned(kernel="baseline"):
        vs.check_accuracy(b, "rtne", CAUSAL, what=f"baseline varlen d={d}")
        vs.check_accuracy(vs.to_paged(b, 16, seed=d), "rtna", (-1, -1), what=f"baseline paged d={d}")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("d", FAST_DIMS)
def test_fast_kernel_every_bucket(d, dtype):
    kernel = fast_kernel()
    if kernel is None:
        pytest.skip("no fast kernel for this GPU's arch")
    spec = kernel.axes["head_dim"]
    bucket = spec.bucket_for(validate.padded_head_dim(d))
    dt = DTYPES[dtype]
    q, k, v = suite.make_qkv("bshd", 2, 4, 1000, 1000, d, DEV, seed=d, hk=2, dtype=dt)
    sel = attention_fwd.selection(q, k, v, window=CAUSAL)
    assert sel.kernel.name == kernel.name and sel.variant["head_dim"] == bucket, sel
    assert sel.variant["dtype"] == dtype, sel
    for window in (None, CAUSAL, (100, 20)):
        suite.check_accuracy(run, q, k, v, "bshd", "rtne", what=f"{kernel.name} {dtype} d={d}", window=window)
    # Zero columns read past D (tensor-map fill) equal zero columns in memory, and nothing past D is written.
    o, lse = run(q, k, v, "bshd", "rtne", None, True, CAUSAL)
    o_p, lse_p = run(pad(q, bucket), pad(k, bucket), pad(v, bucket), "bshd", "rtne", 1 / math.sqrt(d), True, CAUSAL)
    assert same(o, o_p[..., :d]) and same(lse, lse_p)
    b = vs.make_batch([1, 17, 300, 0], [5, 130, 300, 9], 4, 2, d, DEV, seed=d, dtype=dt)
    p = vs.to_paged(b, 16, seed=d)
    sel = attention_fwd.selection_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=CAUSAL,
                                         block_table=p.block_table)
    assert sel.kernel.name == kernel.name and sel.variant["head_dim"] == bucket, sel
    vs.check_accuracy(b, "rtna", CAUSAL, what=f"{kernel.name} {dtype} varlen d={d}")
    vs.check_accuracy(p, "rtne", (-1, -1), what=f"{kernel.name} {dtype} paged 16 d={d}")
    vs.check_accuracy(vs.to_paged(b, 64, seed=d), "rtz", CAUSAL, what=f"{kernel.name} {dtype} paged 64 d={d}")
