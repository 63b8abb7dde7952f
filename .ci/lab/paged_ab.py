"""Lab: chunked prefill (8 x 512 over 4096, causal, Hq 32 / Hk 8, D 128 or argv[2]) dense vs packed vs paged,
rtcattn RTNE only.

Prints ms per call (median of interleaved rounds). Used to separate what costs paged loads time
(NOTES, serving issue); run it twice with different builds of the kernel source to compare."""
import sys

import torch

import rtcattn
from rtcattn.ops.attention_fwd import bench as bv
from rtcattn.tools import timing

b, sq, sk = bv.PREFILL
HQ, HK = bv.HQ, bv.HK
D = int(sys.argv[2]) if len(sys.argv) > 2 else bv.D  # a head dim other than the bench's 128
cq = bv._cu([sq] * b, torch)
ck = bv._cu([sk] * b, torch)
q = torch.randn(b * sq, HQ, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b * sk, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
fns = {"dense": lambda: rtcattn.forward(q.view(b, sq, HQ, D), k.view(b, sk, HK, D), v.view(b, sk, HK, D), causal=True),
       "packed": lambda: rtcattn.forward_varlen(q, k, v, cq, ck, sq, sk, causal=True)}
for page in [int(x) for x in (sys.argv[3:] or (16, 32, 64, 128, 256))]:  # argv[3:]: pages
    kp, vp, table = bv._paged(k, v, [sk] * b, page, torch, seed=page)
    fns[f"paged{page}"] = (lambda kp=kp, vp=vp, table=table:
                           rtcattn.forward_varlen(q, kp, vp, cq, ck, sq, sk, causal=True, block_table=table))
times = timing.time_rounds({n: (lambda f=f: f()) for n, f in fns.items()}, [()], 30, 6.0)
tag = sys.argv[1] if len(sys.argv) > 1 else ""
print(tag, "  ".join(f"{n} {sorted(t)[len(t) // 2]:.3f}" for n, t in times.items()))
