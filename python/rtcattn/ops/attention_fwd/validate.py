"""attention_fwd's argument checks, run before anything launches, for its three kv forms: dense ([B, S, H, D]
or [B, H, S, D]), packed sequences (varlen) and a paged KV cache.

What needs no device memory is checked on every call: types, dtypes, shapes, devices, sizes. What only
device memory holds (cu_seqlens monotonic and ending at the totals, block ids inside the pool) is checked
only under RTCATTN_CHECK=1, because reading it costs a host sync; without it the kernels clamp every
sequence and page to the tensors (docs/numerics.md), so bad metadata never reaches outside them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import checks
from . import OP, kvquant

# q, k, v and out share one of these dtypes; each one's value on the manifest's dtype axis (LSE is fp32 always).
DTYPE_AXIS = {torch.bfloat16: "bf16", torch.float16: "fp16"}
DTYPES = tuple(DTYPE_AXIS)
LAYOUTS = ("bshd", "bhsd")   # dense tensors' dim orders; the strides carry them, no kernel is compiled per layout
_DENSE_TEXT = "[B, S, H, D] for layout 'bshd' or [B, H, S, D] for 'bhsd'"


def axis_values(axis: str) -> tuple:
    """The values of one of the op's axes, as the manifest declares them (round_mode, mask, kv, ...)."""
    from ...runtime import manifest
    return tuple(manifest.load().op(OP).axis_values(axis))


def axis_define(axis: str, value) -> int:
    """The integer the manifest gives value on axis (its -D define's value): what an argument-block field naming the
    call's value holds (kv_dtype)."""
    from ...runtime import manifest
    return manifest.load().op(OP).axis(axis).define_value(value)


@dataclass(frozen=True)
class ScoreMod:
    """A call's score modifications (docs/numerics.md, "Soft cap and ALiBi"): softcap > 0 caps each scaled score s at
    softcap * tanh(s / softcap) (0: off); alibi_slopes (fp32 [Hq] or [B, Hq]) adds -slope * |j - (i + Sk - Sq)|."""
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None

    @property
    def axis(self) -> str:
        """The value of the manifest's score_mod axis this call needs."""
        cap, alibi = self.softcap > 0, self.alibi_slopes is not None
        return "softcap_alibi" if cap and alibi else "softcap" if cap else "alibi" if alibi else "plain"

    def strides(self) -> tuple:
        """(batch, head) element strides of the slopes: [Hq] shares one row across the batch (stride 0)."""
        t = self.alibi_slopes
        return (0, t.stride(0)) if t.dim() == 1 else (t.stride(0), t.stride(1))

    def tensors(self) -> tuple:
        return (("alibi_slopes", self.alibi_slopes),) if self.alibi_slopes is not None else ()


NO_SCORE_MOD = ScoreMod()


@dataclass(frozen=True)
class Dropout:
    """A call's dropout (docs/numerics.md, "Dropout"): p in [0, 1) (0: off) and rng_state, int64 [2] on q's device,
    the Philox key and counter offset the keep mask is a function of (drawn from torch's generator by the public
    entries: dropout.draw_rng_state)."""
    p: float = 0.0
    rng_state: torch.Tensor | None = None

    @property
    def axis(self) -> str:
        """The value of the manifest's dropout axis this call needs."""
        return "dropout" if self.p > 0 else "nodrop"

    def tensors(self) -> tuple:
        return (("rng_state", self.rng_state),) if self.rng_state is not None else ()


NO_DROPOUT = Dropout()


def check_dropout_p(p, name: str = "dropout_p") -> float:
    """dropout_p as the kernels take it: a float in [0, 1) (FlashAttention's range)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name}={p!r} ({type(p).__name__}) is not supported; accepted: a float in [0, 1)")
    if not 0 <= p < 1:
        raise ValueError(f"{name}={p!r} is not supported; accepted: a float in [0, 1)")
    return float(p)


def check_dropout(drop: Dropout, device: torch.device) -> Dropout:
    """p in [0, 1); rng_state int64 [2] on q's device exactly when p > 0."""
    check_dropout_p(drop.p)
    t = drop.rng_state
    if drop.p > 0 and t is None:
        raise ValueError(f"rng_state=None with dropout_p={drop.p!r} is not supported; accepted: an int64 [2] "
                         "generator state (the public entries draw it: rtcattn.ops.attention_fwd.dropout."
                         "draw_rng_state)")
    if t is not None:
        checks.check_type("rng_state", t)
        if drop.p == 0:
            raise ValueError("rng_state is set with dropout_p=0.0; accepted: rng_state only with dropout_p > 0")
        if t.dtype != torch.int64 or tuple(t.shape) != (2,) or t.device != device:
            raise ValueError(f"rng_state (shape {tuple(t.shape)}, {t.dtype}, {t.device}) is not supported; "
                             f"accepted: int64 [2] on {device}")
    return drop


