"""Paged K/V through the sm90 producer warp's gather on a GPU: each lane of the warp issues one TMA box of a K/V
block (boxes of min(page_size, block_n's largest power-of-two divisor) rows times the 64-column blocks: at page 16, 5 to
21 lanes by bucket), and lane 0 alone arrives with the block's bytes. At every head-dim bucket of the sm90 kernel and
pages 16 ... 256 (one to eight boxes per block), a paged call equals the same keys packed bit for bit, and the fp64
reference per sequence; page ids outside the pool read as zeros, one box's rows at a time. Hopper runs sm90 (asserted),
another GPU the kernel its manifest picks."""
import pytest
import torch

import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import manifest

pytestmark = pytest.mark.gpu

DEV = "cuda"

# The sm90 kernel's buckets, from the manifest (one bucket per plan of sm90/params.h).
BUCKETS = manifest.load().op("attention_fwd").kernel("sm90").axes["head_dim"].buckets
PAGES = (16, 32, 64, 256)
# Sequences ending inside a 16-row box, on a block edge, with no key, with one, over several blocks and pages.
LENS_Q = [1, 130, 0, 77, 200, 5]
LENS_K = [700, 1, 77, 300, 529, 256]


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _check_kernel(b: vs.Batch, window):
    sel = attention_fwd.selection_varlen(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, "rtne", None, window,
                                         b.block_table)
    if _hopper():
        assert sel.kernel.name == "sm90", (sel.kernel.name, sel.why)


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("d", BUCKETS)
def test_paged_gather_equals_packed_every_bucket(d, page):
    b = vs.make_batch(LENS_Q, LENS_K, 4, 2, d, DEV, seed=d + page)
    for window, mode in (((-1, -1), "rtne"), ((17, 3), "rtz")):
        _check_kernel(vs.to_paged(b, page, seed=page), window)
        vs.check_paged_equals_packed(b, page, mode, window, seed=page)
    vs.check_accuracy(vs.to_paged(b, page, seed=page), "rtna", (-1, 0), what=f"paged gather d={d}")


@pytest.mark.parametrize("d", [128, 192])
def test_paged_gather_out_of_pool_ids_read_zeros(d):
    """Ids outside the pool in single 16-row boxes (each its own lane) read zeros: the packed call with those rows
    zeroed, bit for bit. d = 192: 21 lanes per block, the most of any bucket."""
    b = vs.make_batch([90, 40, 300], [100, 40, 300], 4, 1, d, DEV, seed=d)
    paged = vs.to_paged(b, 16, seed=d)
    table = paged.block_table
    table[0, 2] = -1                        # rows 32..47 of sequence 0
    table[1, 0] = paged.k.shape[0] + 7      # rows 0..15 of sequence 1
    table[2, 9] = 2**31 - 1                 # rows 144..159 of sequence 2
    zeroed = vs.Batch(b.q, b.k.clone(), b.v.clone(), b.cu_q, b.cu_k, b.max_q, b.max_k)
    for rows in (slice(32, 48), slice(100, 116), slice(140 + 144, 140 + 160)):
        zeroed.k[rows] = 0
        zeroed.v[rows] = 0
    _check_kernel(paged, (-1, -1))
    for window in ((-1, -1), (-1, 0)):
        o1, l1 = vs.run(zeroed, "rtne", window)
        o2, l2 = vs.run(paged, "rtne", window)
        assert torch.equal(ref.bf16_bits(o1.cpu()), ref.bf16_bits(o2.cpu())), f"output: d={d} window={window}"
        assert torch.equal(l1.cpu().view(torch.int32), l2.cpu().view(torch.int32)), f"LSE: d={d} window={window}"
