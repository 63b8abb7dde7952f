"""`python -m rtcattn bench`: rtcattn vs torch SDPA (flash, cuDNN) on a GPU, timed with CUDA events."""
from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass

# The seed's shapes (B, H, S) with Sq = Sk = S, D = 128 (shared anchors).
SEED_SHAPES = [(2, 24, 8192), (2, 24, 16384), (1, 32, 16384), (4, 16, 16384), (1, 64, 16384),
               (2, 24, 32768), (2, 16, 65536), (2, 8, 86016), (1, 16, 131072)]
QUICK_SHAPES = [(2, 24, 8192), (1, 32, 16384), (2, 24, 16384)]
# The masks issue's shapes: causal seed shapes, GQA (Hq 32, Hk 8) full and causal, many short causal sequences.
MASK_SUITE = "2,24,8192:causal;2,24,16384:causal;1,32,32768:causal;2,32/8,16384;2,32/8,16384:causal;16,32/8,2048:causal"
ROTATE_BYTES = 512 << 20   # inputs smaller than this are rotated so every rep reads cold caches
LEAD_CYCLES = 5_000_000    # ~3 ms of GPU sleep queued ahead of a batch of timed calls (see _queue_rounds)


def add_arguments(p) -> None:
    p.add_argument("--shapes", help='"B,H[/Hk],S[,Sk][:causal];..." (default: the seed\'s 9 shapes); '
                                    '"masks": the causal and GQA shapes of the masks work; "serving": packed '
                                    'sequences and paged KV (bench_varlen.py)')
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--modes", default="rtne,rtna,rtz", help="round modes of rtcattn, comma-separated")
    p.add_argument("--layout", default="bshd",
                   help="tensor layout(s), comma-separated: bshd ([B,S,H,D]; SDPA gets transposed views "
                        "of the same tensors) and/or bhsd ([B,H,S,D], SDPA's own layout)")
    p.add_argument("--reps", type=int, default=10, help="timed rounds per shape (fewer for slow shapes)")
    p.add_argument("--budget-s", type=float, default=12.0,
                   help="GPU seconds of timed rounds per shape and layout at most (caps --reps)")
    p.add_argument("--quick", action="store_true", help="3 shapes, 1 mode, 3 reps")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="bar chart of TFLOP/s (needs matplotlib)")


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



def round_orders(n: int, reps: int) -> list:
    """The order of n implementations in each of reps rounds: a Williams design, so that over a full
    cycle (n rounds, 2n for odd n) every implementation comes right after every other one equally
    often. At a power cap a call runs faster after a low-power one (a slower peer) than after a hungry
    one; a plain rotation keeps each implementation behind the same neighbour in every round, which
    biased the ratios (NOTES run 28)."""
    first = [0]
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [rows[r % len(rows)] for r in range(reps)]


def _queue_rounds(fns: dict, inputs: list, reps: int) -> dict:
    """Queues reps rounds, each calling every fn once (round_orders), events around each call.

    A GPU sleep is queued first and every call takes longer on the GPU than on the host, so the GPU
    never waits for the host: each pair of events brackets the kernel(s) of one call, not Python
    dispatch, as in steady use. Interleaving the impls exposes them alike to clock and thermal drift.
    """
    import torch
    names = list(fns)
    events = {n: [] for n in names}
    torch.cuda._sleep(LEAD_CYCLES)
    for r, order in enumerate(round_orders(len(names), reps)):
        args = inputs[r % len(inputs)]
        for n in (names[i] for i in order):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[n](*args)
            e.record()
            events[n].append((s, e))
    return events


def time_rounds(fns: dict, inputs: list, reps: int, budget_s: float) -> dict:
    """Per-call ms of each fn: {name: [ms per round]}; fewer rounds when one round is slow."""
    import torch
    for fn in fns.values():  # builds, cuDNN plans, allocator warm-up
        for i in range(2):
            fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    probe = _queue_rounds(fns, inputs, 1)
    torch.cuda.synchronize()
    round_ms = sum(s.elapsed_time(e) for evs in probe.values() for s, e in evs)
    reps = max(3, min(reps, int(budget_s * 1e3 / max(round_ms, 1e-3))))
    events = _queue_rounds(fns, inputs, reps)
    torch.cuda.synchronize()
    return {n: [s.elapsed_time(e) for s, e in evs] for n, evs in events.items()}


