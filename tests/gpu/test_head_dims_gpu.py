"""Head dims 8..256 on a GPU: every multiple of 8 and some that are padded (to the next multiple of 8, inside the call)
against the fp64 reference, dense and packed, causal or not; a head dim that pads to 128 runs on the arch's fast
kernel (sm90 on Hopper) and equals the call on explicitly zero-padded inputs, sliced, bit for bit."""
import math

import pytest
import torch

import numerics_suite as suite
import rtcattn
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")]

DEV = "cuda"
PADDED = (9, 59, 111, 123, 250, 255)
CAUSAL = (-1, 0)


def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                           window_size=window)


def pad(t, d):
    return torch.nn.functional.pad(t, (0, d - t.shape[-1]))


def same(a, b):
    if a.dtype == torch.bfloat16:
        return torch.equal(ref.bf16_bits(a), ref.bf16_bits(b))
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def fast_kernel():
    """The manifest's first kernel that takes head dim 128 on this GPU's arch (sm90 on Hopper), or None."""
    from rtcattn.runtime import manifest
    arch = dispatch.arch_of(torch.device(DEV))
    spec = manifest.load().op("attention_fwd")
    return next((k.name for k in spec.kernels if arch in k.archs and k.name != "baseline"
                 and k.axes["head_dim"].accepts(128)), None)


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


@pytest.mark.parametrize("d", [121, 123, 127])
def test_padded_to_128_runs_the_fast_kernel(d):
    kernel = fast_kernel()
    if kernel is None:
        pytest.skip("no fast kernel for this GPU's arch")
    q, k, v = suite.make_qkv("bshd", 2, 4, 1000, 1000, d, DEV, seed=d, hk=2)
    sel = attention_fwd.selection(q, k, v, window=CAUSAL)
    assert sel.kernel.name == kernel and sel.variant["head_dim"] == 128, sel
    for window in (None, CAUSAL):
        suite.check_accuracy(run, q, k, v, "bshd", "rtne", what=f"{kernel} d={d}", window=window)
    o, lse = run(q, k, v, "bshd", "rtne", None, True, CAUSAL)
    o_p, lse_p = run(pad(q, 128), pad(k, 128), pad(v, 128), "bshd", "rtne", 1 / math.sqrt(d), True, CAUSAL)
    assert same(o, o_p[..., :d]) and same(lse, lse_p)
    b = vs.make_batch([1, 17, 300, 0], [5, 130, 300, 9], 4, 2, d, DEV, seed=d)
    p = vs.to_paged(b, 16, seed=d)
    sel = attention_fwd.selection_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=CAUSAL,
                                         block_table=p.block_table)
    assert sel.kernel.name == kernel, sel
    vs.check_accuracy(b, "rtna", CAUSAL, what=f"{kernel} varlen d={d}")
    vs.check_accuracy(p, "rtne", (-1, -1), what=f"{kernel} paged d={d}")
