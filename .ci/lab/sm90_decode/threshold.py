"""Lab: where the decode kernel stops paying off. Paged decode calls (page 16, D 128, bf16, causal) of Sq = 1..16 query
rows per sequence, timed on sm90_decode and on sm90 (both pinned), interleaved rounds; prints ms per call and the
ratio. Used for the dispatch threshold (docs/NOTES.md, "sm90 decode kernel")."""
import torch

import rtcattn
from rtcattn.ops.attention_fwd import bench as bv
from rtcattn.runtime import dispatch
from rtcattn.tools import timing

D = 128
for b, ctx, hq, hk in ((32, 4096, 32, 8), (8, 32768, 32, 8), (128, 2048, 64, 8), (32, 4096, 8, 8)):
    k, v = (torch.randn(b * ctx, hk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kp, vp, table = bv._paged(k, v, [ctx] * b, 16, torch, seed=1)
    ck = bv._cu([ctx] * b, torch)
    line = []
    for sq in (1, 2, 4, 8, 16):
        q = torch.randn(b * sq, hq, D, device="cuda", dtype=torch.bfloat16)
        cq = bv._cu([sq] * b, torch)

        def run(kernel, q=q, cq=cq, sq=sq, kv=(kp, vp, ck, ctx, table)):
            kp_, vp_, ck_, ctx_, table_ = kv
            with dispatch.pinned(kernel=kernel):
                return rtcattn.forward_varlen(q, kp_, vp_, cq, ck_, sq, ctx_, causal=True, block_table=table_)
        t = timing.time_rounds({n: (lambda n=n: run(n)) for n in ("sm90_decode", "sm90")}, [()], 20, 4.0)
        med = {n: sorted(x)[len(x) // 2] for n, x in t.items()}
        ratio = med["sm90"] / med["sm90_decode"]
        line.append(f"Sq {sq}: {med['sm90_decode']:.3f} / {med['sm90']:.3f} ms ({ratio:.2f}x)")
    print(f"B {b} ctx {ctx} {hq}/{hk}:  " + ";  ".join(line))
