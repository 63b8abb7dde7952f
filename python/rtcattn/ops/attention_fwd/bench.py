"""attention_fwd's benchmark suites for `python -m rtcattn bench`, against torch SDPA (cuDNN, flash) and
FlashAttention-4 when it is installed, timed by tools/timing.py (interleaved rounds, CUDA events, medians).

- dense (the default): the seed's shapes, or `--shapes "B,H[/Hk],S[,Sk][:causal];..."`, or `--shapes masks`
  (the causal and GQA shapes of the masks work), in each `--layout`;
- headdim (also `--shapes headdim`): every head-dim class of issue 21 (D 32 .. 256, H = 4096 // D so that H D
  is about 4096, B 2, S 4096, BSHD, RTNE), causal and not, bf16 and fp16, against cuDNN and FA4 (and FA2 shown
  beside them); a peer that does not take a case is listed as n/a with its reason;
- serving (also `--shapes serving`): packed sequences and paged KV, D 128, Hq 32, Hk 8:
  - varlen: 12 sequences of a serving mix (VARLEN_MIX, 32 225 tokens), causal and not. FA4 runs its own
    varlen call; cuDNN runs one SDPA call per sequence (what a dense-only library leaves a server with).
  - chunked prefill: 8 sequences, 512 new queries over 4096 keys, causal. rtcattn and FA4 dense
    ([8, 512] over [8, 4096]), rtcattn packed, and rtcattn paged with pages of 16, 64, 128, 256 rows
    (shuffled page ids), FA4 paged where its version takes a page table; under each page size's bf16 row,
    rtcattn over the same pages quantized (FP8 E4M3 with descales, FP4 E2M1 + E8M0 in AITER's layout; FA4 not
    run on them), timed in the same rounds, with "x bf16" = the bf16 paged ms / the quantized ms.
  FLOPs are 4 D H per (query, key) pair a row sees (causal: bottom-right), so Sq = Sk causal is half of
  the full count, as FlashAttention reports it;
- decode (also `--shapes decode`): one query row per sequence over shuffled pages, against FA4 and a 4 GiB copy
  in the same rounds (bench_decode.py);
- scoremod (also `--shapes scoremod`): the soft cap and ALiBi on against off, forward and backward
  (bench_score_mod.py).
"""
from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass

from ...tools import bench as driver, timing
from . import bench_decode, bench_score_mod, peers
from .validate import LAYOUTS, axis_values

# The seed's shapes (B, H, S) with Sq = Sk = S, D = 128 (shared anchors).
SEED_SHAPES = [(2, 24, 8192), (2, 24, 16384), (1, 32, 16384), (4, 16, 16384), (1, 64, 16384),
               (2, 24, 32768), (2, 16, 65536), (2, 8, 86016), (1, 16, 131072)]
QUICK_SHAPES = [(2, 24, 8192), (1, 32, 16384), (2, 24, 16384)]
# The masks issue's shapes: causal seed shapes, GQA (Hq 32, Hk 8) full and causal, many short causal sequences.
MASK_SUITE = "2,24,8192:causal;2,24,16384:causal;1,32,32768:causal;2,32/8,16384;2,32/8,16384:causal;16,32/8,2048:causal"
# A serving-like packed batch: 12 sequences (self-attention), Hq 32, Hk 8, D 128.
VARLEN_MIX = (8192, 4096, 4096, 2048, 1024, 1024, 512, 300, 7000, 1500, 333, 2100)
HQ, HK, D = 32, 8, 128
PREFILL = (8, 512, 4096)  # sequences, new queries, keys
PAGES = (16, 64, 128, 256)
# The ratio columns: each rtcattn time against each peer's in the same rounds (row key, name, impl).
PEERS = (("vs_cudnn", "cuDNN", "sdpa-cudnn"), ("vs_fa4", "FA4", "fa4"))


