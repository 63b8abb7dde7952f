"""Finite inputs at and past float32's range (docs/numerics.md §4, "fp32 range") as reusable checks.

`run(q, k, v, scale, window)` returns (O, LSE) for bf16 q, k, v in bshd [1, S, H, 128] on `device`;
`run_varlen(q, k, v, cu_q, cu_k, max_q, max_k)` the same for packed sequences. Each check builds inputs
whose scores or P·V sums sit exactly where the contract puts a bound, runs them, and asserts the
outcome the table of §4 gives. Rows a case does not touch keep moderate values and must stay right.

The fp64 reference overflows nowhere on these inputs: it gives the true answer, which the checks
use for the rows that must be right and, for the outcomes that are wrong, to show that they are.
"""
from __future__ import annotations

import math

import pytest
import torch

from rtcattn.ops import checks
from rtcattn.ops.attention_fwd import reference as ref

D = 128
SK = 256          # four 64-key blocks of the gfx942 kernel (its tail split has parts), two of sm90's
SQ = 8
NAN_BITS, POS_INF_BITS, NEG_INF_BITS = ref.BF16_NAN, 0x7F80, 0xFF80
BIG = 1e38        # bf16 9.97e37: q = k = BIG is the example, one product is 1e76


def _inputs(sq=SQ, sk=SK, h=1, zero_dims=D, seed=0):
    """bshd q, k, v on the CPU: v random normal; q, k random normal past their first `zero_dims` dims
    (zero there), so a case writes huge values into dims no other row or key touches."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((1, s, h, D), generator=gen).to(torch.bfloat16) for s in (sq, sk, sk))
    q[..., :zero_dims] = 0
    k[..., :zero_dims] = 0
    return q, k, v


def _call(run, device, q, k, v, scale=None, window=(-1, -1)):
    o, lse = run(q.to(device), k.to(device), v.to(device), scale, window)
    assert o.dtype == torch.bfloat16 and tuple(o.shape) == tuple(q.shape), (o.dtype, o.shape)
    return o.cpu(), lse.cpu()


def _bits(o, rows, head=0):
    return ref.bf16_bits(o[0, rows, head])


def _assert_nan_rows(o, lse, rows, what, head=0):
    assert bool((_bits(o, rows, head) == NAN_BITS).all()), f"{what}: rows {rows} are not all 0x7FFF"
    assert bool(torch.isnan(lse[0, head, rows]).all()), f"{what}: LSE of rows {rows} is not NaN"


def _assert_empty_rows(o, lse, rows, what, head=0):
    """O = +0 exactly and LSE = -Inf: what a row that sees no key gives."""
    assert bool((_bits(o, rows, head) == 0).all()), f"{what}: rows {rows} are not +0"
    assert bool((lse[0, head, rows] == -math.inf).all()), f"{what}: LSE of rows {rows} is not -Inf"


def _assert_right(o, lse, o64, lse64, rows, what, head=0, unit=1.0):
    """The rows meet the contract's bounds for finite elements, relative to `unit` (the size of V)."""
    got, want = o[0, rows, head].double() / unit, o64[0, rows, head].double() / unit
    assert bool(torch.isfinite(got).all()), f"{what}: non-finite output"
    err = (got - want).abs().max().item()
    assert err < 1e-2, f"{what}: rows {rows} off by {err:.3g} (in units of {unit:.3g})"
    assert bool(ref.lse_close(lse[0, head, rows], lse64[0, head, rows]).all()), f"{what}: LSE of rows {rows} off"


def _rows(*excluded, n=SQ):
    return [i for i in range(n) if i not in excluded]


