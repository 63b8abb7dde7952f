"""attention_bwd's benchmark suite for `python -m rtcattn bench --backward` (= `--suite backward`): the backward pass
alone (dq, dk, dv of a forward graph built once per input set: `torch.autograd.grad(out, (q, k, v), dout,
retain_graph=True)`), rtcattn against torch SDPA's cuDNN backend and FlashAttention-4 (flash_attn.cute, autograd)
in the same interleaved rounds (tools/timing.py), bf16, BSHD.

Cases: issue 24's table (D 128; (B, Hq/Hk, S) = (2, 24/24, 8192), (1, 32/32, 16384), (4, 16/16, 16384),
(2, 32/8, 8192)), D 64 and D 256, causal and not, `--shapes seed` the seed's shapes; each in every mode of
`--backward-modes` (RTNE, RTZ) and deterministic on and off (rtcattn's and FA4's flag; cuDNN has none). FLOPs are
2.5 times the forward's (4 B H S^2 D, halved for causal), as FlashAttention reports a backward.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

from ...tools import bench as driver, timing
from ..attention_fwd import peers
from ..attention_fwd.bench import SEED_SHAPES

# (B, Hq, Hk, S, D)
ISSUE_SHAPES = [(2, 24, 24, 8192, 128), (1, 32, 32, 16384, 128), (4, 16, 16, 16384, 128), (2, 32, 8, 8192, 128),
                (2, 32, 32, 8192, 64), (2, 8, 8, 8192, 256)]
PEERS = (("sdpa-cudnn", "cuDNN"), ("fa4", "FA4"))


@dataclass(frozen=True)
class BwdCase:
    b: int
    hq: int
    hk: int
    s: int
    d: int
    causal: bool
    mode: str
    deterministic: bool

    def label(self) -> str:
        heads = f"{self.hq}" if self.hq == self.hk else f"{self.hq}/{self.hk}"
        return (f"({self.b}, {heads}, {self.s}) D{self.d}" + (" causal" if self.causal else "")
                + f" {self.mode}" + (" det" if self.deterministic else ""))

    def flops(self) -> float:
        return 2.5 * 4.0 * self.b * self.hq * self.s * self.s * self.d / (2.0 if self.causal else 1.0)

    def fields(self) -> dict:
        return {"case": self.label(), "B": self.b, "Hq": self.hq, "Hk": self.hk, "S": self.s, "D": self.d,
                "causal": self.causal, "mode": self.mode, "deterministic": self.deterministic, "flops": self.flops()}


def cases(args) -> list:
    shapes = [(b, h, h, s, 128) for b, h, s in SEED_SHAPES] if args.shapes == "seed" else ISSUE_SHAPES
    modes = [m.strip() for m in args.backward_modes.split(",") if m.strip()]
    for m in modes:
        driver.check_choice("--backward-modes", m, ("rtne", "rtna", "rtz"))
    return [BwdCase(b, hq, hk, s, d, causal, mode, det) for b, hq, hk, s, d in shapes for causal in (False, True)
            for mode in modes for det in (True, False)]


def _graphs(forward, sets, torch):
    """Per input set: (out, (q, k, v), dout), the forward's graph kept for repeated backwards."""
    out = []
    for q, k, v in sets:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        o = forward(q, k, v)
        out.append((o, (q, k, v), torch.randn_like(o)))
    return out


def _backward_fn(forward, sets, torch):
    """fn(i): the backward of input set i's graph (what is timed); a forward that fails raises here (n/a)."""
    graphs = _graphs(forward, sets, torch)

    def run(i):
        o, qkv, dout = graphs[i]
        return torch.autograd.grad(o, qkv, dout, retain_graph=True)
    return run


