"""Packed sequences and paged KV on the GPU through rtcattn.forward_varlen, against the fp64 reference of each
sequence: the sm90 kernel on Hopper (which kernel ran is asserted), the baseline elsewhere.

Length mixes hold 0 and 1, sequences shorter than one tile and several tiles long; masks, GQA, the three
modes; page sizes 16..256 with shuffled pages; paged results equal packed ones bit for bit; a max_seqlen_k
below real KV lengths (it only sizes the launch) on every kernel that serves packed calls, pinned.
"""
import random

import pytest

torch = pytest.importorskip("torch")

import varlen_suite as vs  # noqa: E402
from rtc_testing import round_modes  # noqa: E402

pytestmark = pytest.mark.gpu

MODES = round_modes()
WINDOWS = [(-1, -1), (-1, 0), (17, 3), (200, 0), (-1, 5)]
HEADS = [(8, 8), (8, 2), (4, 1)]


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _expect(d):
    return "sm90" if _hopper() else "baseline"


def _lens(seed, n, hi, zeros=True):
    rnd = random.Random(seed)
    out = [rnd.choice([0, 1, rnd.randint(2, 127), rnd.randint(128, hi)]) if zeros else rnd.randint(1, hi)
           for _ in range(n)]
    return out


def _check_kernel(b: vs.Batch, d: int, window=(-1, -1), mode="rtne"):
    from rtcattn.ops import attention_fwd
    sel = attention_fwd.selection_varlen(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, mode, None, window,
                                         b.block_table)
    assert sel.kernel.name == _expect(d), (sel.kernel.name, sel.why)


CASES = [(w, HEADS[i % 3], MODES[i % 3], seed) for i, (w, seed) in enumerate(
    (w, s) for w in WINDOWS for s in (1, 2))]


@pytest.mark.parametrize("window,heads,mode,seed", CASES)
@pytest.mark.parametrize("d", [128, 64])
def test_varlen_mix_against_fp64(window, heads, mode, seed, d):
    lens_q = _lens(seed, 9, 700)
    lens_k = [n + random.Random(seed + n).choice([0, 0, 5, 300]) for n in lens_q]  # Sk >= Sq mostly, some equal
    lens_k[seed % 9] = 0                                                          # a sequence with no key
    b = vs.make_batch(lens_q, lens_k, heads[0], heads[1], d, "cuda", seed=seed)
    _check_kernel(b, d, window, mode)
    vs.check_accuracy(b, mode, window, what=f"varlen d={d}")


@pytest.mark.parametrize("page", [16, 32, 64, 128, 256, 512])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_paged_equals_packed_and_fp64(page, window):
    lens_q = [130, 1, 0, 40, 513]
    lens_k = [700, 1, 77, 300, 513]
    b = vs.make_batch(lens_q, lens_k, 8, 2, 128, "cuda", seed=page)
    paged = vs.to_paged(b, page, seed=page)
    _check_kernel(paged, 128, window)
    vs.check_paged_equals_packed(b, page, "rtne", window, seed=page)
    vs.check_accuracy(paged, "rtna", window, what="paged")


def test_chunked_prefill_shape():
    """vLLM's chunked prefill: 512 new queries over 4096 cached keys per sequence, page 16, causal."""
    b = vs.make_batch([512] * 3, [4096] * 3, 8, 2, 128, "cuda", seed=5)
    paged = vs.to_paged(b, 16, seed=5)
    _check_kernel(paged, 128, (-1, 0))
    vs.check_accuracy(paged, "rtne", (-1, 0), what="chunked prefill")


def test_batch_of_one_and_short_sequences():
    for lens in ([1], [5], [127], [129], [1000]):
        b = vs.make_batch(lens, lens, 4, 4, 128, "cuda", seed=sum(lens))
        vs.check_accuracy(b, "rtne", (-1, 0), what="batch of one")


