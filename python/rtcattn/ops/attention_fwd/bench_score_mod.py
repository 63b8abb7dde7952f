"""attention_fwd's score-modification suite, `python -m rtcattn bench --shapes scoremod` (or `--suite scoremod`):
each modification and dropout on against off, in the same rounds (tools/timing.py), forward and backward: issue
25's targets are ratios to the plain kernel (the soft cap <= 1.10x, ALiBi <= 1.05x, dropout <= 1.15x forward and
<= 1.2x backward of its time).

Cases: B 2, S 4096, H = 4096 // D (the head-dim suite's shapes), D 64, 128 and 256, causal and not, bf16, RTNE. For
each case five calls, plain, `softcap=30` (Gemma 2's attention cap), ALiBi (slopes [H], 2^(-8 (h + 1) / H)), both, and
`dropout_p=0.1` (the kernel column says which kernel serves it),
timed as the forward (`rtcattn.forward`) and as the backward alone (`torch.ops.rtcattn.bwd` on the forward's own
output and LSE). The column "x plain" is each call's time over the plain call's, the median of per-round ratios.
"""
from __future__ import annotations

import statistics
import sys

from ...tools import bench as driver, timing

D_VALUES = (64, 128, 256)
B, S, WIDTH = 2, 4096, 4096
SOFTCAP = 30.0
MODS = ("plain", "softcap", "alibi", "softcap_alibi", "dropout")   # score_mod's values, then dropout on
DROPOUT_P = 0.1


def cases(args) -> list:
    text = getattr(args, "head_dims", None)  # the headdim suite's --head-dims, when given
    dims = [int(d) for d in text.split(",")] if text else list(D_VALUES)
    return [(d, causal) for d in dims for causal in (False, True)]


def _score(mod: str, heads: int, torch) -> dict:
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
    return {"softcap": SOFTCAP if "softcap" in mod else 0.0, "alibi_slopes": slopes if "alibi" in mod else None,
            "dropout_p": DROPOUT_P if mod == "dropout" else 0.0}


def case_rows(d: int, causal: bool, reps: int, budget_s: float) -> list:
    import torch

    import rtcattn

    from . import dropout
    from .stub import selection
    from .validate import Dropout, ScoreMod
    h = WIDTH // d
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v, dout = (torch.randn(B, S, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    window = (-1, 0) if causal else (-1, -1)
    fwd, bwd, kernels = {}, {}, {}
    for mod in MODS:
        score = _score(mod, h, torch)
        fwd[mod] = lambda q, k, v, score=score: rtcattn.forward(q, k, v, causal=causal, **score)
        rng = dropout.draw_rng_state(score["dropout_p"], q.device)
        out, lse = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True, *window, False, **score,
                                         rng_state=rng)
        bwd[mod] = lambda q, k, v, out=out, lse=lse, score=score, rng=rng: torch.ops.rtcattn.bwd(
            dout, q, k, v, out, lse, "bshd", "rtne", None, *window, True, None, **score, rng_state=rng)
        kernels[mod] = selection(q, k, v, window=window, score=ScoreMod(score["softcap"], score["alibi_slopes"]),
                                 dropout=Dropout(score["dropout_p"], rng)).kernel.name
    pairs = B * h * (S * (S + 1) // 2 if causal else S * S)
    rows = []
    for stage, fns, flops in (("forward", fwd, 4 * pairs * d), ("backward", bwd, 10 * pairs * d)):
        times = timing.time_rounds(fns, [(q, k, v)], reps, budget_s)
        for mod, t in times.items():
            ms = statistics.median(t)
            rows.append({"case": f"D{d}" + (" causal" if causal else ""), "D": d, "H": h, "causal": causal,
                         "stage": stage, "score_mod": mod, "kernel": kernels[mod] if stage == "forward" else "-",
                         "ms": ms, "reps": len(t), "tflops": flops / (ms * 1e-3) / 1e12,
                         "vs_plain": timing.ratio(t, times["plain"])})
    return rows


def print_rows(rows: list) -> None:
    fmt = timing.fmt
    head = f"{'case':<12}{'stage':<10}{'score_mod':<15}{'kernel':<10}{'ms':>9}{'TFLOP/s':>9}{'x plain':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:<12}{r['stage']:<10}{r['score_mod']:<15}{r['kernel']:<10}{r['ms']:>9.3f}"
              f"{r['tflops']:>9.0f}{fmt(r['vs_plain'], '.3f'):>9}")
    print(f"x plain: this call's time / the plain call's, median of per-round ratios (softcap {SOFTCAP}, dropout "
          f"{DROPOUT_P}; targets: softcap <= 1.10, alibi <= 1.05, dropout <= 1.15 forward, 1.2 backward)")


def score_mod(args) -> dict:
    import torch
    rows = []
    for d, causal in cases(args):
        print(f"score_mod D{d} causal={causal} ...", file=sys.stderr, flush=True)
        rows += case_rows(d, causal, args.reps, args.budget_s)
        torch.cuda.empty_cache()
    print_rows(rows)
    return {"rows": rows, "title": f"score modifications, B {B}, S {S}, H = {WIDTH} // D, bf16, rtne"}


def score_mod_plan(args) -> dict:
    rows = [{"D": d, "H": WIDTH // d, "causal": causal} for d, causal in cases(args)]
    for r in rows:
        print(f"D{r['D']} H {r['H']} causal={r['causal']}: {', '.join(MODS)}; forward and backward")
    print(f"{len(rows)} cases x {len(MODS)} calls x 2 stages; nothing was run")
    return {"rows": rows}


driver.register("scoremod", score_mod, "the soft cap and ALiBi on against off, forward and backward "
                "(--shapes scoremod)", plan=score_mod_plan)