def add_arguments(p) -> None:
    p.add_argument("--shapes", help='"B,H[/Hk],S[,Sk][:causal];..." (default: the seed\'s 9 shapes); '
                                    '"masks": the causal and GQA shapes of the masks work; "serving": the '
                                    'serving suite (packed sequences and paged KV); "headdim": the head-dim suite; '
                                    '"decode": the decode suite (paged KV, one query row per sequence)')
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--modes", default="rtne,rtna,rtz", help="round modes of rtcattn, comma-separated")
    p.add_argument("--layout", default="bshd",
                   help="tensor layout(s), comma-separated: bshd ([B,S,H,D]; SDPA gets transposed views "
                        "of the same tensors) and/or bhsd ([B,H,S,D], SDPA's own layout)")


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: B, Hq (and Hk for GQA), Sq, Sk, causal."""
    b: int
    h: int
    sq: int
    sk: int
    hk: int = 0        # 0: = h
    causal: bool = False

    @property
    def kv_heads(self) -> int:
        return self.hk or self.h

    def label(self) -> str:
        heads = f"{self.h}/{self.kv_heads}" if self.kv_heads != self.h else str(self.h)
        return f"{self.b},{heads},{self.sq},{self.sk}" + (" causal" if self.causal else "")


def parse_shapes(text: str) -> list:
    if text.strip() == "masks":
        text = MASK_SUITE
    cases = []
    for part in (s.strip() for s in text.split(";") if s.strip()):
        body, _, flag = part.partition(":")
        fields = body.split(",")
        try:
            h, _, hk = fields[1].partition("/") if len(fields) > 1 else ("", "", "")
            nums = [int(fields[0]), int(h), int(fields[2])] + [int(x) for x in fields[3:]]
            hk_n = int(hk) if hk else 0
        except (ValueError, IndexError):
            nums, hk_n = [], 0
        if (len(nums) not in (3, 4) or min(nums) < 1 or flag not in ("", "causal")
                or (hk_n and (hk_n < 1 or nums[1] % hk_n))):
            raise ValueError(f"--shapes entry {part!r} is not supported; accepted: B,H[/Hk],S[,Sk][:causal] with "
                             "positive integers (H a multiple of Hk), entries separated by ';'")
        cases.append(Case(nums[0], nums[1], nums[2], nums[3] if len(nums) == 4 else nums[2], hk_n, flag == "causal"))
    return cases


def flops(c: Case, d: int) -> float:
    """Useful FLOPs: 4 B H Sq Sk D, halved for a causal mask (Sq = Sk), as FlashAttention reports them."""
    return 4.0 * c.b * c.h * c.sq * c.sk * d / (2.0 if c.causal else 1.0)


def _inputs(c: Case, d, layout, dtype=None):
    import torch
    per_set = 2 * (2 * c.b * c.sq * c.h * d + 2 * c.b * c.sk * c.kv_heads * d)
    n = max(1, min(8, math.ceil(timing.ROTATE_BYTES / per_set)))
    shape = (lambda s, h: (c.b, s, h, d)) if layout == "bshd" else (lambda s, h: (c.b, h, s, d))
    mk = lambda s, h: torch.randn(shape(s, h), device="cuda", dtype=dtype or torch.bfloat16)  # noqa: E731
    return [(mk(c.sq, c.h), mk(c.sk, c.kv_heads), mk(c.sk, c.kv_heads)) for _ in range(n)]


def _sdpa_fn(backend, layout, c: Case):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    gqa = {"enable_gqa": True} if c.kv_heads != c.h else {}

    def run(q, k, v):
        if layout == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=c.causal, **gqa)
    return run


def _fa4_fn(layout, c: Case):
    """FlashAttention-4 (flash_attn.cute) when installed; it takes [B, S, H, D] and GQA natively."""
    fa4 = peers.fa4()[0]
    if fa4 is None:
        return None

    def run(q, k, v):
        if layout == "bhsd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return peers.first(fa4(q, k, v, causal=c.causal))
    return run


def _runs(fn, inputs) -> bool:
    try:
        fn(*inputs[0])
        return True
    except RuntimeError as e:  # a backend that does not take this shape on this GPU
        print(f"  (skipped: {str(e).splitlines()[0][:120]})", file=sys.stderr)
        return False


def _impls(layout: str, modes: list, inputs: list, c: Case) -> dict:
    """(impl, mode) -> fn for every implementation that runs this shape."""
    from torch.nn.attention import SDPBackend

    import rtcattn
    fns = {}
    peers = [("sdpa-cudnn", _sdpa_fn(SDPBackend.CUDNN_ATTENTION, layout, c)),
             ("sdpa-flash", _sdpa_fn(SDPBackend.FLASH_ATTENTION, layout, c)), ("fa4", _fa4_fn(layout, c))]
    for name, fn in peers:
        if fn is not None and _runs(fn, inputs):
            fns[(name, "-")] = fn
    for mode in modes:
        fns[("rtcattn", mode)] = (lambda q, k, v, m=mode:
                                  rtcattn.forward(q, k, v, layout=layout, round_mode=m, causal=c.causal))
    return fns


def _row(base: dict, key, times: list, peers: dict, f: float, kernel: str) -> dict:
    ms = statistics.median(times)
    r = dict(base, impl=key[0], mode=key[1], kernel=kernel, ms=ms, reps=len(times),
             spread=(max(times) - min(times)) / ms, tflops=f / (ms * 1e-3) / 1e12)
    for name, _, impl in PEERS:
        r[name] = timing.ratio(peers.get(impl), times)
    return r


def bench_shape(c: Case, d, modes, reps, layout="bshd", budget_s=12.0) -> list:
    from .stub import selection
    inputs = _inputs(c, d, layout)
    fns = _impls(layout, modes, inputs, c)
    # Which rtcattn kernel serves each mode: the op's own selection for these inputs, launching nothing.
    window = (-1, 0) if c.causal else (-1, -1)
    kernels = {key: selection(*inputs[0][:3], layout=layout, round_mode=key[1], window=window).kernel.name
               for key in fns if key[0] == "rtcattn"}
    times = timing.time_rounds(fns, inputs, reps, budget_s)
    base = {"B": c.b, "H": c.h, "Hk": c.kv_heads, "Sq": c.sq, "Sk": c.sk, "causal": c.causal, "D": d,
            "layout": layout, "case": c.label()}
    peers = {impl: times.get((impl, "-")) for _, _, impl in PEERS}
    return [_row(base, key, t, peers, flops(c, d), kernels.get(key, key[0])) for key, t in times.items()]


def print_table(rows: list, ceiling: float) -> None:
    fmt = timing.fmt
    print(f"bf16 matmul 8192^3 ceiling: {ceiling:.0f} TFLOP/s")
    head = (f"{'B,H,Sq,Sk D':<30}{'layout':<7}{'impl':<12}{'mode':<6}{'kernel':<12}{'ms':>10}{'spread':>8}"
            f"{'TFLOP/s':>9}{'x cuDNN':>9}{'x FA4':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        shape = f"{r.get('case', '')} {r['D']}"
        spread = None if r.get("spread") is None else 100 * r["spread"]
        print(f"{shape:<30}{r['layout']:<7}{r['impl']:<12}{r['mode']:<6}{r['kernel']:<12}"
              f"{fmt(r['ms'], '.3f'):>10}{fmt(spread, '.1f'):>7}%{fmt(r['tflops'], '.0f'):>9}"
              f"{fmt(r['vs_cudnn'], '.3f'):>9}{fmt(r.get('vs_fa4'), '.3f'):>8}")
    for line in timing.geomeans(rows, PEERS):
        print(line)


def plot(rows: list, path: str, plt, title: str = "") -> None:
    """The dense suite's chart (timing.plot), rows of older JSON without "case" named by B,H,Sq,Sk."""
    named = [r if "case" in r else dict(r, case=f"{r['B']},{r['H']},{r['Sq']},{r['Sk']}") for r in rows]
    timing.plot(named, path, plt, title)