def test_thousand_sequences():
    lens = _lens(7, 1100, 300)
    b = vs.make_batch(lens, [n + 16 for n in lens], 4, 2, 128, "cuda", seed=7)
    _check_kernel(b, 128)
    vs.check_accuracy(b, "rtne", (-1, 0), what="1100 sequences")


@pytest.mark.parametrize("d", [128, 64])
def test_out_in_place_lse_layout_and_determinism(d):
    b = vs.make_batch([300, 0, 77, 1], [300, 5, 200, 1], 8, 2, d, "cuda", seed=3)
    vs.check_out_and_determinism(b, "rtz", (-1, 0))
    vs.check_out_and_determinism(vs.to_paged(b, 64), "rtne")


SHORT_MAX_K = [  # (lens_q, lens_k, (Hq, Hk), max_seqlen_k, window)
    ([33], [100], (2, 2), 50, (-1, -1)),                                       # the reported call
    ([5, 300, 1, 0, 700], [2000, 300, 129, 20, 1], (8, 2), 1, (-1, 0)),       # 1 against thousands of keys
    ([130, 64, 513], [1000, 64, 900], (4, 1), 128, (17, 3)),                  # one kv block's worth, a window
]


@pytest.mark.parametrize("kv", ["varlen", "paged"])
@pytest.mark.parametrize("lens_q,lens_k,heads,max_k,window", SHORT_MAX_K, ids=["50of100", "1ofmany", "128window"])
def test_max_seqlen_k_below_the_real_lengths(kv, lens_q, lens_k, heads, max_k, window):
    """FlashAttention's contract: max_seqlen_k only sizes the launch; every key of each sequence counts. Each
    kernel that serves packed calls on this GPU, pinned (Hopper: sm90_decode, sm90 and the CUDA baseline)."""
    from rtcattn.runtime import dispatch
    b = vs.make_batch(lens_q, lens_k, *heads, 128, "cuda", seed=len(lens_k))
    if kv == "paged":
        b = vs.to_paged(b, 16, seed=len(lens_k))
    from rtcattn.runtime import manifest
    kernels = vs.packed_kernels(dispatch.device_facts(b.q.device)[0])
    assert "baseline" in kernels and (not _hopper() or {"sm90", "sm90_decode"} <= set(kernels)), kernels
    for kernel in kernels:
        call = b
        if manifest.load().op("attention_fwd").kernel(kernel).declines_at_run_time:
            # A decode kernel gets the same keys with at most 16 query rows per sequence.
            call = vs.make_batch([min(n, 16) for n in lens_q], lens_k, *heads, 128, "cuda", seed=len(lens_k))
            if kv == "paged":
                call = vs.to_paged(call, 16, seed=len(lens_k))
        with dispatch.pinned(kernel=kernel):
            vs.check_short_max_seqlen_k(call, max_k, "rtna", window, what=f"{kernel} {kv}")


def test_bad_metadata_stays_inside_the_tensors():
    """Decreasing cu_seqlens, offsets past the totals and page ids out of range: the kernels clamp them;
    the call completes and writes only out (compute-sanitizer's memcheck run covers the same calls)."""
    b = vs.make_batch([100, 50, 200], [100, 50, 200], 4, 2, 128, "cuda", seed=9)
    bad = vs.Batch(b.q, b.k, b.v, torch.tensor([0, 300, 120, 10_000], dtype=torch.int32, device="cuda"),
                   torch.tensor([-5, 90, 40, 99_999], dtype=torch.int32, device="cuda"), b.max_q, b.max_k)
    out, lse = vs.run(bad)
    torch.cuda.synchronize()
    assert out.shape == b.q.shape
    paged = vs.to_paged(b, 16)
    paged.block_table[0, :3] = torch.tensor([-1, 10_000, 2**31 - 1], dtype=torch.int32)
    out, lse = vs.run(paged)
    torch.cuda.synchronize()
    assert out.shape == b.q.shape
