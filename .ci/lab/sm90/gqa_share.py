"""Lab: what GQA's shared K/V buys. Times rtcattn.forward for Hq query heads over Hk = Hq (no sharing)
and Hk = Hq/4, Hq/8 (groups of heads reading one K/V head through L2), full and causal, interleaved,
CUDA events, median of N. Usage: python .ci/lab/sm90/gqa_share.py [B Hq S] [reps]"""
import statistics
import sys

import torch

import rtcattn

b, h, s = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (2, 32, 16384)
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 10
q = torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16)
kv = {hk: [torch.randn(b, s, hk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
      for hk in (h, h // 4, h // 8)}
calls = {(hk, c): (kv[hk], c) for hk in kv for c in (False, True)}
for (k, v), c in calls.values():
    rtcattn.forward(q, k, v, causal=c)
torch.cuda.synchronize()
times = {n: [] for n in calls}
for _ in range(reps):
    for n, ((k, v), c) in calls.items():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        rtcattn.forward(q, k, v, causal=c)
        e1.record()
        times[n].append((e0, e1))
torch.cuda.synchronize()
f = 4.0 * b * h * s * s * 128
for (hk, c), ev in times.items():
    ms = statistics.median(a.elapsed_time(z) for a, z in ev)
    print(f"Hq {h} Hk {hk:3d} {'causal' if c else 'full  '} {ms:8.3f} ms  "
          f"{f / (2 if c else 1) / ms / 1e9:6.0f} TFLOP/s")
