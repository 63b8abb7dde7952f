"""attention_fwd's decode suite, `python -m rtcattn bench --shapes decode` (or `--suite decode`): one query row per
sequence (four for speculative decoding) over a paged KV cache whose page ids are a random permutation, called as
vLLM calls a FlashAttention varlen entry for decode: `rtcattn.flash_attn_varlen_func(q, k_cache, v_cache,
cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True, block_table=...)`, RTNE. In the same rounds
(tools/timing.py): `rtcattn.flash_attn_with_kvcache` on the same cache when the package has it, FA4
(`flash_attn.cute.flash_attn_varlen_func` with `page_table` and `seqused_k`) when it imports, and a 4 GiB
device-to-device copy, the yardstick.

Decode is memory-bound: its floor is the time to read the KV cache once. So the columns are
- KV GB/s: the bytes of K and V of every key a sequence uses, all KV heads (B x context x Hk x D x 2 x 2 bytes),
  over the time;
- % of copy: that bandwidth against the copy's (bytes read + written over its time), the median of the per-round
  ratios, so both ran under the same clocks;
- x FA4: FA4's time over rtcattn's, the median of the per-round ratios; the geomean over the cases comes last.
Cases 12-17 read quantized caches (FP8 E4M3 with descale 1, FP4 E2M1 + E8M0 in the HND layout) of three of the bf16
cases' shapes: their KV bytes are the cache's (FP4: its scale bytes included), and a line under the table gives each
one's time over its bf16 case's (medians of separate rounds).
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

from ...tools import bench as driver, timing
from . import peers

KV_ELEMENT_BYTES = 2        # bf16 K and V
QUANT_LABEL = {"bf16": "", "fp8_e4m3": " fp8", "fp4_e2m1": " fp4"}  # a case's cache format, in its label
COPY_BYTES = 4 << 30        # the copy's source (and destination) size
COPY_TRAFFIC = 2 * COPY_BYTES  # bytes read + written by one copy
ROUND_MODE = "rtne"
# (name in the table, impl key): the columns, in order; rtcattn-kvcache only when the package has that entry.
SHOWN = (("rtcattn", "rtcattn"), ("kvcache", "rtcattn-kvcache"), ("FA4", "fa4"))


@dataclass(frozen=True)
class DecodeCase:
    """B sequences of `context` keys each (the cache holds them all; the sq query rows are the last of them),
    Hq query heads over Hk KV heads, pages of `page` rows, head dim d, q bf16; the cache bf16 or quantized (kv)."""
    b: int
    context: int
    hq: int
    hk: int
    page: int
    d: int = 128
    sq: int = 1
    kv: str = "bf16"

    @property
    def pages_per_seq(self) -> int:
        return -(-self.context // self.page)

    @property
    def kv_bytes(self) -> int:
        """K and V of every used key, all KV heads: what a decode step must read at least once."""
        row = {"bf16": self.d * KV_ELEMENT_BYTES, "fp8_e4m3": self.d, "fp4_e2m1": self.d // 2 + 1}[self.kv]
        return 2 * self.b * self.context * self.hk * row

    def label(self) -> str:
        extra = ((f" D{self.d}" if self.d != 128 else "") + (f" Sq{self.sq}" if self.sq != 1 else "")
                 + QUANT_LABEL[self.kv])
        return f"{self.b}x{self.context} {self.hq}/{self.hk} p{self.page}{extra}"

    def fields(self) -> dict:
        """The case's row fields; n: its number in DECODE_CASES (--decode-cases), None for another case."""
        return {"case": self.label(), "n": DECODE_CASES.index(self) + 1 if self in DECODE_CASES else None,
                "B": self.b, "context": self.context, "Sq": self.sq, "Hq": self.hq, "Hk": self.hk, "page": self.page,
                "D": self.d, "dtype": "bf16", "kv_dtype": self.kv, "layout": "paged", "kv_bytes": self.kv_bytes}

    def bf16(self) -> DecodeCase:
        """The same shape over a bf16 cache."""
        return DecodeCase(self.b, self.context, self.hq, self.hk, self.page, self.d, self.sq)


