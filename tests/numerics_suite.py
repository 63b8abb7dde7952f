"""The numerics contract (docs/numerics.md) as reusable checks, for any `run` callable and device.

`run(q, k, v, layout, round_mode, softmax_scale, return_lse)` returns O, or (O, LSE [B, H, Sq] fp32)
when return_lse is true. The GPU tests pass rtcattn.forward on "cuda"; the emulator tests pass the
same on "cpu". Every check asserts. The inputs are bf16 unless a check is given `dtype` (torch.float16:
the fp16 contract, whose R rounds P and O to fp16; the checks read the dtype off q).
"""
from __future__ import annotations

import contextlib
import math

import torch

from rtcattn.ops.attention_fwd import reference as ref, validate

LAYOUTS = validate.LAYOUTS                    # the op's values: one definition
MODES = validate.axis_values("round_mode")
BF16 = torch.bfloat16
# The normwise error bound per dtype (docs/numerics.md §5, §9): measured on the emulator about 2e-3 (bf16 rtne / rtna),
# 6e-3 (bf16 rtz) and 2.5e-4 (fp16, whose 11 significant bits are 8 times finer than bf16's).
NORMWISE_BOUND = {torch.bfloat16: 1e-2, torch.float16: 1e-3}


def shape(layout: str, b: int, h: int, s: int, d: int) -> tuple[int, int, int, int]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def randn(layout, b, h, s, d, device, gen, dtype=BF16):
    return torch.randn(shape(layout, b, h, s, d), generator=gen).to(dtype).to(device)


def make_qkv(layout, b, h, sq, sk, d, device, seed=0, hk=None, dtype=BF16):
    """Random normal q, k, v (never zeros) of dtype, contiguous, in `layout`; k and v with hk heads (default h)."""
    gen = torch.Generator().manual_seed(seed)
    heads = (h, hk or h, hk or h)
    return tuple(randn(layout, b, n, s, d, device, gen, dtype) for n, s in zip(heads, (sq, sk, sk)))


def strided_view(t: torch.Tensor, offset: int, gen) -> torch.Tensor:
    """The same values as `t` inside a bigger tensor: padded on every dim, last dim still contiguous.
    An odd `offset` (in elements) makes the rows start off any 16-byte boundary."""
    b, x, y, d = t.shape
    big = torch.randn((b + 1, x + 2, y + 3, d + offset + 5), generator=gen).to(t.dtype)
    big = big.to(t.device)
    view = big[1:, 2:, 3:, offset:offset + d]
    view.copy_(t)
    assert not view.is_contiguous() and view.stride(-1) == 1
    return view


def call(run, q, k, v, layout, mode, scale=None, lse=False, window=None):
    """run(q, k, v, layout, mode, scale, lse[, window]): window only for the mask checks."""
    res = run(q, k, v, layout, mode, scale, lse) if window is None else run(q, k, v, layout, mode, scale, lse, window)
    out, lse_t = (res if lse else (res, None))
    assert out.dtype == q.dtype and tuple(out.shape) == tuple(q.shape), (out.dtype, out.shape)
    if lse:
        b, h, sq = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else q.shape[:3]
        assert lse_t.dtype == torch.float32 and tuple(lse_t.shape) == (b, h, sq), (lse_t.dtype, lse_t.shape)
    return out, lse_t


def check_accuracy(run, q, k, v, layout, mode, scale=None, what="", window=None):
    """err(ours) <= 2 err(R) + 1e-5, normwise < NORMWISE_BOUND of q's dtype (bf16 1e-2, fp16 1e-3), LSE within
    1e-4 max(1, |lse64|); rows that see no key (a window) give 0 and LSE -Inf. Returns (err, normwise)."""
    out, lse = call(run, q, k, v, layout, mode, scale, lse=True, window=window)
    w = window or (-1, -1)
    o64, lse64 = (t.cpu() for t in ref.reference_fp64(q, k, v, layout, scale, w))  # on q's device: fast on GPUs
    r = ref.reference_r(q, k, v, layout, mode, scale, w).cpu()
    err, nrm = ref.errors(out.cpu(), o64)
    err_r, _ = ref.errors(r, o64)
    tag = f"{what} {q.dtype} layout={layout} mode={mode} window={w} q={tuple(q.shape)} k={tuple(k.shape)}"
    assert torch.isfinite(out.float()).all(), f"non-finite output from finite inputs: {tag}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    bound = NORMWISE_BOUND[q.dtype]
    assert nrm < bound, f"normwise error {nrm:.3g} >= {bound:g}: {tag}"
    close = ref.lse_close(lse.cpu(), lse64)
    assert bool(close.all()), f"LSE off at {int((~close).sum())} rows: {tag}"
    empty = lse64 == -math.inf                                            # rows that see no key
    assert bool((ref.bf16_bits(_bhsd(out.cpu(), layout))[empty] == 0).all()), f"a row that sees no key is not +0: {tag}"
    return err, nrm