def time_ms(fn, inputs: list, reps: int, budget_ms: float = 3000.0) -> float:
    """Median per-call CUDA-event ms of one fn (see time_rounds)."""
    return statistics.median(time_rounds({"fn": fn}, inputs, reps, budget_ms / 1e3)["fn"])


def matmul_ceiling(reps: int) -> float:
    import torch
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(torch.matmul, [(a, b)], reps)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def _inputs(c: Case, d, layout):
    import torch
    per_set = 2 * (2 * c.b * c.sq * c.h * d + 2 * c.b * c.sk * c.kv_heads * d)
    n = max(1, min(8, math.ceil(ROTATE_BYTES / per_set)))
    shape = (lambda s, h: (c.b, s, h, d)) if layout == "bshd" else (lambda s, h: (c.b, h, s, d))
    mk = lambda s, h: torch.randn(shape(s, h), device="cuda", dtype=torch.bfloat16)  # noqa: E731
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
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except ImportError:
        return None

    def run(q, k, v):
        if layout == "bhsd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        res = fa4(q, k, v, causal=c.causal)
        return res[0] if isinstance(res, tuple) else res
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


PEERS = ("sdpa-cudnn", "fa4")  # the ratio columns: each rtcattn time against each peer's in the same rounds


def _row(base: dict, key, times: list, peers: dict, f: float, kernel: str) -> dict:
    ms = statistics.median(times)
    r = dict(base, impl=key[0], mode=key[1], kernel=kernel, ms=ms, reps=len(times),
             spread=(max(times) - min(times)) / ms, tflops=f / (ms * 1e-3) / 1e12)
    for peer in PEERS:  # the median of per-round ratios: each pair ran back to back under the same clocks
        pt = peers.get(peer)
        r["vs_" + peer] = statistics.median(c / t for c, t in zip(pt, times)) if pt else None
    r["vs_cudnn"] = r.pop("vs_sdpa-cudnn")
    return r


def bench_shape(c: Case, d, modes, reps, layout="bshd", budget_s=12.0) -> list:
    from .ops import attention_fwd
    inputs = _inputs(c, d, layout)
    fns = _impls(layout, modes, inputs, c)
    # Which rtcattn kernel serves each mode: the op's own selection for these inputs, launching nothing.
    window = (-1, 0) if c.causal else (-1, -1)
    kernels = {key: attention_fwd.selection(*inputs[0][:3], layout=layout, round_mode=key[1], window=window).kernel.name
               for key in fns if key[0] == "rtcattn"}
    times = time_rounds(fns, inputs, reps, budget_s)
    base = {"B": c.b, "H": c.h, "Hk": c.kv_heads, "Sq": c.sq, "Sk": c.sk, "causal": c.causal, "D": d,
            "layout": layout, "case": c.label()}
    peers = {p: times.get((p, "-")) for p in PEERS}
    return [_row(base, key, t, peers, flops(c, d), kernels.get(key, key[0])) for key, t in times.items()]