DECODE_CASES = (
    # issue 22's table: GQA 32/8 or 64/8, D 128, one query row per sequence
    DecodeCase(32, 4096, 32, 8, 16), DecodeCase(32, 4096, 32, 8, 64), DecodeCase(128, 2048, 32, 8, 16),
    DecodeCase(8, 32768, 32, 8, 64), DecodeCase(1, 131072, 32, 8, 64), DecodeCase(64, 8192, 64, 8, 16),
    DecodeCase(256, 1024, 32, 8, 16),
    # beyond the table, each with the first case's 537 MB of KV: speculative decoding (4 query rows), MQA, D 64, 256
    DecodeCase(32, 4096, 32, 8, 16, sq=4), DecodeCase(256, 4096, 32, 1, 16), DecodeCase(64, 4096, 32, 8, 16, d=64),
    DecodeCase(16, 4096, 32, 8, 16, d=256),
    # quantized caches (issue 23) of cases 1, 4 and 6: FP8, then FP4
    *(DecodeCase(b, ctx, hq, 8, page, kv=kv) for kv in ("fp8_e4m3", "fp4_e2m1")
      for b, ctx, hq, page in ((32, 4096, 32, 16), (8, 32768, 32, 64), (64, 8192, 64, 16))),
)
QUICK_CASES = (1, 5, 8)   # --quick: page 16, one 131072-key sequence, speculative


def add_arguments(p) -> None:
    p.add_argument("--decode-cases", metavar="N,N",
                   help=f"decode suite: only these cases, numbered 1..{len(DECODE_CASES)} as its --dry-run lists them")
    p.add_argument("--fa4-splits", type=int, metavar="N",
                   help="decode suite: FA4's num_splits (0: its heuristic; default: not passed, FA4's own default)")


def decode_selection(args) -> list:
    text = getattr(args, "decode_cases", None)
    if not text:
        return [DECODE_CASES[i - 1] for i in QUICK_CASES] if args.quick else list(DECODE_CASES)
    picks = [x.strip() for x in text.split(",") if x.strip()]
    for x in picks or [text]:
        if not x.isdigit() or not 1 <= int(x) <= len(DECODE_CASES):
            raise ValueError(f"--decode-cases {x!r} is not supported; accepted: integers from 1 to "
                             f"{len(DECODE_CASES)} (the cases of --dry-run), comma-separated")
    return [DECODE_CASES[int(x) - 1] for x in picks]


def fa4_splits(args) -> int | None:
    n = getattr(args, "fa4_splits", None)
    if n is not None and n < 0:
        raise ValueError(f"--fa4-splits {n} is not supported; accepted: 0 (FA4's heuristic) or a positive count")
    return n


def _decode_inputs(c: DecodeCase, dev: str = "cuda"):
    """([(q, k_cache, v_cache)], the call's metadata): random bf16 pages (quantized for a quantized case: FP8 with
    descale 1, FP4 with its scales in meta["quant"], HND), a block table that is a random permutation of the page
    ids. One set: every case reads 268 MB of KV or more, past any GPU's L2, so no rotation is needed to read it
    cold."""
    import torch
    n_pages = c.b * c.pages_per_seq
    gen = torch.Generator().manual_seed(c.b * 1_000_003 + c.context + c.page)
    table = torch.randperm(n_pages, generator=gen).to(torch.int32).view(c.b, c.pages_per_seq).to(dev)
    mk = lambda *shape: torch.randn(shape, device=dev, dtype=torch.bfloat16)  # noqa: E731
    rows = torch.arange(c.b + 1, dtype=torch.int32, device=dev)
    meta = {"cu_q": rows * c.sq, "cu_k": rows * c.context, "table": table,
            "seqlens": torch.full((c.b,), c.context, dtype=torch.int32, device=dev)}
    k, v, meta["quant"] = mk(n_pages, c.page, c.hk, c.d), mk(n_pages, c.page, c.hk, c.d), {}
    if c.kv == "fp8_e4m3":
        from .kvquant import quantize_fp8
        one = torch.ones((), device=dev)
        k, v = quantize_fp8(k, one), quantize_fp8(v, one)
    elif c.kv == "fp4_e2m1":
        from .kvquant import quantize_fp4
        (k, ks), (v, vs) = quantize_fp4(k), quantize_fp4(v)
        k, v = k.permute(0, 2, 1, 3).contiguous(), v.permute(0, 2, 1, 3).contiguous()
        meta["quant"] = {"kv_cache_dtype": "fp4_e2m1", "k_scale": ks, "v_scale": vs}
    return [(mk(c.b * c.sq, c.hq, c.d), k, v)], meta


