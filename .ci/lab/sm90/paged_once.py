"""Lab: one paged chunked-prefill call per page size, synchronised and timed, with its max error against the packed
call (to find a hang or a wrong page quickly). argv: D (default 128), batch, sq, sk."""
import os
import sys
import time

import torch

import rtcattn
from rtcattn.ops.attention_fwd import bench as bv

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
b, sq, sk = (int(x) for x in sys.argv[2:5]) if len(sys.argv) > 4 else bv.PREFILL
HQ, HK = bv.HQ, bv.HK
CAUSAL = os.environ.get("CAUSAL", "1") == "1"
cq = bv._cu([sq] * b, torch)
ck = bv._cu([sk] * b, torch)
q = torch.randn(b * sq, HQ, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b * sk, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
ref = rtcattn.forward_varlen(q, k, v, cq, ck, sq, sk, causal=CAUSAL)
torch.cuda.synchronize()
print(f"D {D} packed: done", flush=True)
for page in [int(x) for x in (sys.argv[5:] or (16, 32, 64, 128))]:
    kp, vp, table = bv._paged(k, v, [sk] * b, page, torch, seed=page)
    out = rtcattn.forward_varlen(q, kp, vp, cq, ck, sq, sk, causal=CAUSAL, block_table=table)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        out = rtcattn.forward_varlen(q, kp, vp, cq, ck, sq, sk, causal=CAUSAL, block_table=table)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / 20 * 1e3
    err = (out - ref).abs().max().item()
    print(f"D {D} page {page}: {ms:.3f} ms/call (host-inclusive), max |paged - packed| {err:.3g}", flush=True)