def _modes(args) -> list:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        driver.check_choice("--modes", m, axis_values("round_mode"))
    return modes[:1] if args.quick else modes


def dense(args) -> dict:
    """The dense suite; `--shapes serving`, `headdim` and `decode` run those suites instead."""
    if args.shapes and args.shapes.strip() in OTHER_SUITES:
        return OTHER_SUITES[args.shapes.strip()][0](args)
    import torch
    shapes = parse_shapes(args.shapes) if args.shapes else [
        Case(b, h, s, s) for b, h, s in (QUICK_SHAPES if args.quick else SEED_SHAPES)]
    modes = _modes(args)
    layouts = [x.strip() for x in args.layout.split(",") if x.strip()]
    for x in layouts:
        driver.check_choice("--layout", x, LAYOUTS)
    ceiling = timing.matmul_ceiling(args.reps)
    rows = []
    for shape in shapes:
        for layout in layouts:
            print(f"shape {shape.label()}, {layout} ...", file=sys.stderr, flush=True)
            rows += bench_shape(shape, args.head_dim, modes, args.reps, layout, args.budget_s)
            torch.cuda.empty_cache()
    print_table(rows, ceiling)
    return {"matmul_tflops": ceiling, "rows": rows,
            "title": f"bf16 D={args.head_dim}, {', '.join(layouts)}, non-causal unless marked"}