def check_softcap(softcap, name: str = "softcap") -> float:
    """softcap as the kernels take it: 0 (off) or a finite float > 0 (FlashAttention's; a negative cap is refused).
    name: the argument's name in the caller's signature (AITER's logits_soft_cap)."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{name}={softcap!r} ({type(softcap).__name__}) is not supported; accepted: 0.0 (off) or a "
                        "finite float > 0")
    if not (softcap == 0 or checks.FLOAT32_TINY <= softcap <= checks.SCALE_MAX):
        raise ValueError(f"{name}={softcap!r} is not supported; accepted: 0.0 (off) or a finite float > 0 in "
                         f"[{checks.FLOAT32_TINY:.7g}, {checks.SCALE_MAX:.7g}] (a normal float32 whose product with "
                         "log2(e) is finite in float32)")
    return float(softcap)


def check_score_mod(score: ScoreMod, batch: int, heads: int, device: torch.device) -> ScoreMod:
    """softcap checked (check_softcap); alibi_slopes fp32 [heads] or [batch, heads] on q's device."""
    check_softcap(score.softcap)
    t = score.alibi_slopes
    if t is not None:
        checks.check_type("alibi_slopes", t)
        if t.dtype != torch.float32 or tuple(t.shape) not in ((heads,), (batch, heads)) or t.device != device:
            raise ValueError(f"alibi_slopes (shape {tuple(t.shape)}, {t.dtype}, {t.device}) is not supported; "
                             f"accepted: float32 [Hq] = [{heads}] or [B, Hq] = [{batch}, {heads}] on {device}")
    return score


@dataclass(frozen=True)
class Problem:
    """A dense call's sizes."""
    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    scale: float
    heads_k: int = 0          # K/V heads (GQA/MQA: heads is a multiple of it); 0 = heads
    window: tuple = (-1, -1)  # (left, right) keys around the diagonal; -1 unbounded; causal: right 0
    kv_dtype: str = "same"    # the manifest's kv_dtype axis: a dense call's K / V are always q's dtype
    score: ScoreMod = NO_SCORE_MOD  # the soft cap and ALiBi slopes (the manifest's score_mod axis)
    dropout: Dropout = NO_DROPOUT   # dropout's p and generator state (the manifest's dropout axis)

    @property
    def masked(self) -> bool:
        return self.window != (-1, -1)


@dataclass(frozen=True)
class VarlenProblem:
    """A packed call's sizes."""
    batch: int          # sequences: len(cu_seqlens_q) - 1
    heads: int
    heads_k: int
    head_dim: int
    total_q: int
    total_k: int        # rows of k / v (varlen); 0 when paged
    max_seqlen_q: int
    max_seqlen_k: int
    scale: float
    window: tuple = (-1, -1)
    page_size: int = 0  # paged: rows per page; 0 = k / v packed like q
    num_pages: int = 0
    pages_per_seq: int = 0
    kv_dtype: str = "same"  # the manifest's kv_dtype axis: "same" (q's dtype) or a quantized cache's format
    score: ScoreMod = NO_SCORE_MOD  # the soft cap and ALiBi slopes (the manifest's score_mod axis)
    dropout: Dropout = NO_DROPOUT   # dropout's p and generator state (the manifest's dropout axis)

    @property
    def masked(self) -> bool:
        return self.window != (-1, -1)

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def kv(self) -> str:
        """The value of the manifest's kv axis this call needs."""
        return "paged" if self.paged else "varlen"


def shape_of(t: torch.Tensor, layout: str):
    """(B, S, H, D) of a dense tensor, whatever the layout."""
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == "bshd" else (b, y, x, d)


def head_dim_rule():
    """(supports(d), description) from the manifest's kernels. The kernels take the head dims of their buckets
    (8..256 in steps of 8 today); a head dim between those, no smaller than the smallest one, is supported too:
    the op pads q, k and v with zero columns to the next head dim a kernel takes (padded_head_dim)."""
    global _head_dim_rule
    if _head_dim_rule is None:  # read once per process: every call checks the head dim
        from ...runtime import manifest
        specs = {k.axes["head_dim"] for k in manifest.load().op(OP).kernels}
        lo, hi = min(s.lo for s in specs), max(s.hi for s in specs)
        taken = sorted({d for s in specs for d in range(s.lo, s.hi + 1, s.step)})
        # padded[d - lo]: the smallest head dim >= d that some kernel takes (d itself when one does)
        padded, j = [], 0
        for d in range(lo, hi + 1):
            j += taken[j] < d
            padded.append(taken[j])
        _head_dim_rule = (lambda d: lo <= d <= hi), _head_dim_text(specs, lo, hi), padded, lo
    return _head_dim_rule[:2]


def _head_dim_text(specs, lo: int, hi: int) -> str:
    # The head dims each kernel takes (its buckets aside: every bucket serves the dims up to it), once per range.
    ranges = {(s.lo, s.hi, s.step): s for s in specs}
    widest = [s for r, s in ranges.items() if not any(o != r and o[0] <= r[0] and r[1] <= o[1] and o[2] <= r[2]
                                                        for o in ranges)]
    if len(widest) == 1 and (widest[0].lo, widest[0].hi, widest[0].lo % widest[0].step) == (lo, hi, 0):
        step = widest[0].step  # every multiple of step in lo..hi is taken by some kernel
        return (f"a head dim in {lo}..{hi}; one that is not a multiple of {step} is padded to the next multiple "
                f"of {step}")
    taken = "; ".join(s.describe() for s in sorted(widest, key=lambda s: s.lo))
    return f"a head dim in {lo}..{hi}; the kernels take {taken}, any other is padded to the next one they take"