def _fmt(x, spec) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list, ceiling: float) -> None:
    print(f"bf16 matmul 8192^3 ceiling: {ceiling:.0f} TFLOP/s")
    head = (f"{'B,H,Sq,Sk D':<30}{'layout':<7}{'impl':<12}{'mode':<6}{'kernel':<12}{'ms':>10}{'spread':>8}"
            f"{'TFLOP/s':>9}{'x cuDNN':>9}{'x FA4':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        shape = f"{r.get('case', '')} {r['D']}"
        spread = None if r.get("spread") is None else 100 * r["spread"]
        print(f"{shape:<30}{r['layout']:<7}{r['impl']:<12}{r['mode']:<6}{r['kernel']:<12}"
              f"{_fmt(r['ms'], '.3f'):>10}{_fmt(spread, '.1f'):>7}%{_fmt(r['tflops'], '.0f'):>9}"
              f"{_fmt(r['vs_cudnn'], '.3f'):>9}{_fmt(r.get('vs_fa4'), '.3f'):>8}")
    for line in geomeans(rows):
        print(line)


def geomeans(rows: list) -> list:
    """One line per (peer, layout, impl, mode): geomean of the ratio over the shapes, and the worst shape."""
    lines = []
    for key, name, peer in (("vs_cudnn", "cuDNN", "sdpa-cudnn"), ("vs_fa4", "FA4", "fa4")):
        groups: dict = {}
        for r in rows:
            if r.get(key) is not None and r["impl"] != peer:
                groups.setdefault((r["layout"], r["impl"], r["mode"]), []).append(r[key])
        lines += [f"geomean x {name} {lay} {impl} {mode}: {math.exp(sum(map(math.log, v)) / len(v)):.3f} "
                  f"(min {min(v):.3f}, {len(v)} shapes)" for (lay, impl, mode), v in sorted(groups.items())]
    return lines


def plot(rows: list, path: str, plt, title: str = "") -> None:
    """Grouped bars of TFLOP/s per shape (in the order measured), one bar per implementation and mode;
    the title names the machine and the date of the run."""
    labels = list(dict.fromkeys((r.get("case", f"{r['B']},{r['H']},{r['Sq']},{r['Sk']}"), r["layout"]) for r in rows))
    series = sorted({(r["impl"], r["mode"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(labels)), 5))
    width = 0.8 / len(series)
    for i, (impl, mode) in enumerate(series):
        ys = [next((r["tflops"] or 0 for r in rows
                    if (r.get("case", f"{r['B']},{r['H']},{r['Sq']},{r['Sk']}"), r["layout"]) == lab
                    and r["impl"] == impl and r["mode"] == mode), 0) for lab in labels]
        ax.bar([j + i * width for j in range(len(labels))], ys, width,
               label=impl if mode == "-" else f"{impl} {mode}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
    ax.set_xticklabels([f"{case} {layout}" for case, layout in labels], rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)


def _matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib, which cannot be imported ({e}); "
                          "pip install matplotlib or drop --plot") from e


def _layouts(text: str) -> list:
    from .validate import LAYOUTS, check_choice
    layouts = [x.strip() for x in text.split(",") if x.strip()]
    for x in layouts:
        check_choice("--layout", x, LAYOUTS)
    return layouts


def main(args) -> int:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("bench needs a CUDA or ROCm GPU and torch sees none "
                           f"(torch {torch.__version__}); run it on a GPU machine")
    plt = _matplotlib() if args.plot else None
    shapes = parse_shapes(args.shapes) if args.shapes and args.shapes.strip() != "serving" else [
        Case(b, h, s, s) for b, h, s in
                                                            (QUICK_SHAPES if args.quick else SEED_SHAPES)]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    from .validate import axis_values, check_choice
    for m in modes:
        check_choice("--modes", m, axis_values("round_mode"))
    modes, reps = (modes[:1], 3) if args.quick else (modes, args.reps)
    if args.shapes and args.shapes.strip() == "serving":
        from . import bench_varlen
        rows = bench_varlen.run(modes, reps, args.budget_s)
        if args.json_out:
            with open(args.json_out, "w") as fh:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
        return 0
    layouts = _layouts(args.layout)
    ceiling = matmul_ceiling(reps)
    rows = []
    for shape in shapes:
        for layout in layouts:
            print(f"shape {shape.label()}, {layout} ...", file=sys.stderr, flush=True)
            rows += bench_shape(shape, args.head_dim, modes, reps, layout, args.budget_s)
            torch.cuda.empty_cache()
    print_table(rows, ceiling)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "matmul_tflops": ceiling, "rows": rows}, fh, indent=1)
    if plt is not None:
        import datetime
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        plot(rows, args.plot, plt, f"{torch.cuda.get_device_name()}, {when}: bf16 D={args.head_dim}, "
                                   f"{', '.join(layouts)}, non-causal unless marked")
    return 0