def dense_plan(args) -> dict:
    """The dense suite's cases and their FLOPs, timing nothing (`--dry-run`)."""
    if args.shapes and args.shapes.strip() in OTHER_SUITES:
        return OTHER_SUITES[args.shapes.strip()][1](args)
    shapes = parse_shapes(args.shapes) if args.shapes else [
        Case(b, h, s, s) for b, h, s in (QUICK_SHAPES if args.quick else SEED_SHAPES)]
    rows = [{"case": c.label(), "D": args.head_dim, "layout": layout, "mode": mode, "flops": flops(c, args.head_dim)}
            for c in shapes for layout in _csv(args.layout) for mode in _modes(args)]
    print(f"{'case':<30}{'D':>5} {'layout':<7}{'mode':<6}{'GFLOP':>10}")
    for r in rows:
        print(f"{r['case']:<30}{r['D']:>5} {r['layout']:<7}{r['mode']:<6}{r['flops'] / 1e9:>10.1f}")
    return {"rows": rows}


def _csv(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


# ---- the head-dim suite (issue 21) ------------------------------------------------------------------------------

HEAD_DIMS = (32, 40, 64, 80, 96, 128, 160, 192, 256)
HEADDIM_B, HEADDIM_S, HEADDIM_WIDTH = 2, 4096, 4096   # H = WIDTH // D heads: every case moves about as many bytes
# rtcattn's ratio is to the best of these (issue 21's targets); FA2 (SDPA's flash backend) is shown beside them.
BEST_OF = (("sdpa-cudnn", "cuDNN"), ("fa4", "FA4"))
SHOWN = BEST_OF + (("sdpa-flash", "FA2"),)


@dataclass(frozen=True)
class HeadDimCase:
    d: int
    causal: bool
    dtype: str        # a value of the op's dtype axis

    @property
    def case(self) -> Case:
        return Case(HEADDIM_B, HEADDIM_WIDTH // self.d, HEADDIM_S, HEADDIM_S, causal=self.causal)

    def label(self) -> str:
        return f"D{self.d} {self.dtype}" + (" causal" if self.causal else "")

    def fields(self) -> dict:
        c = self.case
        return {"case": self.label(), "D": self.d, "H": c.h, "B": c.b, "S": c.sq, "causal": self.causal,
                "dtype": self.dtype, "layout": "bshd", "flops": flops(c, self.d)}


def headdim_cases(dims=HEAD_DIMS, dtypes=("bf16", "fp16")) -> list:
    return [HeadDimCase(d, causal, dtype) for dtype in dtypes for d in dims for causal in (False, True)]


def _headdim_selection(args) -> list:
    dims = _csv(args.head_dims) if args.head_dims else list(HEAD_DIMS)
    for d in dims:
        if not str(d).isdigit() or not 8 <= int(d) <= 256:
            raise ValueError(f"--head-dims {d!r} is not supported; accepted: integers from 8 to 256, comma-separated")
    dims = [int(d) for d in dims]
    dtypes = _csv(args.dtypes)
    for t in dtypes:
        driver.check_choice("--dtypes", t, axis_values("dtype"))
    return headdim_cases(dims, dtypes)


def _headdim_impls(hc: HeadDimCase) -> dict:
    """impl -> fn, or impl -> why it cannot run at all here (FA4 not installed)."""
    from torch.nn.attention import SDPBackend

    import rtcattn
    c = hc.case
    fa4 = _fa4_fn("bshd", c)
    return {"rtcattn": lambda q, k, v: rtcattn.forward(q, k, v, round_mode="rtne", causal=c.causal),
            "sdpa-cudnn": _sdpa_fn(SDPBackend.CUDNN_ATTENTION, "bshd", c),
            "fa4": fa4 if fa4 is not None else "flash_attn.cute is not installed",
            "sdpa-flash": _sdpa_fn(SDPBackend.FLASH_ATTENTION, "bshd", c)}


def headdim_case_rows(hc: HeadDimCase, reps: int, budget_s: float) -> list:
    """One row per implementation: timed in the same rounds, or n/a with the reason."""
    from .stub import selection
    from .validate import DTYPE_AXIS
    dtype = {name: t for t, name in DTYPE_AXIS.items()}[hc.dtype]
    inputs = _inputs(hc.case, hc.d, "bshd", dtype)
    fns, missing = {}, {}
    for name, fn in _headdim_impls(hc).items():
        why = fn if isinstance(fn, str) else peers.try_call(fn, inputs)
        if why:
            missing[name] = why
        else:
            fns[name] = fn
    times = timing.time_rounds(fns, inputs, reps, budget_s) if fns else {}
    window = (-1, 0) if hc.causal else (-1, -1)
    rows = [dict(hc.fields(), impl=name, mode="-", kernel=name, status=f"n/a: {why}", ms=None, tflops=None)
            for name, why in missing.items()]
    best = min(((statistics.median(times[p]), p) for p, _ in BEST_OF if p in times), default=None)
    for name, t in times.items():
        ms = statistics.median(t)
        r = dict(hc.fields(), impl=name, mode="rtne" if name == "rtcattn" else "-", kernel=name, status="ok",
                 ms=ms, reps=len(t), spread=(max(t) - min(t)) / ms, tflops=hc.fields()["flops"] / (ms * 1e-3) / 1e12)
        if name == "rtcattn":
            r["kernel"] = selection(*inputs[0], layout="bshd", round_mode="rtne", window=window).kernel.name
            r.update({f"vs_{peer}": timing.ratio(times.get(peer), t) for peer, _ in SHOWN})
            r["best_peer"] = best[1] if best else None
            r["vs_best"] = timing.ratio(times[best[1]], t) if best else None
        rows.append(r)
    return rows


def print_headdim(rows: list) -> None:
    """One line per case: TF/s of each implementation, n/a where a peer does not take it, rtcattn / best peer."""
    fmt = timing.fmt
    names = [name for _, name in SHOWN]
    head = (f"{'D':>4}{'H':>5}  {'causal':<7}{'dtype':<6}{'rtcattn':>8} {'kernel':<9}"
            + "".join(f"{n:>8}" for n in names) + f"{'x best':>8}  best of {', '.join(n for _, n in BEST_OF)}")
    print(head)
    print("-" * len(head))
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by = {r["impl"]: r for r in rows if r["case"] == case}
        ours, first = by.get("rtcattn", {}), next(iter(by.values()))
        cells = []
        for impl, name in SHOWN:
            r = by.get(impl) or {}
            if r.get("status", "ok") != "ok":
                notes.append(f"  {case}, {name}: {r['status']}")
            cells.append("n/a" if r.get("status", "ok") != "ok" else fmt(r.get("tflops"), ".0f"))
        best = dict(SHOWN).get(ours.get("best_peer"), "")
        print(f"{first['D']:>4}{first['H']:>5}  {'yes' if first['causal'] else 'no':<7}{first['dtype']:<6}"
              f"{fmt(ours.get('tflops'), '.0f'):>8} {ours.get('kernel', '-'):<9}" + "".join(f"{c:>8}" for c in cells)
              + f"{fmt(ours.get('vs_best'), '.3f'):>8}  {best}")
    if notes:
        print("n/a:\n" + "\n".join(notes))
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        v = [r["vs_best"] for r in rows if r["impl"] == "rtcattn" and r["dtype"] == dtype and r.get("vs_best")]
        if v:
            print(f"geomean x best peer {dtype}: {math.exp(sum(map(math.log, v)) / len(v)):.3f} "
                  f"(min {min(v):.3f}, {len(v)} cases)")


def headdim(args) -> dict:
    """The head-dim suite: every case of _headdim_selection, TF/s and rtcattn / best peer."""
    import torch
    cases = _headdim_selection(args)
    ceiling = timing.matmul_ceiling(args.reps)
    rows = []
    for hc in cases:
        print(f"{hc.label()} (H {hc.case.h}) ...", file=sys.stderr, flush=True)
        rows += headdim_case_rows(hc, args.reps, args.budget_s)
        torch.cuda.empty_cache()
    print(f"bf16 matmul 8192^3 ceiling: {ceiling:.0f} TFLOP/s")
    print_headdim(rows)
    return {"matmul_tflops": ceiling, "rows": rows,
            "title": f"head dims, B {HEADDIM_B}, S {HEADDIM_S}, H = {HEADDIM_WIDTH} // D, bshd, rtne"}


def headdim_plan(args) -> dict:
    """The head-dim suite's cases and their FLOPs, timing nothing (`--dry-run`)."""
    rows = [hc.fields() for hc in _headdim_selection(args)]
    head = f"{'D':>4}{'H':>5}{'B':>3}{'S':>6}  {'causal':<7}{'dtype':<6}{'GFLOP':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['D']:>4}{r['H']:>5}{r['B']:>3}{r['S']:>6}  {'yes' if r['causal'] else 'no':<7}{r['dtype']:<6}"
              f"{r['flops'] / 1e9:>7.1f}")
    print(f"{len(rows)} cases; each times rtcattn (rtne) and {', '.join(n for _, n in SHOWN)} in the same rounds "
          "(FA4 when flash_attn.cute imports); nothing was run")
    return {"rows": rows}


def serving_plan(args) -> dict:
    raise ValueError("--dry-run is not supported for the serving suite; accepted: the dense, headdim and decode "
                     "suites")


def headdim_arguments(p) -> None:
    p.add_argument("--head-dims", help=f"headdim suite: only these D (default: {','.join(map(str, HEAD_DIMS))})")
    p.add_argument("--dtypes", default="bf16,fp16", help="headdim suite: only these dtypes")


def _pairs(sq: int, sk: int, causal: bool) -> int:
    if not causal:
        return sq * sk
    # row i sees keys j <= i + sk - sq
    return sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq))