def padded_head_dim(d: int) -> int:
    """The head dim the kernels run a call of head dim d (one head_dim_rule supports) with: d when a kernel takes
    it, else the next one that a kernel takes, q, k and v padded with zero columns up to it."""
    head_dim_rule()
    _, _, padded, lo = _head_dim_rule
    return padded[d - lo]


_head_dim_rule = None


def _check_head_dim(d: int, q: torch.Tensor) -> None:
    supports, rule = head_dim_rule()
    if not supports(d):
        raise ValueError(f"head dim D={d} (q.shape={tuple(q.shape)}) is not supported; accepted: {rule}")


def _heads_error(hq: int, hk: int, where: str = "") -> ValueError:
    return ValueError(f"mismatched number of heads{where}: q={hq}, k=v={hk}; accepted: q heads a multiple of the "
                      "k/v heads (equal, GQA or MQA)")


def check_inputs(q, k, v, layout: str = "bshd", round_mode: str = "rtne", softmax_scale=None,
                 out: torch.Tensor | None = None, window: tuple = (-1, -1), score: ScoreMod = NO_SCORE_MOD,
                 dropout: Dropout = NO_DROPOUT) -> Problem:
    """A dense call: every check that needs no device. Returns the problem sizes."""
    checks.check_choice("layout", layout, LAYOUTS)
    checks.check_choice("round_mode", round_mode, axis_values("round_mode"))
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.check_tensor(name, t, DTYPES, 4, _DENSE_TEXT)
    checks.check_same_dtype((("q", q), ("k", k), ("v", v)), DTYPES)
    checks.check_same("devices", ("q.device", "k.device", "v.device"), (q.device, k.device, v.device))
    (bq, sq, hq, dq), (bk, sk, hk, dk), (bv, sv, hv, dv) = (shape_of(t, layout) for t in (q, k, v))
    checks.check_same(f"batch size (layout {layout!r})", ("q", "k", "v"), (bq, bk, bv))
    checks.check_same(f"number of heads of k and v (layout {layout!r})", ("k", "v"), (hk, hv))
    if (hk == 0 and hq != 0) or (hk != 0 and hq % hk != 0):  # H = 0 on both: an empty call
        raise _heads_error(hq, hk, f" (layout {layout!r})")
    checks.check_same("head dim", ("q", "k", "v"), (dq, dk, dv))
    checks.check_same(f"key/value sequence length (layout {layout!r})", ("k", "v"), (sk, sv))
    if sk == 0:
        raise ValueError(f"k sequence length Sk=0 (k.shape={tuple(k.shape)}, layout {layout!r}) is not "
                         "supported; accepted: Sk >= 1")
    _check_head_dim(dq, q)
    check_score_mod(score, bq, hq, q.device)
    check_dropout(dropout, q.device)
    if out is not None:
        checks.check_out(out, q, DTYPES, (("q", q), ("k", k), ("v", v)) + score.tensors() + dropout.tensors())
        checks.check_same_dtype((("q", q), ("out", out)), DTYPES)
    return Problem(bq, hq, sq, sk, dq, checks.check_scale(softmax_scale, dq), hk, tuple(window), score=score,
                   dropout=dropout)


# ---- quantized K / V caches (docs/numerics.md §10): the manifest's kv_dtype axis ---------------------------------

# An FP8 cache's torch dtype -> its kv_dtype value; an FP4 cache is uint8, named by kv_cache_dtype="fp4_e2m1".
FP8_KV_DTYPES = {dtype: name for name, dtype in kvquant.FP8_DTYPES.items()}
# "auto": read off the cache's dtype. "fp4_e2m1_native": an FP4 cache read by gfx950's scaled MFMA with q quantized to
# FP8 E4M3 per (row, head) (an opt-in: the numerics change, docs/numerics.md §10; the gfx950 decode kernel's only).
KV_CACHE_DTYPE_ARGS = ("auto", "fp8_e4m3", "fp8_e4m3fnuz", "fp4_e2m1", "fp4_e2m1_native")
FP4_KV_DTYPES = ("fp4_e2m1", "fp4_e2m1_native")  # the kv_dtype values of an FP4 cache (one layout, two readings)


def is_fp4(kv_dtype: str) -> bool:
    """An FP4 cache's kv_dtype (or kv_cache_dtype) value: uint8 codes and E8M0 scales, read either way."""
    return kv_dtype in FP4_KV_DTYPES
_FP8_TEXT = "torch.float8_e4m3fn or torch.float8_e4m3fnuz"


@dataclass(frozen=True)
class KvQuant:
    """A call's quantized-cache arguments, as given (None where not)."""
    kv_cache_dtype: str = "auto"
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def tensors(self) -> tuple:
        """(name, tensor) of those given."""
        return tuple((n, t) for n in ("k_descale", "v_descale", "k_scale", "v_scale")
                     if (t := getattr(self, n)) is not None)


NO_QUANT = KvQuant()  # a call without a quantized cache's arguments


