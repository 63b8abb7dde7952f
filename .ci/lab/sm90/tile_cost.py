"""Lab: split each implementation's time into a per-tile fixed cost and a per-key cost (sm90 prefill, issue 21).
Non-causal, bf16, BSHD, B 2, Sq 4096, H = 4096 // D, Sk swept: the fit ms = a + b * Sk gives the cost that does not
grow with the keys (a: prologue, epilogue, Q loads, tail) and the steady cost per key (b), for rtcattn (pinned to
sm90), FA4 (when installed) and cuDNN in the same interleaved rounds; causal Sk = Sq = 4096 is timed beside them.
Usage: tile_cost.py [D,...] [causal|quick] [-- DEFS]  (causal: the causal row only; quick: full and causal at Sk
4096; DEFS: -D defines, NAME=VALUE)"""
import sys

import torch

import rtcattn
from rtcattn.runtime import dispatch
from rtcattn.tools import timing

argv = sys.argv[1:]
defs = argv[argv.index("--") + 1:] if "--" in argv else []
argv = argv[:argv.index("--")] if "--" in argv else argv
dims = [int(x) for x in (argv[0] if argv else "64,128,256").split(",")]
opts = tuple(f"-D{d}" for d in defs)
causal_only = "causal" in argv[1:]
quick = "quick" in argv[1:]  # full and causal at Sk 4096 only
SKS = (1024, 2048, 4096, 8192)


def impls(causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}

    def ours(q, k, v):
        with dispatch.pinned(kernel="sm90", options=opts):
            return rtcattn.forward(q, k, v, layout="bshd", round_mode="rtne",
                                   window_size=(-1, 0) if causal else (-1, -1))
    out["ours"] = ours

    def cudnn(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    out["cudnn"] = cudnn
    try:
        from flash_attn.cute import flash_attn_func

        def fa4(q, k, v):
            return flash_attn_func(q, k, v, causal=causal)
        out["fa4"] = fa4
    except Exception:
        pass
    return out


def run(d, sk, causal):
    h = max(1, 4096 // d)
    sets = [tuple(torch.randn(2, s, h, d, device="cuda", dtype=torch.bfloat16) for s in (4096, sk, sk))
            for _ in range(2)]
    fns = {}
    for n, f in impls(causal).items():
        try:
            f(*sets[0])
            fns[n] = f
        except Exception:
            pass
    t = timing.time_rounds(fns, sets, 20, 1.5)
    return {n: sorted(x)[len(x) // 2] for n, x in t.items()}


for d in dims:
    if causal_only or quick:
        h = max(1, 4096 // d)
        for causal in (False, True) if quick else (True,):
            c = run(d, 4096, causal)
            fl = 4 * 2 * h * 4096 * 4096 * d / (2 if causal else 1)
            print(f"D {d} {'causal' if causal else 'full'}: " +
                  ", ".join(f"{n} {ms:.4f} ms ({fl / ms / 1e9:.0f} TF/s)" for n, ms in c.items()), flush=True)
        continue
    rows = {sk: run(d, sk, False) for sk in SKS}
    causal = run(d, 4096, True)
    names = list(rows[SKS[0]])
    print(f"D {d}: ms per call (non-causal, Sk swept; causal at 4096)")
    print("  " + f"{'Sk':>6} " + " ".join(f"{n:>8}" for n in names))
    for sk in SKS:
        print("  " + f"{sk:>6} " + " ".join(f"{rows[sk].get(n, float('nan')):8.4f}" for n in names))
    print("  " + f"{'causal':>6} " + " ".join(f"{causal.get(n, float('nan')):8.4f}" for n in names))
    for n in names:
        xs = torch.tensor([float(s) for s in SKS], dtype=torch.float64)
        ys = torch.tensor([rows[s][n] for s in SKS], dtype=torch.float64)
        b = (((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()).item()
        a = (ys.mean() - b * xs.mean()).item()
        at = a + b * 4096
        print(f"  {n:>6}: fixed {a * 1e3:7.1f} us ({a / at:5.1%} of Sk 4096), {b * 1e6:7.3f} us per 1k keys; "
              f"causal / half of full at 4096 {causal[n] / (0.5 * rows[4096][n]):5.3f}")