def _flops(lens_q, lens_k, causal) -> float:
    return 4.0 * D * HQ * sum(_pairs(a, b, causal) for a, b in zip(lens_q, lens_k))


def _cu(lens, torch):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def _paged(k, v, lens, page, torch, seed=0):
    """k, v [total, Hk, D] -> pools [pages, page, Hk, D] with shuffled page ids, and the block table."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // page) for n in lens]
    order = torch.randperm(sum(need), generator=gen).tolist()
    pools = [torch.zeros(sum(need), page, *k.shape[1:], device="cuda", dtype=k.dtype) for _ in range(2)]
    table = torch.zeros(len(lens), max(need), dtype=torch.int32)
    start, nxt = 0, 0
    for s, n in enumerate(lens):
        for j in range(need[s]):
            pid, rows = order[nxt], min(page, n - j * page)
            nxt += 1
            table[s, j] = pid
            for pool, src in zip(pools, (k, v)):
                pool[pid, :rows] = src[start + j * page:start + j * page + rows]
        start += n
    return pools[0], pools[1], table.to("cuda")


def _time(fns: dict, inputs, reps, budget_s, f: float, label: str, base: str | None = None) -> list:
    """One row per fn that runs, timed in the same interleaved rounds. base: the impl whose per-round times give the
    other rows' "vs_bf16" (base's ms / theirs, the median of the rounds' ratios; > 1: faster than base)."""
    ok = {}
    for name, fn in fns.items():
        try:
            fn(*inputs[0])
            ok[name] = fn
        except (RuntimeError, TypeError, ValueError, AssertionError) as e:
            print(f"  {label}: {name} skipped ({type(e).__name__}: {str(e).splitlines()[0][:100]})", file=sys.stderr)
    times = timing.time_rounds(ok, inputs, reps, budget_s)
    rows = []
    for name, t in times.items():
        ms = statistics.median(t)
        rows.append({"case": label, "impl": name, "ms": ms, "tflops": f / (ms * 1e-3) / 1e12, "reps": len(t),
                     "vs_cudnn": timing.ratio(times.get("cudnn"), t), "vs_fa4": timing.ratio(times.get("fa4"), t),
                     "vs_bf16": timing.ratio(times.get(base), t) if base and name != base else None})
    return rows