def kv_dtype_of(k, v, kv_cache_dtype: str, names=("k", "v")) -> str:
    """The kv_dtype axis value of caches k, v: "same" (bf16 / fp16, q's), an FP8 dtype's, or "fp4_e2m1" /
    "fp4_e2m1_native" (uint8 with that kv_cache_dtype). k and v are checked as tensors first."""
    checks.check_choice("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPE_ARGS)
    for name, t in zip(names, (k, v)):
        checks.check_type(name, t)
    if is_fp4(kv_cache_dtype):
        for name, t in zip(names, (k, v)):
            if t.dtype != torch.uint8:
                raise TypeError(f"{name}.dtype={t.dtype} with kv_cache_dtype={kv_cache_dtype!r} is not supported; "
                                "accepted: torch.uint8 (two E2M1 values a byte)")
        return kv_cache_dtype
    if k.dtype in FP8_KV_DTYPES or v.dtype in FP8_KV_DTYPES:
        if k.dtype != v.dtype:
            raise TypeError(f"mismatched dtypes: {names[0]}.dtype={k.dtype}, {names[1]}.dtype={v.dtype}; accepted: "
                            f"one FP8 dtype for both ({_FP8_TEXT})")
        value = FP8_KV_DTYPES[k.dtype]
        if kv_cache_dtype not in ("auto", value):
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} with {names[0]}.dtype={k.dtype} is not supported; "
                             f"accepted: 'auto' or {value!r}")
        return value
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} with {names[0]}.dtype={k.dtype} is not supported; "
                         f"accepted: 'auto' (a cache in q's dtype), {_FP8_TEXT} caches with 'auto' or their name, "
                         "uint8 caches with 'fp4_e2m1'")
    if k.dtype == torch.uint8:
        raise TypeError(f"{names[0]}.dtype=torch.uint8 is not supported without kv_cache_dtype='fp4_e2m1'; accepted: "
                        f"torch.bfloat16, torch.float16, {_FP8_TEXT}, or uint8 FP4 with kv_cache_dtype='fp4_e2m1'")
    return "same"


def check_kv_quant(kv_dtype: str, quant: KvQuant, batch: int, hk: int, d: int, device,
                   scale_shape: tuple | None) -> None:
    """The descales (FP8: fp32 [batch, Hk] or one element, each optional) and scales (FP4: uint8 scale_shape, both
    required) a kv_dtype takes, and none it does not; a quantized cache's head dim a multiple of 8 (no padding)."""
    fp8, fp4 = kv_dtype.startswith("fp8"), is_fp4(kv_dtype)
    what = "a cache in q's dtype" if kv_dtype == "same" else f"a {kv_dtype} cache"
    for name in ("k_descale", "v_descale"):
        t = getattr(quant, name)
        if t is None:
            continue
        checks.check_type(name, t)
        if not fp8:
            raise ValueError(f"{name} given with {what} is not supported; accepted: {name}=None (descales go with an "
                             f"FP8 cache, {_FP8_TEXT})")
        if t.dtype != torch.float32:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: torch.float32")
        if t.device != device:
            raise ValueError(f"{name}.device={t.device} is not supported; accepted: q's device {device}")
        if not (t.numel() == 1 or tuple(t.shape) == (batch, hk)):
            raise ValueError(f"{name}.shape={tuple(t.shape)} is not supported; accepted: [B={batch}, Hk={hk}] (per "
                             "sequence and K/V head) or one element (per tensor)")
    for name in ("k_scale", "v_scale"):
        t = getattr(quant, name)
        if not fp4:
            if t is not None:
                raise ValueError(f"{name} given with {what} is not supported; accepted: {name}=None (E8M0 scales go "
                                 "with kv_cache_dtype='fp4_e2m1')")
            continue
        if t is None:
            raise ValueError(f"{name}=None with kv_cache_dtype='fp4_e2m1' is not supported; accepted: its E8M0 scales, "
                             f"uint8 {list(scale_shape)} [num_blocks, page_size, Hk]")
        checks.check_type(name, t)
        if t.dtype != torch.uint8:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: torch.uint8 (E8M0)")
        if tuple(t.shape) != tuple(scale_shape):
            raise ValueError(f"{name}.shape={tuple(t.shape)} is not supported; accepted: {list(scale_shape)} "
                             "[num_blocks, page_size, Hk] (one E8M0 byte per key row and head)")
        if t.device != device:
            raise ValueError(f"{name}.device={t.device} is not supported; accepted: q's device {device}")
    if kv_dtype != "same" and d % 8:
        raise ValueError(f"head dim D={d} with {what} is not supported; accepted: a multiple of 8 (a quantized cache "
                         "is not padded)")


def descale_strides(t: torch.Tensor | None) -> tuple:
    """A descale's (sequence, head) element strides for the argument block: (0, 0) for one value or none."""
    return (0, 0) if t is None or t.numel() == 1 else (t.stride(0), t.stride(1))


def check_max(name: str, value) -> int:
    return checks.check_int(name, value, 1, checks.MAX_SIZE, " (the longest sequence's length)")