def check_window_special_values(run, device, layout, mode, window, sq=20, sk=40, d=64, hk=None, dtype=BF16):
    """Under a window, a NaN in K row j or V[j, d] reaches only the rows that see key j; a row that sees
    no key is 0 with LSE -Inf even next to NaN keys; every NaN written is the canonical one (bf16 0x7FFF,
    fp16 0x7E00). Pattern = the fp64 table's."""
    q, k, v = (t.cpu() for t in make_qkv(layout, 1, 2, sq, sk, d, "cpu", seed=5, hk=hk, dtype=dtype))
    kb, vb = _bhsd(k, layout), _bhsd(v, layout)
    kb[0, -1, sk // 3, 2] = float("nan")       # the last K/V head: key sk/3
    vb[0, 0, sk - 1, 7] = float("nan")          # the first: the last key, column 7
    q, k, v = q.to(device), k.to(device), v.to(device)
    out, lse = call(run, q, k, v, layout, mode, lse=True, window=window)
    o = _bhsd(out.cpu(), layout)
    nan = torch.isnan(o.float())
    assert bool((ref.bf16_bits(o)[nan] == ref.NAN_BITS[dtype]).all()), f"a NaN output is not {ref.NAN_BITS[dtype]:#x}"
    o64, lse64 = ref.reference_fp64(q.cpu(), k.cpu(), v.cpu(), layout, None, window)
    want = torch.isnan(_bhsd(o64, layout))
    empty = lse64 == -math.inf
    # A NaN in V[j, d] may also reach column d of rows that see other keys but not j (the matrix unit
    # multiplies their weight 0 by NaN, as FlashAttention's kernels do): allowed, nothing else is.
    may = torch.zeros_like(want)
    may[0, :, :, 7] = ~empty[0]
    assert bool(want[nan == 0].logical_not().all()), f"a NaN of the fp64 table is missing ({window})"
    assert bool((~nan | want | may).all()), f"NaN where neither the table nor V's column allows it ({window})"
    assert bool(ref.lse_close(lse.cpu(), lse64).all()), f"LSE differs from the fp64 reference ({window})"
    assert bool((ref.bf16_bits(o)[empty] == 0).all()), "a row that sees no key is not +0"


def check_sizes(run, device, layout, mode, sizes, d=128, b=1, h=2, seed=0, dtype=BF16):
    """Every (Sq, Sk) pair of `sizes`, self and cross attention; returns the largest (err, normwise) seen."""
    worst = (0.0, 0.0)
    for i, sq in enumerate(sizes):
        for j, sk in enumerate(sizes):
            q, k, v = make_qkv(layout, b, h, sq, sk, d, device, seed + 31 * i + j, dtype=dtype)
            err, nrm = check_accuracy(run, q, k, v, layout, mode, what="sizes")
            worst = (max(worst[0], err), max(worst[1], nrm))
    return worst


def check_head_dims(run, device, layout, mode, head_dims, sq=33, sk=47, dtype=BF16):
    for d in head_dims:
        q, k, v = make_qkv(layout, 2, 3, sq, sk, d, device, seed=d, dtype=dtype)
        check_accuracy(run, q, k, v, layout, mode, scale=0.3 if d % 16 else None, what=f"d={d}")


def check_strided(run, device, layout, mode, sq=37, sk=50, d=96, dtype=BF16, kernel_of=None):
    """Views of bigger tensors (nothing copied by the caller), aligned and misaligned row starts, give the bits of
    the contiguous call on the same kernel. kernel_of(q, k, v, layout): the kernel a view's call selects (a fast
    kernel may refuse a view's strides and leave it to the baseline); the contiguous call is pinned to it."""
    from rtcattn.runtime import dispatch
    gen = torch.Generator().manual_seed(7)
    q, k, v = make_qkv(layout, 2, 3, sq, sk, d, device, seed=11, dtype=dtype)
    for offs in ((8, 16, 0), (3, 1, 5)):
        qs, ks, vs = (strided_view(t, o, gen) for t, o in zip((q, k, v), offs))
        pin = dispatch.pinned(kernel=kernel_of(qs, ks, vs, layout)) if kernel_of else contextlib.nullcontext()
        with pin:
            want, _ = call(run, q, k, v, layout, mode)
            got, _ = call(run, qs, ks, vs, layout, mode)
        assert torch.equal(ref.bf16_bits(got), ref.bf16_bits(want)), f"strided views {offs} differ"
        check_accuracy(run, qs, ks, vs, layout, mode, what=f"strided{offs}")


def check_determinism(run, device, layout, mode, sq=70, sk=300, d=128, repeats=3, dtype=BF16):
    q, k, v = make_qkv(layout, 2, 2, sq, sk, d, device, seed=5, dtype=dtype)
    first, lse0 = call(run, q, k, v, layout, mode, lse=True)
    for _ in range(repeats - 1):
        again, lse1 = call(run, q, k, v, layout, mode, lse=True)
        assert torch.equal(ref.bf16_bits(again), ref.bf16_bits(first)), "output differs between runs"
        assert torch.equal(lse1.view(torch.int32), lse0.view(torch.int32)), "LSE differs between runs"


def _bhsd(t, layout):
    return ref.to_bhsd(t, layout)


def _special_inputs(layout, device, sq, sk, d, dtype=BF16):
    q, k, v = (t.cpu() for t in make_qkv(layout, 2, 2, sq, sk, d, "cpu", seed=3, dtype=dtype))
    qb, kb, vb = (_bhsd(t, layout) for t in (q, k, v))  # views: writes land in q, k, v
    nan, inf = float("nan"), float("inf")
    qb[0, 0, 1, 5] = nan                       # row 1 of (0, 0) -> NaN
    kb[0, 1, sk - 1, 2] = nan                  # head (0, 1): every row NaN
    vb[1, 0, sk // 2, 7] = nan                 # (1, 0): column 7 NaN
    qb[1, 1, 2, 0] = inf                       # (1, 1) row 2 -> some +Inf scores -> NaN
    qb[1, 1, 3, :] = 0.0                       # (1, 1) row 3: all scores -Inf (it sees keys) -> NaN
    qb[1, 1, 3, 1] = -inf
    kb[1, 1, :, 1] = kb[1, 1, :, 1].abs() + 0.25
    return q.to(device), k.to(device), v.to(device)


def check_special_values(run, device, layout, mode, sq=20, sk=40, d=64, dtype=BF16):
    """The special-value table; every NaN written is the canonical one (bf16 0x7FFF, fp16 0x7E00)."""
    q, k, v = _special_inputs(layout, device, sq, sk, d, dtype)
    out, lse = call(run, q, k, v, layout, mode, lse=True)
    o = _bhsd(out.cpu(), layout)
    bits = ref.bf16_bits(o)
    nan = torch.isnan(o.float())
    assert bool((bits[nan] == ref.NAN_BITS[dtype]).all()), f"a NaN output is not {ref.NAN_BITS[dtype]:#x}"
    assert bool(nan[0, 0, 1].all()) and int(nan[0, 0].sum()) == d, "NaN in a Q row: exactly that row"
    assert bool(nan[0, 1].all()), "NaN in a K row: every row of that head"
    assert bool(nan[1, 0, :, 7].all()) and int(nan[1, 0].sum()) == sq, "NaN in V[j, d]: exactly column d"
    assert bool(nan[1, 1, 2].all()), "a +Inf score: that row NaN"
    assert bool(nan[1, 1, 3].all()), "all scores -Inf in a row that sees keys: NaN, not an empty row's 0"
    assert int(nan[1, 1].sum()) == 2 * d, "only the +Inf and the all -Inf rows of head (1, 1) are NaN"
    lse = lse.cpu()
    assert bool(torch.isnan(lse[1, 1, 3])), f"all scores -Inf: LSE {lse[1, 1, 3].item()}, want NaN"
    assert bool(torch.isnan(lse[0, 0, 1])) and bool(torch.isnan(lse[0, 1]).all())
    o64, lse64 = ref.reference_fp64(q.cpu(), k.cpu(), v.cpu(), layout)
    assert torch.equal(nan, torch.isnan(_bhsd(o64, layout))), "NaN pattern differs from the fp64 table"
    assert bool(ref.lse_close(lse, lse64).all()), "LSE differs from the fp64 reference"
    check_finite_rows(out, o64, layout, mode)


def check_finite_rows(out, o64, layout, mode):
    """Elements the table leaves finite stay as accurate as a clean run."""
    err, _ = ref.errors(out.cpu(), o64)
    assert err < (2e-2 if mode == "rtz" else 1e-2), f"finite elements off by {err:.3g} ({mode})"