def _forwards(c: BwdCase):
    """impl -> forward(q, k, v) building the graph, or why the impl cannot run here."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import rtcattn
    fa4 = peers.fa4()[0]

    def ours(q, k, v):
        return rtcattn.flash_attn_func(q, k, v, causal=c.causal, deterministic=c.deterministic,
                                       how_v3_bf16_cvt={"rtne": 0, "rtna": 1, "rtz": 2}[c.mode])

    def cudnn(q, k, v):
        gqa = {"enable_gqa": True} if c.hk != c.hq else {}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=c.causal, **gqa).transpose(1, 2)

    def fa4_fwd(q, k, v):
        return peers.first(fa4(q, k, v, causal=c.causal, deterministic=c.deterministic))
    fns = {"rtcattn": ours, "sdpa-cudnn": cudnn if not c.deterministic else "cuDNN has no deterministic flag",
           "fa4": fa4_fwd if fa4 is not None else "flash_attn.cute is not installed"}
    return fns


def case_rows(c: BwdCase, reps: int, budget_s: float) -> list:
    import torch
    sets = [tuple(torch.randn((c.b, c.s, h, c.d), device="cuda", dtype=torch.bfloat16) for h in (c.hq, c.hk, c.hk))
            for _ in range(2)]
    fns, rows = {}, []
    for name, fwd in _forwards(c).items():
        why = fwd if isinstance(fwd, str) else None
        if why is None:
            try:
                fn = _backward_fn(fwd, sets, torch)
                why = peers.try_call(fn, [(0,)])
            except Exception as e:  # a peer's forward that fails is its n/a
                why = f"{type(e).__name__}: {peers.first_line(e)}"
        if why:
            rows.append(dict(c.fields(), impl=name, status=f"n/a: {why}", ms=None, tflops=None))
        else:
            fns[name] = fn
    times = timing.time_rounds(fns, [(0,), (1,)], reps, budget_s) if fns else {}
    for name, t in times.items():
        ms = statistics.median(t)
        r = dict(c.fields(), impl=name, status="ok", ms=ms, reps=len(t), spread=(max(t) - min(t)) / ms,
                 tflops=c.flops() / (ms * 1e-3) / 1e12)
        if name == "rtcattn":
            r.update({f"vs_{p}": timing.ratio(times.get(p), t) for p, _ in PEERS})
        rows.append(r)
    return rows


def print_rows(rows: list) -> None:
    fmt = timing.fmt
    head = f"{'case':<42}{'rtcattn':>9}{'cuDNN':>8}{'FA4':>8}{'x cuDNN':>9}{'x FA4':>8}"
    print(head)
    print("-" * len(head))
    for case in dict.fromkeys(r["case"] for r in rows):
        by = {r["impl"]: r for r in rows if r["case"] == case}
        ours = by.get("rtcattn", {})
        cells = [fmt(by.get(i, {}).get("tflops"), ".0f") for i in ("rtcattn", "sdpa-cudnn", "fa4")]
        print(f"{case:<42}" + "".join(f"{x:>9}" if n == 0 else f"{x:>8}" for n, x in enumerate(cells))
              + f"{fmt(ours.get('vs_sdpa-cudnn'), '.3f'):>9}{fmt(ours.get('vs_fa4'), '.3f'):>8}")
    print("TFLOP/s of the backward (2.5 x the forward's FLOPs); n/a where a peer does not take the case")


def backward(args) -> dict:
    import torch
    rows = []
    for c in cases(args):
        print(f"{c.label()} ...", file=sys.stderr, flush=True)
        rows += case_rows(c, args.reps, args.budget_s)
        torch.cuda.empty_cache()
    print_rows(rows)
    return {"rows": rows, "title": "backward (dq, dk, dv), bf16, bshd"}


def backward_plan(args) -> dict:
    rows = [c.fields() for c in cases(args)]
    for r in rows:
        print(f"{r['case']:<44}{r['flops'] / 1e12:>8.2f} TFLOP")
    print(f"{len(rows)} cases; each times rtcattn's backward, cuDNN's and FA4's (when flash_attn.cute imports) in the "
          "same rounds; nothing was run")
    return {"rows": rows}


def add_arguments(p) -> None:
    p.add_argument("--backward", action="store_const", dest="suite", const="backward",
                   help="the backward suite (= --suite backward)")
    p.add_argument("--backward-modes", default="rtne,rtz", help="backward suite: bf16 rounding modes (default "
                                                                 "rtne,rtz); --shapes seed: the seed's shapes")


driver.register("backward", backward, "the backward pass (dq, dk, dv) against cuDNN and FA4 (--backward)",
                add_arguments, plan=backward_plan)
