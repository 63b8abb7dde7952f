"""`python -m rtcattn bench`: rtcattn vs torch SDPA (flash, cuDNN) on a GPU, timed with CUDA events."""
from __future__ import annotations

import json
import math
import statistics
import sys

# The seed's shapes (B, H, S) with Sq = Sk = S, D = 128 (shared anchors).
SEED_SHAPES = [(2, 24, 8192), (2, 24, 16384), (1, 32, 16384), (4, 16, 16384), (1, 64, 16384),
               (2, 24, 32768), (2, 16, 65536), (2, 8, 86016), (1, 16, 131072)]
QUICK_SHAPES = [(2, 24, 8192), (1, 32, 16384), (2, 24, 16384)]
ROTATE_BYTES = 512 << 20   # inputs smaller than this are rotated so every rep reads cold caches


def add_arguments(p) -> None:
    p.add_argument("--shapes", help='"B,H,S[,Sk];..." (default: the seed\'s 9 shapes)')
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--modes", default="rtne,rtna,rtz", help="round modes of rtcattn, comma-separated")
    p.add_argument("--reps", type=int, default=10, help="timed reps per measurement (fewer for slow ones)")
    p.add_argument("--quick", action="store_true", help="3 shapes, 1 mode, 3 reps")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="bar chart of TFLOP/s (needs matplotlib)")


def parse_shapes(text: str) -> list:
    shapes = []
    for part in (s for s in text.split(";") if s.strip()):
        try:
            nums = [int(x) for x in part.split(",")]
        except ValueError:
            nums = []
        if len(nums) not in (3, 4) or min(nums) < 1:
            raise ValueError(f"--shapes entry {part!r} is not supported; accepted: B,H,S or B,H,S,Sk "
                             "with positive integers, entries separated by ';'")
        shapes.append(tuple(nums) if len(nums) == 4 else (nums[0], nums[1], nums[2], nums[2]))
    return shapes


def flops(b, h, sq, sk, d) -> float:
    return 4.0 * b * h * sq * sk * d


def time_ms(fn, inputs: list, reps: int, budget_ms: float = 3000.0) -> float:
    """Median of per-call CUDA-event times; rotates input sets; fewer reps when one call is slow."""
    import torch
    for i in range(2):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    probe_s, probe_e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_s.record()
    fn(*inputs[0])
    probe_e.record()
    torch.cuda.synchronize()
    reps = max(3, min(reps, int(budget_ms / max(probe_s.elapsed_time(probe_e), 1e-3))))
    # All reps are queued before one sync: the host prepares call r+1 while the GPU runs call r,
    # so each pair of events brackets the kernel, not the caller's dispatch (as in steady use).
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for r, (s, e) in enumerate(events):
        args = inputs[r % len(inputs)]
        s.record()
        fn(*args)
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def matmul_ceiling(reps: int) -> float:
    import torch
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(torch.matmul, [(a, b)], reps)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def _inputs(b, h, sq, sk, d):
    import torch
    per_set = 2 * (2 * b * sq * h * d + 2 * b * sk * h * d)
    n = max(1, min(8, math.ceil(ROTATE_BYTES / per_set)))
    mk = lambda s: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return [(mk(sq), mk(sk), mk(sk)) for _ in range(n)]


def _sdpa_fn(backend):
    import torch
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def run(q, k, v):
        with sdpa_kernel(backend):
            return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return run


def _try_time(fn, inputs, reps):
    try:
        return time_ms(fn, inputs, reps)
    except RuntimeError as e:  # a backend that does not take this shape on this GPU
        print(f"  (skipped: {str(e).splitlines()[0][:120]})", file=sys.stderr)
        return None