def _decode_impls(c: DecodeCase, meta: dict, splits: int | None) -> dict:
    """impl -> fn(q, k_cache, v_cache), or impl -> why it cannot run at all here (FA4 not installed)."""
    import rtcattn

    from ...api import HOW_V3_BF16_CVT
    cvt = {mode: n for n, mode in HOW_V3_BF16_CVT.items()}[ROUND_MODE]
    m = meta
    qk = m.get("quant", {})
    fns = {"rtcattn": lambda q, k, v: rtcattn.flash_attn_varlen_func(
        q, k, v, m["cu_q"], m["cu_k"], c.sq, c.context, causal=True, block_table=m["table"], how_v3_bf16_cvt=cvt,
        **qk)}
    if hasattr(rtcattn, "flash_attn_with_kvcache"):
        fns["rtcattn-kvcache"] = lambda q, k, v: rtcattn.flash_attn_with_kvcache(
            q.view(c.b, c.sq, c.hq, c.d), k, v, cache_seqlens=m["seqlens"], block_table=m["table"], causal=True,
            how_v3_bf16_cvt=cvt, **qk)
    if c.kv != "bf16":
        fns["fa4"] = "not measured over a quantized cache"
        return fns
    fa4 = peers.fa4()[1]
    extra = {} if splits is None else {"num_splits": splits}
    fns["fa4"] = "flash_attn.cute is not installed" if fa4 is None else (lambda q, k, v: peers.first(fa4(
        q, k, v, cu_seqlens_q=m["cu_q"], max_seqlen_q=c.sq, seqused_k=m["seqlens"], page_table=m["table"],
        causal=True, **extra)))
    return fns


def _kernel(c: DecodeCase, inputs: list, meta: dict) -> str:
    """The rtcattn kernel that serves the varlen call (the op's own selection; nothing is launched)."""
    from .stub import selection_varlen
    from .validate import KvQuant
    q, k, v = inputs[0]
    qk = meta.get("quant", {})
    quant = KvQuant(qk.get("kv_cache_dtype", "auto"), None, None, qk.get("k_scale"), qk.get("v_scale"))
    return selection_varlen(q, k, v, meta["cu_q"], meta["cu_k"], c.sq, c.context, round_mode=ROUND_MODE,
                            window=(-1, 0), block_table=meta["table"], quant=quant).kernel.name


def copy_fn():
    """A 4 GiB device-to-device copy (dst.copy_(src)), timed beside each case: the bandwidth a kernel that reads
    its bytes once could reach in this run."""
    import torch
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return lambda *_: dst.copy_(src)


def decode_rows(c: DecodeCase, times: dict, missing: dict, kernel: str | None = None) -> list:
    """The rows of one case from its per-round times ({impl: [ms]}, the copy's under "copy") and the peers that
    could not run ({impl: why})."""
    base = c.fields()
    rows = [dict(base, impl=name, mode="-", kernel=name, status=f"n/a: {why}", ms=None, kv_gbps=None,
                 pct_copy=None) for name, why in missing.items()]
    copy = times.get("copy")
    for name, t in times.items():
        ms = statistics.median(t)
        r = dict(base, impl=name, mode=ROUND_MODE if name.startswith("rtcattn") else "-", kernel=name, status="ok",
                 ms=ms, reps=len(t), spread=(max(t) - min(t)) / ms)
        if name == "copy":
            r.update(gbps=COPY_TRAFFIC / (ms * 1e-3) / 1e9, kv_gbps=None, pct_copy=None)
        else:
            ratio = timing.ratio(copy, t)
            r.update(kv_gbps=c.kv_bytes / (ms * 1e-3) / 1e9,
                     pct_copy=None if ratio is None else 100.0 * c.kv_bytes / COPY_TRAFFIC * ratio)
        if name.startswith("rtcattn"):
            r["vs_fa4"] = timing.ratio(times.get("fa4"), t)
            if name == "rtcattn" and kernel:
                r["kernel"] = kernel
        rows.append(r)
    return rows


def decode_case_rows(c: DecodeCase, copy, reps: int, budget_s: float, splits: int | None = None) -> list:
    """One case: every implementation and the copy timed in the same rounds, or n/a with the reason."""
    inputs, meta = _decode_inputs(c)
    fns, missing = {}, {}
    for name, fn in {**_decode_impls(c, meta, splits), "copy": copy}.items():
        why = fn if isinstance(fn, str) else peers.try_call(fn, inputs)
        if why:
            missing[name] = why
        else:
            fns[name] = fn
    times = timing.time_rounds(fns, inputs, reps, budget_s) if fns else {}
    return decode_rows(c, times, missing, _kernel(c, inputs, meta) if "rtcattn" in fns else None)


