"""The timing harness of the benchmarks: interleaved rounds timed with CUDA events, ratios to peers measured
in the same rounds, geomeans, tables and plots. Knows no op."""
from __future__ import annotations

import math
import statistics
import sys
import time

ROTATE_BYTES = 512 << 20   # inputs smaller than this are rotated so every rep reads cold caches
LEAD_MS = 3.0              # the least GPU sleep queued ahead of a batch of timed calls (see _queue_rounds)
SLEEP_CYCLES_PER_MS = 2.0e6  # torch.cuda._sleep counts SM cycles: at most ~2 GHz, so a sleep is at least as long


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


def _queue_rounds(fns: dict, inputs: list, reps: int, lead_ms: float) -> tuple:
    """Queues reps rounds, each calling every fn once (round_orders), events around each call; (events, starved).

    A GPU sleep of lead_ms is queued first, long enough that the host queues every call before the GPU reaches
    the first: each pair of events then brackets the kernel(s) of one call, not Python dispatch, as in steady use.
    starved: the GPU had reached the first call before the last was queued, so it may have waited for the host
    and the times may be the host's. Interleaving the impls exposes them alike to clock and thermal drift.
    """
    import torch
    names = list(fns)
    events = {n: [] for n in names}
    torch.cuda._sleep(int(lead_ms * SLEEP_CYCLES_PER_MS))
    first = None
    for r, order in enumerate(round_orders(len(names), reps)):
        args = inputs[r % len(inputs)]
        for n in (names[i] for i in order):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            first = first or s
            fns[n](*args)
            e.record()
            events[n].append((s, e))
    return events, first is not None and first.query()


def time_rounds(fns: dict, inputs: list, reps: int, budget_s: float) -> dict:
    """Per-call ms of each fn: {name: [ms per round]}; fewer rounds when one round is slow."""
    import torch
    for fn in fns.values():  # builds, cuDNN plans, allocator warm-up
        for i in range(2):
            fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    probe, _ = _queue_rounds(fns, inputs, 1, LEAD_MS)
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    round_ms = sum(s.elapsed_time(e) for evs in probe.values() for s, e in evs)
    reps = max(3, min(reps, int(budget_s * 1e3 / max(round_ms, 1e-3))))
    # The lead covers the host's queueing of every round (a slow host outruns a fixed 3 ms on short calls); where
    # the GPU still caught up, once more with twice the lead, then a warning: those times may be the host's.
    lead = max(LEAD_MS, 1.5 * reps * host_ms)
    for _ in range(3):
        events, starved = _queue_rounds(fns, inputs, reps, lead)
        torch.cuda.synchronize()
        if not starved:
            break
        lead *= 2
    else:
        print(f"warning: the GPU waited for the host in every timed batch ({', '.join(fns)}: {host_ms:.3f} ms of "
              f"host time a round); these times may be the host's, not the GPU's", file=sys.stderr)
    return {n: [s.elapsed_time(e) for s, e in evs] for n, evs in events.items()}


def time_ms(fn, inputs: list, reps: int, budget_ms: float = 3000.0) -> float:
    """Median per-call CUDA-event ms of one fn (see time_rounds)."""
    return statistics.median(time_rounds({"fn": fn}, inputs, reps, budget_ms / 1e3)["fn"])


def matmul_ceiling(reps: int) -> float:
    """bf16 TFLOP/s of an 8192^3 matmul: the device's practical ceiling in this run."""
    import torch
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(torch.matmul, [(a, b)], reps)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def ratio(peer_times, times) -> float | None:
    """The median of per-round ratios peer / ours: each pair ran back to back under the same clocks."""
    return statistics.median(p / t for p, t in zip(peer_times, times)) if peer_times else None


def fmt(x, spec) -> str:
    return "-" if x is None else format(x, spec)


def geomeans(rows: list, peers) -> list:
    """One line per (peer, layout, impl, mode): geomean of the ratio over the shapes, and the worst shape.
    peers: (row key of the ratio, the peer's name in the table, the peer's impl name)."""
    lines = []
    for key, name, peer in peers:
        groups: dict = {}
        for r in rows:
            if r.get(key) is not None and r["impl"] != peer:
                groups.setdefault((r.get("layout", "-"), r["impl"], r["mode"]), []).append(r[key])
        lines += [f"geomean x {name} {lay} {impl} {mode}: {math.exp(sum(map(math.log, v)) / len(v)):.3f} "
                  f"(min {min(v):.3f}, {len(v)} shapes)" for (lay, impl, mode), v in sorted(groups.items())]
    return lines


def matplotlib_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib, which cannot be imported ({e}); "
                          "pip install matplotlib or drop --plot") from e


def plot(rows: list, path: str, plt, title: str = "", value: str = "tflops", ylabel: str = "TFLOP/s") -> None:
    """Grouped bars of a row's `value` (TFLOP/s unless told) per case (in the order measured), one bar per
    implementation and mode (0 where a row has none: an n/a peer); the title names the machine and the date
    of the run."""
    labels = list(dict.fromkeys((r["case"], r.get("layout", "")) for r in rows))
    series = sorted({(r["impl"], r["mode"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(labels)), 5))
    width = 0.8 / len(series)
    for i, (impl, mode) in enumerate(series):
        ys = [next((r[value] or 0 for r in rows if (r["case"], r.get("layout", "")) == lab
                    and r["impl"] == impl and r["mode"] == mode), 0) for lab in labels]
        ax.bar([j + i * width for j in range(len(labels))], ys, width,
               label=impl if mode == "-" else f"{impl} {mode}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
    ax.set_xticklabels([f"{case} {layout}".strip() for case, layout in labels], rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)