def varlen_rows(causal: bool, modes, reps, budget_s) -> list:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import rtcattn
    lens = list(VARLEN_MIX)
    total, cu, mx = sum(lens), _cu(lens, torch), max(lens)
    mk = lambda h: torch.randn(total, h, D, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    inputs = [(mk(HQ), mk(HK), mk(HK)) for _ in range(2)]
    bounds = [(a, b) for a, b in zip(cu.tolist()[:-1], cu.tolist()[1:])]

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for a, b in bounds:
                sdpa(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None],
                     is_causal=causal, enable_gqa=True)
    fns = {"cudnn": cudnn}
    _, fa4_varlen = peers.fa4()
    if fa4_varlen is not None:
        fns["fa4"] = lambda q, k, v: peers.first(fa4_varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                            max_seqlen_q=mx, max_seqlen_k=mx, causal=causal))
    for m in modes:
        fns[f"rtcattn {m}"] = (lambda q, k, v, m=m: rtcattn.forward_varlen(q, k, v, cu, cu, mx, mx, round_mode=m,
                                                                           causal=causal))
    label = f"varlen 12 seqs {total} tok" + (" causal" if causal else "")
    return _time(fns, inputs, reps, budget_s, _flops(lens, lens, causal), label)


def prefill_rows(modes, reps, budget_s) -> list:
    import torch

    import rtcattn
    b, sq, sk = PREFILL
    lens_q, lens_k = [sq] * b, [sk] * b
    cq, ck = _cu(lens_q, torch), _cu(lens_k, torch)
    q = torch.randn(b * sq, HQ, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b * sk, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    f = _flops(lens_q, lens_k, True)
    fa4_dense, fa4_varlen = peers.fa4()
    dense = (q.view(b, sq, HQ, D), k.view(b, sk, HK, D), v.view(b, sk, HK, D))
    fns = {}
    if fa4_dense is not None:
        fns["fa4"] = lambda q, k, v: peers.first(fa4_dense(q, k, v, causal=True))
    for m in modes:
        fns[f"rtcattn {m}"] = lambda q, k, v, m=m: rtcattn.forward(q, k, v, round_mode=m, causal=True)
    rows = _time(fns, [dense], reps, budget_s, f, "prefill 8x512/4096 dense")
    packed = {"rtcattn rtne": lambda q, k, v: rtcattn.forward_varlen(q, k, v, cq, ck, sq, sk, causal=True)}
    if fa4_varlen is not None:
        packed["fa4"] = lambda q, k, v: peers.first(fa4_varlen(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                                               max_seqlen_q=sq, max_seqlen_k=sk, causal=True))
    rows += _time(packed, [(q, k, v)], reps, budget_s, f, "prefill 8x512/4096 packed")
    for page in PAGES:
        kp, vp, table = _paged(k, v, lens_k, page, torch, seed=page)
        label = f"prefill 8x512/4096 paged {page}"
        fns = {"rtcattn rtne": lambda q, k, v, table=table: rtcattn.forward_varlen(
            q, k, v, cq, ck, sq, sk, causal=True, block_table=table)}
        if fa4_varlen is not None:
            used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
            fns["fa4"] = lambda q, k, v, table=table, used=used: peers.first(fa4_varlen(
                q, k, v, cu_seqlens_q=cq, max_seqlen_q=sq, seqused_k=used, page_table=table, causal=True))
        # The same pages quantized (rtcattn alone: FA4 is not run over them), in the same rounds as the bf16 call,
        # so each row's "x bf16" is the bf16 paged time over its own, round by round.
        for kv, (kq, vq, kw) in _quantized_pages(kp, vp, b, torch).items():
            fns[f"rtcattn {kv}"] = lambda q, k, v, table=table, kq=kq, vq=vq, kw=kw: rtcattn.forward_varlen(
                q, kq, vq, cq, ck, sq, sk, causal=True, block_table=table, **kw)
        for r in _time(fns, [(q, kp, vp)], reps, budget_s, f, label, base="rtcattn rtne"):
            kv = r["impl"].removeprefix("rtcattn ")
            if kv in QUANT_KV:  # its own row under the bf16 one: "paged 64 fp8", rtcattn rtne
                r.update(case=f"{label} {QUANT_KV[kv]}", impl="rtcattn rtne", vs_cudnn=None, vs_fa4=None)
            else:  # x bf16 is the quantized rows' column only
                r["vs_bf16"] = None
            rows.append(r)
    return rows


# The quantized caches of the chunked-prefill rows: forward_varlen's kv format -> the row's label suffix.
QUANT_KV = {"fp8_e4m3": "fp8", "fp4_e2m1": "fp4"}


def _quantized_pages(kp, vp, b: int, torch) -> dict:
    """The bf16 pools [pages, page, Hk, D] quantized by rtcattn's own quantizer, as forward_varlen takes them:
    {kv format: (k, v, its keyword arguments)}. FP8 E4M3 with FA3's descales per (sequence, K/V head) (ones: the
    values are randn's), FP4 E2M1 in AITER's HND pages [pages, Hk, page, D / 2] with E8M0 scales [pages, page, Hk]
    (bench_decode's caches)."""
    from .kvquant import quantize_fp4, quantize_fp8
    one = torch.ones((), device="cuda")
    descale = torch.ones((b, kp.shape[2]), dtype=torch.float32, device="cuda")
    (k4, ks), (v4, vs) = quantize_fp4(kp), quantize_fp4(vp)
    hnd = lambda t: t.permute(0, 2, 1, 3).contiguous()  # noqa: E731
    return {"fp8_e4m3": (quantize_fp8(kp, one), quantize_fp8(vp, one), {"k_descale": descale, "v_descale": descale}),
            "fp4_e2m1": (hnd(k4), hnd(v4), {"kv_cache_dtype": "fp4_e2m1", "k_scale": ks, "v_scale": vs})}


def print_rows(rows: list) -> None:
    fmt = timing.fmt
    head = f"{'problem':<36}{'impl':<14}{'ms':>9}{'TFLOP/s':>9}{'x cuDNN':>9}{'x FA4':>8}{'x bf16':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:<36}{r['impl']:<14}{r['ms']:>9.3f}{r['tflops']:>9.0f}"
              f"{fmt(r['vs_cudnn'], '.3f'):>9}{fmt(r['vs_fa4'], '.3f'):>8}{fmt(r.get('vs_bf16'), '.3f'):>8}")
    if any(r.get("vs_bf16") is not None for r in rows):
        print("x bf16: the bf16 paged call's ms / this row's, the same pages quantized, timed in the same rounds")