def print_decode(rows: list) -> None:
    """One line per case: ms, KV GB/s and % of copy of each implementation (n/a where one does not run),
    rtcattn / FA4; the reasons for n/a under the table; the geomeans last."""
    fmt = timing.fmt
    shown = [(name, impl) for name, impl in SHOWN if any(r["impl"] == impl for r in rows)]
    ours = [(name, impl) for name, impl in shown if impl.startswith("rtcattn")]
    head = (f"{'#':>3} {'case':<26}{'KV MB':>7}{'copy GB/s':>10}  {'kernel':<9}"
            + "".join(f"{name + ' ms':>13}{'GB/s':>7}{'%copy':>7}" for name, _ in shown)
            + "".join(f"{(name + ' / FA4') if len(ours) > 1 else 'x FA4':>16}" for name, _ in ours))
    print(head)
    print("-" * len(head))
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by = {r["impl"]: r for r in rows if r["case"] == case}
        first = next(iter(by.values()))
        cells = []
        for name, impl in shown:
            r = by.get(impl, {})
            if r.get("status", "ok") != "ok":
                notes.append(f"  {case}, {name}: {r['status']}")
                cells.append(f"{'n/a':>13}{'':>7}{'':>7}")
            else:
                cells.append(f"{fmt(r.get('ms'), '.3f'):>13}{fmt(r.get('kv_gbps'), '.0f'):>7}"
                             f"{fmt(r.get('pct_copy'), '.1f'):>7}")
        copy = by.get("copy", {})
        if copy.get("status", "ok") != "ok":
            notes.append(f"  {case}, copy: {copy['status']}")
        print(f"{fmt(first['n'], 'd'):>3} {case:<26}{first['kv_bytes'] / 1e6:>7.0f}{fmt(copy.get('gbps'), '.0f'):>10}  "
              f"{by.get('rtcattn', {}).get('kernel', '-'):<9}" + "".join(cells)
              + "".join(f"{fmt(by.get(impl, {}).get('vs_fa4'), '.3f'):>16}" for _, impl in ours))
    if notes:
        print("n/a:\n" + "\n".join(notes))
    for line in quant_lines(rows):
        print(line)
    for line in timing.geomeans(rows, (("vs_fa4", "FA4", "fa4"),)):
        print(line)


def quant_lines(rows: list) -> list:
    """Each quantized case's rtcattn time over its bf16 case's, where both ran (issue 23's targets: FP8 <= 0.55,
    FP4 <= 0.35 at contexts >= 4096)."""
    ms = {(r["case"], r["impl"]): r["ms"] for r in rows if r.get("status") == "ok"}
    out = []
    for c in DECODE_CASES:
        mine, base = ms.get((c.label(), "rtcattn")), ms.get((c.bf16().label(), "rtcattn"))
        if c.kv != "bf16" and mine and base:
            out.append(f"{c.label()}: {mine / base:.3f}x the bf16 cache's time ({mine:.3f} / {base:.3f} ms)")
    return out


def plot(rows: list, path: str, plt, title: str = "") -> None:
    """% of the same run's copy bandwidth per case, one bar per implementation (the copy itself is the 100 % line)."""
    timing.plot([r for r in rows if r["impl"] != "copy"], path, plt, title, value="pct_copy",
                ylabel="% of copy bandwidth (same rounds)")


def decode(args) -> dict:
    import torch
    cases, splits = decode_selection(args), fa4_splits(args)
    copy = copy_fn()
    rows = []
    for c in cases:
        print(f"decode {c.label()} ...", file=sys.stderr, flush=True)
        rows += decode_case_rows(c, copy, args.reps, args.budget_s, splits)
        torch.cuda.empty_cache()
    print_decode(rows)
    return {"copy_bytes": COPY_BYTES, "fa4_num_splits": splits, "rows": rows,
            "title": f"decode over shuffled pages, bf16, {ROUND_MODE}: % of a 4 GiB copy's bandwidth, same rounds"}


def decode_plan(args) -> dict:
    """The decode suite's cases and their KV bytes, timing nothing (`--dry-run`)."""
    cases, splits = decode_selection(args), fa4_splits(args)
    rows = [dict(c.fields(), pages=c.b * c.pages_per_seq) for c in cases]
    head = (f"{'#':>3} {'case':<26}{'B':>5}{'context':>8}{'Sq':>4}{'Hq/Hk':>7}{'page':>6}{'D':>5}{'KV MB':>7}"
            f"{'pages':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['n']:>3} {r['case']:<26}{r['B']:>5}{r['context']:>8}{r['Sq']:>4}{r['Hq']:>4}/{r['Hk']:<2}"
              f"{r['page']:>6}{r['D']:>5}{r['kv_bytes'] / 1e6:>7.0f}{r['pages']:>8}")
    fa4 = "FA4's default num_splits" if splits is None else f"FA4 num_splits={splits}"
    print(f"{len(rows)} cases; each times rtcattn.flash_attn_varlen_func ({ROUND_MODE}, causal, shuffled pages), "
          f"rtcattn.flash_attn_with_kvcache where the package has it, FA4 ({fa4}) when flash_attn.cute imports, "
          f"and a {COPY_BYTES >> 30} GiB copy in the same rounds; nothing was run")
    return {"copy_bytes": COPY_BYTES, "fa4_num_splits": splits, "rows": rows}


driver.register("decode", decode, "paged decode, one query row per sequence, against FA4 and a 4 GiB copy "
                "(--shapes decode)", add_arguments, plot, plan=decode_plan)