def check_num_splits(value) -> int:
    """flash-attn's num_splits: parts of the KV range (the argument block's max_splits, an int32, bounds it)."""
    return checks.check_int("num_splits", value, 0, checks.MAX_SIZE, " (0: heuristic, 1: no split, n: at most n)")


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, round_mode: str = "rtne",
                        softmax_scale=None, out: torch.Tensor | None = None, window: tuple = (-1, -1),
                        block_table: torch.Tensor | None = None,
                        seqused_k: torch.Tensor | None = None, quant: KvQuant = NO_QUANT,
                        score: ScoreMod = NO_SCORE_MOD, dropout: Dropout = NO_DROPOUT) -> VarlenProblem:
    """A packed call: every check that needs no device memory. q [total_q, Hq, D]; k, v [total_k, Hk, D], or
    with block_table [num_pages, page_size, Hk, D]; cu_seqlens_* int32 [B + 1]; block_table int32 [B, pages];
    seqused_k int32 [B] (sequence b's KV length; cu_seqlens_k[b] is then only its first key row when not paged).
    quant: an FP8 cache's descales, or an FP4 cache (paged only: uint8 [num_pages, Hk, page_size, D / 2]) and its
    scales."""
    checks.check_choice("round_mode", round_mode, axis_values("round_mode"))
    paged = block_table is not None
    kv_dtype = kv_dtype_of(k, v, quant.kv_cache_dtype)
    fp4 = is_fp4(kv_dtype)
    if fp4 and not paged:
        raise ValueError("kv_cache_dtype='fp4_e2m1' without block_table is not supported; accepted: an FP4 cache in "
                         "pages, uint8 [num_pages, Hk, page_size, D / 2] with block_table")
    kv_text = ("[num_pages, Hk, page_size, D / 2] (FP4, paged)" if fp4 else
               "[num_pages, page_size, Hk, D] (paged: block_table given)" if paged else "[total_k, Hk, D]")
    checks.check_tensor("q", q, DTYPES, 3, "[total_q, Hq, D]")
    for name, t in (("k", k), ("v", v)):
        checks.check_tensor(name, t, DTYPES if kv_dtype == "same" else (k.dtype,), 4 if paged else 3, kv_text)
    if kv_dtype == "same":
        checks.check_same_dtype((("q", q), ("k", k), ("v", v)), DTYPES)
    device = q.device
    checks.check_same("devices", ("q.device", "k.device", "v.device"), (q.device, k.device, v.device))
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        checks.check_index_tensor(name, t, 1, "1 dim, [batch + 1]", device)
        if t.shape[0] < 1:
            raise ValueError(f"{name}.shape={tuple(t.shape)} is not supported; accepted: [batch + 1], at least 1 entry")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"len(cu_seqlens_q)={cu_seqlens_q.shape[0]} != len(cu_seqlens_k)={cu_seqlens_k.shape[0]}; "
                         "accepted: equal lengths (batch + 1 each)")
    batch = cu_seqlens_q.shape[0] - 1
    if seqused_k is not None:
        checks.check_index_tensor("seqused_k", seqused_k, 1, "1 dim, [batch]", device)
        if seqused_k.shape[0] != batch:
            raise ValueError(f"seqused_k.shape={tuple(seqused_k.shape)} is not supported; accepted: [batch={batch}] "
                             "(batch = len(cu_seqlens_q) - 1)")
    check_max("max_seqlen_q", max_seqlen_q)
    check_max("max_seqlen_k", max_seqlen_k)
    total_q, hq, d = q.shape
    checks.check_same("k and v shapes", ("k", "v"), (tuple(k.shape), tuple(v.shape)))
    hk, dk = (k.shape[1], 2 * k.shape[3]) if fp4 else (k.shape[-2], k.shape[-1])
    if hk == 0 or hq % hk != 0:
        raise _heads_error(hq, hk)
    checks.check_same("head dim" + (" (FP4: 2 * k.shape[3])" if fp4 else ""), ("q", "k", "v"), (d, dk, dk))
    _check_head_dim(d, q)
    page_size = num_pages = pages = 0
    total_k = 0
    if paged:
        checks.check_index_tensor("block_table", block_table, 2, "2 dims, [batch, max_pages_per_seq]", device)
        if block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ValueError(f"block_table.shape={tuple(block_table.shape)} is not supported; accepted: "
                             f"[batch={batch}, pages >= 1] (batch = len(cu_seqlens_q) - 1)")
        num_pages, page_size = k.shape[0], k.shape[2 if fp4 else 1]
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"k.shape={tuple(k.shape)} is not supported; accepted: {kv_text}, num_pages and "
                             "page_size >= 1")
        pages = block_table.shape[1]
    else:
        total_k = k.shape[0]
        if total_k == 0 and total_q > 0:
            raise ValueError(f"k.shape={tuple(k.shape)} (total_k=0) is not supported; accepted: total_k >= 1")
    check_kv_quant(kv_dtype, quant, batch, hk, d, device, (num_pages, page_size, hk) if fp4 else None)
    check_score_mod(score, batch, hq, device)
    check_dropout(dropout, device)
    if out is not None:  # the metadata too: the kernels read cu_seqlens and the block table all along
        metadata = (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)) + (
            (("block_table", block_table),) if paged else ()) + (
            (("seqused_k", seqused_k),) if seqused_k is not None else ()) + quant.tensors() + score.tensors() + (
            dropout.tensors())
        checks.check_out(out, q, DTYPES, (("q", q), ("k", k), ("v", v)) + metadata)
        checks.check_same_dtype((("q", q), ("out", out)), DTYPES)
    return VarlenProblem(batch, hq, hk, d, total_q, total_k, max_seqlen_q, max_seqlen_k,
                         checks.check_scale(softmax_scale, d), tuple(window), page_size, num_pages, pages, kv_dtype,
                         score, dropout)


