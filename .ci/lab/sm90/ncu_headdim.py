"""Lab: one launch of FA4 and one of rtcattn's sm90 kernel (bf16, B 2, S 4096, H = 4096 / D, BSHD) inside an NVTX
range "prof", after a warm-up of each, for Nsight Compute: ncu --nvtx --nvtx-include "prof/" ... (ncu_headdim.sh).
Usage: ncu_headdim.py D causal(0|1)"""
import sys

import torch

import rtcattn
from rtcattn.runtime import dispatch

d, causal = int(sys.argv[1]), bool(int(sys.argv[2]))
h = max(1, 4096 // d)
q, k, v = (torch.randn(2, 4096, h, d, device="cuda").to(torch.bfloat16) for _ in range(3))
calls = []
try:
    from flash_attn.cute import flash_attn_func as fa4
    calls.append(("fa4", lambda: fa4(q, k, v, causal=causal)))
except Exception as e:
    print("no FA4:", e)


def ours():
    with dispatch.pinned(kernel="sm90"):
        return rtcattn.forward(q, k, v, layout="bshd", causal=causal)


calls.append(("ours", ours))
for _n, f in calls:
    f()
    f()
torch.cuda.synchronize()
for n, f in calls:
    torch.cuda.nvtx.range_push("prof")
    f()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print("launched", n, flush=True)