def serving(args) -> dict:
    """The serving suite: packed sequences and chunked prefill over packed and paged KV."""
    modes = _modes(args)
    rows = []
    for causal in (False, True):
        print(f"varlen causal={causal} ...", file=sys.stderr, flush=True)
        rows += varlen_rows(causal, modes, args.reps, args.budget_s)
    print("chunked prefill ...", file=sys.stderr, flush=True)
    rows += prefill_rows(modes, args.reps, args.budget_s)
    print_rows(rows)
    return {"rows": rows}


# `--shapes NAME` runs another suite: its run and its plan.
OTHER_SUITES = {"serving": (serving, serving_plan), "headdim": (headdim, headdim_plan),
                "decode": (bench_decode.decode, bench_decode.decode_plan),
                "scoremod": (bench_score_mod.score_mod, bench_score_mod.score_mod_plan)}
driver.register("dense", dense, "seed shapes, --shapes, --shapes masks (default)", add_arguments, plot,
                default=True, plan=dense_plan)
driver.register("headdim", headdim, "D 32..256, causal or not, bf16 and fp16 against cuDNN and FA4 (--shapes headdim)",
                headdim_arguments, timing.plot, plan=headdim_plan)
driver.register("serving", serving, "packed sequences and paged KV against FA4 and cuDNN")