def check_device_metadata(cu_seqlens_q, cu_seqlens_k, block_table, problem: VarlenProblem, seqused_k=None) -> None:
    """RTCATTN_CHECK=1: reads cu_seqlens, seqused_k and the block table back (a host sync) and checks their
    values."""
    cq, ck = (t.to("cpu").tolist() for t in (cu_seqlens_q, cu_seqlens_k))
    # Rows past max_seqlen_q are not computed, so a longer q sequence is refused; max_seqlen_k bounds
    # nothing (every kernel uses all of a sequence's keys, as FlashAttention does) but seqused_k's values.
    offsets = (("cu_seqlens_q", cq, problem.total_q, ("max_seqlen_q", problem.max_seqlen_q)),)
    if seqused_k is None:
        offsets += (("cu_seqlens_k", ck, None if problem.paged else problem.total_k, None),)
        lens = [ck[b + 1] - ck[b] for b in range(problem.batch)]
    else:
        lens = _check_seqused(ck, seqused_k.to("cpu").tolist(), problem)
    for name, cu, total, longest in offsets:
        if cu[0] != 0:
            raise ValueError(f"{name}[0]={cu[0]} is not supported; accepted: 0 (RTCATTN_CHECK=1)")
        for b in range(problem.batch):
            if cu[b + 1] < cu[b]:
                raise ValueError(f"{name}[{b + 1}]={cu[b + 1]} < {name}[{b}]={cu[b]}; accepted: non-decreasing "
                                 "offsets (RTCATTN_CHECK=1)")
            if longest is not None and cu[b + 1] - cu[b] > longest[1]:
                raise ValueError(f"sequence {b} has length {cu[b + 1] - cu[b]} > {longest[0]}={longest[1]}; "
                                 f"accepted: {longest[0]} >= every length (RTCATTN_CHECK=1)")
        if total is not None and cu[-1] != total:
            raise ValueError(f"{name}[-1]={cu[-1]} is not supported; accepted: the packed rows, {total} "
                             "(RTCATTN_CHECK=1)")
    if not problem.paged:
        return
    table = block_table.to("cpu")
    for b in range(problem.batch):
        n = -(-lens[b] // problem.page_size)
        if n > problem.pages_per_seq:
            raise ValueError(f"sequence {b} has {lens[b]} keys, {n} pages > block_table.shape[1]="
                             f"{problem.pages_per_seq}; accepted: a block table that holds every page "
                             "(RTCATTN_CHECK=1)")
        ids = table[b, :n]
        bad = ((ids < 0) | (ids >= problem.num_pages)).nonzero()
        if bad.numel():
            j = int(bad[0, 0])
            raise ValueError(f"block_table[{b}, {j}]={int(ids[j])} is not supported; accepted: a page id in "
                             f"[0, {problem.num_pages}) (RTCATTN_CHECK=1)")


def _check_seqused(ck, used, problem: VarlenProblem) -> list:
    """RTCATTN_CHECK=1 with seqused_k: each length in [0, max_seqlen_k] and, not paged, each sequence's first key
    row cu_seqlens_k[b] and its keys inside k's rows (cu_seqlens_k's last entry is not read). Returns the lengths."""
    for b in range(problem.batch):
        if not 0 <= used[b] <= problem.max_seqlen_k:
            raise ValueError(f"seqused_k[{b}]={used[b]} is not supported; accepted: 0..max_seqlen_k="
                             f"{problem.max_seqlen_k} (RTCATTN_CHECK=1)")
        if not problem.paged and not (0 <= ck[b] and ck[b] + used[b] <= problem.total_k):
            raise ValueError(f"sequence {b}: cu_seqlens_k[{b}]={ck[b]} with seqused_k[{b}]={used[b]} reaches past "
                             f"k's rows; accepted: 0 <= cu_seqlens_k[{b}] and cu_seqlens_k[{b}] + seqused_k[{b}] <= "
                             f"total_k={problem.total_k} (RTCATTN_CHECK=1)")
    return list(used)


@dataclass(frozen=True)
class KvcacheProblem:
    """A flash_attn_with_kvcache call's sizes (q [B, Sq, Hq, D]; the cache contiguous or paged)."""
    batch: int
    seq_q: int
    heads: int
    heads_k: int
    head_dim: int
    new: int            # rows of k / v appended per sequence (0: no append)
    capacity: int       # the keys one sequence can hold: S_max, or block_table.shape[1] * page_size
    rows_per_batch: int  # contiguous: k_cache rows from one cache batch to the next (stride(0) / stride(1))
    cache_batch: int    # contiguous: B_cache; paged: num_blocks
    page_size: int      # paged: rows per block; 0 = contiguous
    rotary_dim: int     # 0: no rotary embedding
    scale: float
    kv_dtype: str = "same"  # the manifest's kv_dtype axis: the cache's format
    score: ScoreMod = NO_SCORE_MOD  # the soft cap and ALiBi slopes (the manifest's score_mod axis)

    @property
    def paged(self) -> bool:
        return self.page_size > 0


_CACHE_TEXT = "[B_cache, S_max, Hk, D], or [num_blocks, page_size, Hk, D] with block_table"
_FP4_CACHE_TEXT = "uint8 [num_blocks, Hk, page_size, D / 2] with block_table (FP4)"


def _check_meta(name: str, t, batch: int, device) -> None:
    if t is not None:
        checks.check_index_tensor(name, t, 1, f"1 dim, [batch={batch}]", device)
        if t.shape[0] != batch:
            raise ValueError(f"{name}.shape={tuple(t.shape)} is not supported; accepted: [batch={batch}] (q.shape[0])")


def _rows_per_batch(name: str, t: torch.Tensor) -> int:
    """Contiguous cache: rows from one cache batch to the next, which the packed view of the cache needs to be a whole
    number of rows, at least S_max (no two batches share a row)."""
    bc, s_max = t.shape[0], t.shape[1]
    if bc == 1:
        return s_max
    st0, st1 = t.stride(0), t.stride(1)
    if st1 <= 0 or st0 % st1 != 0 or st0 // st1 < s_max:
        raise ValueError(f"{name}.stride()={tuple(t.stride())} is not supported; accepted: a batch stride that is a "
                         f"whole number of rows, at least S_max={s_max} (stride(0) = n * stride(1), n >= S_max; e.g. "
                         "a contiguous cache or a slice of one along S)")
    return st0 // st1


def _check_new_kv(k, v, q, batch: int, hk: int, d: int, capacity: int, cache_seqlens) -> int:
    """The appended rows per sequence (0 without k / v)."""
    if (k is None) != (v is None):
        raise ValueError(f"k is {'None' if k is None else 'given'} and v is {'None' if v is None else 'given'}; "
                         "accepted: both (appended to the cache) or neither")
    if k is None:
        return 0
    for name, t in (("k", k), ("v", v)):
        checks.check_tensor(name, t, DTYPES, 4, "[B, S_new, Hk, D]")
    checks.check_same_dtype((("q", q), ("k", k), ("v", v)), DTYPES)
    checks.check_same("devices", ("q.device", "k.device", "v.device"), (q.device, k.device, v.device))
    checks.check_same("k and v shapes", ("k", "v"), (tuple(k.shape), tuple(v.shape)))
    b, new, h, dk = k.shape
    if (b, h, dk) != (batch, hk, d):
        raise ValueError(f"k.shape={tuple(k.shape)} is not supported; accepted: [B={batch}, S_new, Hk={hk}, D={d}]")
    if new > capacity:
        raise ValueError(f"k.shape[1]={new} new rows per sequence is not supported; accepted: at most the cache's "
                         f"{capacity} keys per sequence")
    if cache_seqlens is None:
        raise ValueError("cache_seqlens=None with k / v given is not supported; accepted: cache_seqlens (an int or "
                         "int32 [B]) saying where each sequence's new rows go")
    return new


def _check_rotary(cos, sin, q, k, d: int, capacity: int) -> int:
    """rotary_dim (0 without rotary_cos / rotary_sin)."""
    if (cos is None) != (sin is None):
        raise ValueError("rotary_cos and rotary_sin: one is None; accepted: both [seqlen_ro, rotary_dim / 2] or "
                         "neither")
    if cos is None:
        return 0
    if k is None:
        raise ValueError("rotary_cos / rotary_sin given without k / v is not supported; accepted: rotary embedding "
                         "with new rows appended (k and v given), as flash-attn")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        checks.check_type(name, t)
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; accepted: q's dtype {q.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name}.ndim={t.dim()} (shape {tuple(t.shape)}) is not supported; accepted: 2 dims, "
                             "[seqlen_ro, rotary_dim / 2]")
        if t.device != q.device:
            raise ValueError(f"{name}.device={t.device} is not supported; accepted: q's device {q.device}")
    checks.check_same("rotary_cos and rotary_sin shapes", ("rotary_cos", "rotary_sin"), (tuple(cos.shape),
                                                                                        tuple(sin.shape)))
    seqlen_ro, rotary_dim = cos.shape[0], 2 * cos.shape[1]
    if rotary_dim == 0 or rotary_dim % 16 != 0 or rotary_dim > d:
        raise ValueError(f"rotary_dim={rotary_dim} (rotary_cos.shape={tuple(cos.shape)}) is not supported; accepted: "
                         f"a multiple of 16 in 16..D={d} (rotary_cos.shape[1] = rotary_dim / 2)")
    if seqlen_ro < capacity:
        raise ValueError(f"rotary_cos.shape[0]={seqlen_ro} is not supported; accepted: at least the cache's {capacity} "
                         "keys per sequence (a position for every row)")
    return rotary_dim


