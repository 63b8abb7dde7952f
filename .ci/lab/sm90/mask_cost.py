"""Lab: what the window variant costs by itself. Times rtcattn.forward on one shape with no mask (the
unmasked variant), with a window wider than the keys (the window variant, no block cut), and causal,
interleaved, CUDA events, median of N. Usage: python .ci/lab/sm90/mask_cost.py [B H S] [reps]"""
import statistics
import sys

import torch

import rtcattn

b, h, s = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (2, 24, 8192)
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 20
q, k, v = (torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
calls = {"none": {}, "wide window": {"window_size": (10 * s, 10 * s)}, "causal": {"causal": True}}
for kw in calls.values():
    rtcattn.forward(q, k, v, **kw)
torch.cuda.synchronize()
times = {n: [] for n in calls}
for _ in range(reps):
    for n, kw in calls.items():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        rtcattn.forward(q, k, v, **kw)
        e1.record()
        times[n].append((e0, e1))
torch.cuda.synchronize()
f = 4.0 * b * h * s * s * 128
for n, ev in times.items():
    ms = statistics.median(a.elapsed_time(z) for a, z in ev)
    print(f"{n:12s} {ms:8.3f} ms  {f / (2 if n == 'causal' else 1) / ms / 1e9:6.0f} TFLOP/s")