def check_at_the_bounds(run, device):
    """Scores and P·V sums exactly at the sufficient bounds: finite and right. Head 0: |q| = |k| = 2^60,
    so every q·k is 2^120 times a sum of 128 signs, |q·k| <= 2^127 (distinct scores: the weights are a
    hard arg max). Head 1: every q·k is 2^127 and every key weighs 1, so O is the mean of V; n·max|v| =
    256 · 2^118 = 2^126, reached in column 0 where every v is +2^118."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = _inputs(h=2)
    q[:] = 2.0 ** 60
    k[0, :, 0] = 2.0 ** 60 * (torch.randint(0, 2, (SK, D), generator=gen) * 2 - 1)
    k[0, :, 1] = 2.0 ** 60
    v[0, :, 1] = 2.0 ** 118 * (torch.randint(0, 2, (SK, D), generator=gen) * 2 - 1)
    v[0, :, 1, 0] = 2.0 ** 118
    o, lse = _call(run, device, q, k, v)
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd")
    _assert_right(o, lse, o64, lse64, _rows(), "scores at 2^127, hard arg max", head=0)
    _assert_right(o, lse, o64, lse64, _rows(), "P·V sums at 2^126", head=1, unit=2.0 ** 118)


def check_score_past_flt_max_is_nan(run, device):
    """A score past +FLT_MAX makes its row NaN (LSE NaN), wherever the overflow happens; other rows
    stay right."""
    q, k, v = _inputs(sq=SQ, sk=SK, h=1)
    q[:], k[:] = BIG, BIG                                        # the example: every row
    o, lse = _call(run, device, q, k, v)
    _assert_nan_rows(o, lse, _rows(), "q = k = 1e38")

    q, k, v = _inputs(zero_dims=2, seed=2)
    q[0, 0, 0, 0], k[0, 5, 0, 0] = BIG, BIG                     # row 0: one product 1e76
    # Row 2: q·k = 1.25·2^128 overflows in the fp32 accumulator although scale·q·k = 3.8e37 would fit:
    # the scale comes after the dot product.
    q[0, 2, 0, 1], k[0, 7, 0, 1] = 2.0 ** 64, 1.25 * 2.0 ** 64
    o, lse = _call(run, device, q, k, v)
    _assert_nan_rows(o, lse, [0], "one score of 1e76")
    _assert_nan_rows(o, lse, [2], "q·k = 1.25·2^128 before the scale")
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd")
    _assert_right(o, lse, o64, lse64, _rows(0, 2), "rows beside the overflowing ones")

    # Row 4: q·k = 2^30 fits, scale·log2(e)·q·k = 1.8e39 does not.
    q, k, v = _inputs(seed=3)
    q[0, 4, 0, 0], k[0, 9, 0, 0] = 2.0 ** 15, 2.0 ** 15
    o, lse = _call(run, device, q, k, v, scale=2.0 ** 100)
    _assert_nan_rows(o, lse, [4], "scale·q·k past FLT_MAX")
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd", 2.0 ** 100)
    _assert_right(o, lse, o64, lse64, _rows(4), "rows beside the overflowing one")

    # scale·log2(e) itself past FLT_MAX (scale > 2.36e38, although float32 holds the scale) would make every
    # positive score +Inf: refused before launch, naming the bound.
    q, k, v = _inputs(zero_dims=0, seed=4)
    with pytest.raises(ValueError, match=r"softmax_scale=3e\+38 is not supported; accepted: .*2\.358\d*e\+38"):
        _call(run, device, q, k, v, scale=3.0e38)


def _all_below(case: str):
    """q, k, scale whose every score is past -FLT_MAX: by far (the issue's q·k = -1e76), just past it
    before the scale (q·k = -1.25·2^128 while scale·q·k = -3.8e37 would fit), only after the scale
    (q·k = -2^30), or through the largest scale accepted (c = scale·log2(e) just below FLT_MAX)."""
    q, k, v = _inputs(seed=5)
    if case == "issue":
        q[:], k[:] = BIG, -BIG
        return q, k, v, None
    if case == "unscaled":
        q[..., 0], k[..., 0] = 2.0 ** 64, -1.25 * 2.0 ** 64
        return q, k, v, None
    if case == "c":
        q[..., 0], k[..., 0] = 2.0, -1.0
        return q, k, v, checks.SCALE_MAX
    q[..., 0], k[..., 0] = 2.0 ** 15, -(2.0 ** 15)
    return q, k, v, 2.0 ** 100


def check_every_score_below_flt_max(run, device):
    """Every score a row sees is -Inf while the row sees keys: NaN row, LSE NaN, so that it cannot pass
    for a row that sees no key (0, LSE -Inf), whichever step overflowed."""
    for case in ("issue", "unscaled", "scaled", "c"):
        q, k, v, scale = _all_below(case)
        o, lse = _call(run, device, q, k, v, scale)
        _assert_nan_rows(o, lse, _rows(), f"every score past -FLT_MAX ({case})")


def check_every_score_below_flt_max_masked(run, run_varlen, device):
    """The same beside rows that see no key, which stay 0 with LSE -Inf: causal with Sq = 300 > Sk = 256
    (rows 0..43 see none), and a packed batch whose first sequence has no key."""
    q, k, v = _inputs(sq=300, seed=6)
    q[:], k[:] = BIG, -BIG
    o, lse = _call(run, device, q, k, v, window=(-1, 0))
    _assert_empty_rows(o, lse, list(range(44)), "causal rows that see no key")
    _assert_nan_rows(o, lse, list(range(44, 300)), "causal rows whose every score is -Inf")

    q, k, v = _inputs(sq=2 * SQ, seed=7)
    q[:], k[:] = BIG, -BIG
    cu_q = torch.tensor([0, SQ, 2 * SQ], dtype=torch.int32)
    cu_k = torch.tensor([0, 0, SK], dtype=torch.int32)           # sequence 0 has no key
    o, lse = run_varlen(*(t[0].to(device) for t in (q, k, v)), cu_q.to(device), cu_k.to(device), SQ, SK)
    o, lse = o.cpu()[None], lse.cpu()[None]
    _assert_empty_rows(o, lse, list(range(SQ)), "a sequence without keys")
    _assert_nan_rows(o, lse, list(range(SQ, 2 * SQ)), "a sequence whose every score is -Inf")


def check_minus_inf_among_finite_scores(run, device, sums_in_d_order=True):
    """A -Inf score beside finite ones weighs 0. Row 0: the product q·k = -1e76 itself overflows, its
    true weight underflows too: right. Row 1: q·k = 0 exactly, but the fp32 sum in d order passes
    -FLT_MAX on the way (-2.13e38 twice, then +2.13e38 twice): the key is dropped, silently wrong.
    Key 9 is row 1's best key by far, so dropping it changes the row. Whether a partial sum overflows
    depends on the order of the sum: the baseline and the emulated matrix unit sum in d order
    (sums_in_d_order); a hardware matrix unit may give a third, finite answer (below)."""
    q, k, v = _inputs(zero_dims=5, seed=8)
    q[0, 0, 0, 0], k[0, 5, 0, 0] = BIG, -BIG
    q[0, 1, 0, 1:5] = 2.0 ** 64
    k[0, 9, 0, 1:5] = torch.tensor([-1.0, -1.0, 1.0, 1.0]) * 1.25 * 2.0 ** 63
    k[0, 9, 0, 5:] = q[0, 1, 0, 5:]
    o, lse = _call(run, device, q, k, v)
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd")
    _assert_right(o, lse, o64, lse64, _rows(1), "a key whose product overflows to -Inf weighs 0")
    keep = [j for j in range(SK) if j != 9]
    o64_drop, lse64_drop = ref.reference_fp64(q, k[:, keep], v[:, keep], "bshd")
    wrong = (o[0, 1, 0].double() - o64[0, 1, 0]).abs().max().item()
    dropped = (o[0, 1, 0].double() - o64_drop[0, 1, 0]).abs().max().item()
    if sums_in_d_order:
        assert dropped < 1e-2 and wrong > 0.1, f"row 1 should be the answer without key 9 ({dropped:.3g}, {wrong:.3g})"
        assert bool(ref.lse_close(lse[0, 0, 1], lse64_drop[0, 0, 1]))
    else:
        # Hopper's wgmma adds a k-group's products at the largest one's exponent: the huge ones cancel without
        # overflowing, but the group's small products are lost with them, so row 1 is off (0.12 on an H100)
        # without being the answer that drops key 9 (3.0 off). Either way it stays finite, as the contract says.
        assert bool(torch.isfinite(o[0, 1, 0].double()).all()) and bool(torch.isfinite(lse[0, 0, 1])), \
            f"row 1 is not finite ({dropped:.3g}, {wrong:.3g})"


def check_pv_sum_past_flt_max(run, device):
    """The unnormalised P·V accumulator past ±FLT_MAX: ±Inf in that column, or NaN when a larger row
    max later rescales the Inf by 2^(m_old - m_new) = 0. The LSE and the other columns stay right."""
    q, k, v = _inputs(seed=9)                                    # q = 0: every key weighs 1
    v[..., 3], v[..., 4] = 3e38, -3e38                           # the example: mean 3e38
    o, lse = _call(run, device, q, k, v)
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd")
    assert bool((_bits(o, _rows())[:, 3] == POS_INF_BITS).all()), "sum past +FLT_MAX: +Inf"
    assert bool((_bits(o, _rows())[:, 4] == NEG_INF_BITS).all()), "sum past -FLT_MAX: -Inf"
    o[..., 3:5], o64[..., 3:5] = 0, 0
    _assert_right(o, lse, o64, lse64, _rows(), "columns beside the overflowing ones")

    q, k, v = _inputs(seed=10)
    q[..., 0] = 1.0
    k[0, 200, 0, 0] = 4096.0          # scale·log2(e)·4096 = 522: key 200 (a later block) outweighs the rest
    v[..., 3] = 0
    v[0, :2, 0, 3], v[0, 200, 0, 3] = 3e38, 1.0
    o, lse = _call(run, device, q, k, v)
    o64, lse64 = ref.reference_fp64(q, k, v, "bshd")
    assert bool((_bits(o, _rows())[:, 3] == NAN_BITS).all()), "Inf rescaled by 0: NaN, where the answer is 1"
    assert bool(((o64[0, :, 0, 3] - 1.0).abs() < 1e-6).all())
    o[..., 3], o64[..., 3] = 0, 0
    _assert_right(o, lse, o64, lse64, _rows(), "columns beside the NaN one")