def bench_shape(shape, d, modes, reps) -> list:
    import rtcattn
    from torch.nn.attention import SDPBackend
    from . import dispatch
    b, h, sq, sk = shape
    inputs = _inputs(b, h, sq, sk, d)
    f = flops(b, h, sq, sk, d)
    base = {"B": b, "H": h, "Sq": sq, "Sk": sk, "D": d}
    rows = []
    cudnn = _try_time(_sdpa_fn(SDPBackend.CUDNN_ATTENTION), inputs, reps)
    for name, backend, ms in (("sdpa-cudnn", None, cudnn),
                              ("sdpa-flash", SDPBackend.FLASH_ATTENTION, None)):
        ms = ms if backend is None else _try_time(_sdpa_fn(backend), inputs, reps)
        rows.append(dict(base, impl=name, mode="-", kernel=name, ms=ms))
    for mode in modes:
        fn = lambda q, k, v, m=mode: rtcattn.forward(q, k, v, layout="bshd", round_mode=m)  # noqa: E731
        ms = time_ms(fn, inputs, reps)
        rows.append(dict(base, impl="rtcattn", mode=mode, kernel=dispatch.last_selection.kernel.name, ms=ms))
    for r in rows:
        r["tflops"] = f / (r["ms"] * 1e-3) / 1e12 if r["ms"] else None
        r["vs_cudnn"] = cudnn / r["ms"] if (cudnn and r["ms"]) else None
    return rows


def _fmt(x, spec) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list, ceiling: float) -> None:
    print(f"bf16 matmul 8192^3 ceiling: {ceiling:.0f} TFLOP/s")
    head = f"{'B,H,Sq,Sk,D':<24}{'impl':<12}{'mode':<6}{'kernel':<12}{'ms':>10}{'TFLOP/s':>9}{'x cuDNN':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        shape = f"{r['B']},{r['H']},{r['Sq']},{r['Sk']},{r['D']}"
        print(f"{shape:<24}{r['impl']:<12}{r['mode']:<6}{r['kernel']:<12}{_fmt(r['ms'], '.3f'):>10}"
              f"{_fmt(r['tflops'], '.0f'):>9}{_fmt(r['vs_cudnn'], '.2f'):>9}")


def plot(rows: list, path: str, plt) -> None:
    labels = sorted({(r["B"], r["H"], r["Sq"], r["Sk"]) for r in rows})
    series = sorted({(r["impl"], r["mode"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(labels)), 5))
    width = 0.8 / len(series)
    for i, (impl, mode) in enumerate(series):
        ys = [next((r["tflops"] or 0 for r in rows if (r["B"], r["H"], r["Sq"], r["Sk"]) == lab
                    and r["impl"] == impl and r["mode"] == mode), 0) for lab in labels]
        ax.bar([j + i * width for j in range(len(labels))], ys, width,
               label=impl if mode == "-" else f"{impl} {mode}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
    ax.set_xticklabels([",".join(map(str, lab)) for lab in labels], rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.legend()
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


def main(args) -> int:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("bench needs a CUDA or ROCm GPU and torch sees none "
                           f"(torch {torch.__version__}); run it on a GPU machine")
    plt = _matplotlib() if args.plot else None
    shapes = parse_shapes(args.shapes) if args.shapes else [(b, h, s, s) for b, h, s in
                                                            (QUICK_SHAPES if args.quick else SEED_SHAPES)]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    from .validate import ROUND_MODES, check_choice
    for m in modes:
        check_choice("--modes", m, ROUND_MODES)
    modes, reps = (modes[:1], 3) if args.quick else (modes, args.reps)
    ceiling = matmul_ceiling(reps)
    rows = []
    for shape in shapes:
        print(f"shape B,H,Sq,Sk = {shape} ...", file=sys.stderr, flush=True)
        rows += bench_shape(shape, args.head_dim, modes, reps)
        torch.cuda.empty_cache()
    print_table(rows, ceiling)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "matmul_tflops": ceiling, "rows": rows}, fh, indent=1)
    if plt is not None:
        plot(rows, args.plot, plt)
    return 0