def check_kvcache_inputs(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                         cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                         out: torch.Tensor | None = None, quant: KvQuant = NO_QUANT,
                         score: ScoreMod = NO_SCORE_MOD) -> KvcacheProblem:
    """flash_attn_with_kvcache: every check that needs no device memory (cache_seqlens as int32 [B] or None). quant:
    an FP8 cache's descales, or an FP4 cache (paged, HND) and its scales."""
    kv_dtype = kv_dtype_of(k_cache, v_cache, quant.kv_cache_dtype, ("k_cache", "v_cache"))
    fp4 = is_fp4(kv_dtype)
    if fp4 and block_table is None:
        raise ValueError(f"kv_cache_dtype='fp4_e2m1' without block_table is not supported; accepted: {_FP4_CACHE_TEXT}")
    checks.check_tensor("q", q, DTYPES, 4, "[B, Sq, Hq, D]")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        checks.check_tensor(name, t, DTYPES if kv_dtype == "same" else (k_cache.dtype,), 4,
                            _FP4_CACHE_TEXT if fp4 else _CACHE_TEXT)
    if kv_dtype == "same":
        checks.check_same_dtype((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)), DTYPES)
    device = q.device
    checks.check_same("devices", ("q.device", "k_cache.device", "v_cache.device"),
                      (q.device, k_cache.device, v_cache.device))
    checks.check_same("k_cache and v_cache shapes", ("k_cache", "v_cache"), (tuple(k_cache.shape),
                                                                             tuple(v_cache.shape)))
    batch, seq_q, hq, d = q.shape
    if fp4:
        cache_batch, hk, rows, dk = k_cache.shape
        dk *= 2
    else:
        cache_batch, rows, hk, dk = k_cache.shape
    if hk == 0 or hq % hk != 0:
        raise _heads_error(hq, hk)
    checks.check_same("head dim" + (" (FP4: 2 * k_cache.shape[3])" if fp4 else ""), ("q", "k_cache", "v_cache"),
                      (d, dk, dk))
    _check_head_dim(d, q)
    if cache_batch < 1 or rows < 1:
        raise ValueError(f"k_cache.shape={tuple(k_cache.shape)} is not supported; accepted: "
                         f"{_FP4_CACHE_TEXT if fp4 else _CACHE_TEXT}, each size >= 1")
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad)):
        _check_meta(name, t, batch, device)
    page_size = rows_per_batch = 0
    if block_table is not None:
        checks.check_index_tensor("block_table", block_table, 2, "2 dims, [batch, max_blocks_per_seq]", device)
        if block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ValueError(f"block_table.shape={tuple(block_table.shape)} is not supported; accepted: "
                             f"[batch={batch}, blocks >= 1] (batch = q.shape[0])")
        for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if t is not None:
                raise ValueError(f"{name} with block_table is not supported; accepted: {name}=None with a paged "
                                 "cache (the block table maps each sequence's rows), as flash-attn")
        page_size = rows
        if page_size < 16 or page_size & (page_size - 1):
            raise ValueError(f"page_size={page_size} (k_cache.shape[{2 if fp4 else 1}], paged) is not supported; "
                             "accepted: a power of two >= 16 (16, 32, 64, 128, 256, ...)")
        capacity = block_table.shape[1] * page_size
    else:
        capacity = rows
        rows_per_batch = _rows_per_batch("k_cache", k_cache)
        if cache_batch > 1 and _rows_per_batch("v_cache", v_cache) != rows_per_batch:
            raise ValueError(f"k_cache.stride()={tuple(k_cache.stride())} and v_cache.stride()="
                             f"{tuple(v_cache.stride())} put their batches {rows_per_batch} and "
                             f"{_rows_per_batch('v_cache', v_cache)} rows apart; accepted: the same rows per batch")
    new = _check_new_kv(k, v, q, batch, hk, d, capacity, cache_seqlens)
    rotary_dim = _check_rotary(rotary_cos, rotary_sin, q, k, d, capacity)
    check_kv_quant(kv_dtype, quant, batch, hk, d, device, (cache_batch, page_size, hk) if fp4 else None)
    check_score_mod(score, batch, hq, device)
    inputs = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] + [
        (n, t) for n, t in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                            ("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                            ("cache_leftpad", cache_leftpad), ("block_table", block_table)) if t is not None]
    inputs += list(quant.tensors()) + list(score.tensors())
    written = [("k_cache", k_cache), ("v_cache", v_cache)] + [(n, t) for n, t in quant.tensors()
                                                             if n in ("k_scale", "v_scale")]
    if new and checks._has_storage(k):  # the append reads k / v while it writes the cache (and an FP4 cache's scales)
        for name, t in (("k", k), ("v", v)):
            for cname, c in written:
                if checks._spans_overlap(t, c):
                    raise ValueError(f"{name} overlaps {cname} in memory; accepted: new rows that share no memory "
                                     "with the cache")
    if out is not None:
        checks.check_out(out, q, DTYPES, inputs)
        checks.check_same_dtype((("q", q), ("out", out)), DTYPES)
    return KvcacheProblem(batch, seq_q, hq, hk, d, new, capacity, rows_per_batch, cache_batch, page_size, rotary_dim,
                          checks.check_scale(softmax_scale, d), kv_dtype, score)
