"""Lab: the backward's time (CUDA events, median of 10 after 3 warm-ups) of flash_attn_func with a soft cap, ALiBi and
dropout, and without them, at one head dim; B 2, S 4096, H 4096 // D, bf16, full and causal. Run once per tree.
Usage: time_mods_drop.py D"""
import sys

import torch

import rtcattn

d = int(sys.argv[1])
b, s, h = 2, 4096, 4096 // d
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
           for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
slopes = torch.rand(h, device="cuda", generator=gen) * 0.1
for causal in (False, True):
    for name, kw in (("plain", {}), ("cap+alibi+drop", dict(softcap=30.0, alibi_slopes=slopes, dropout_p=0.1))):
        out = rtcattn.flash_attn_func(q, k, v, causal=causal, **kw)
        times = []
        for i in range(13):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            e1.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(e0.elapsed_time(e1))
        print(f"D {d} causal {causal!s:5} {name:15s} bwd {sorted(times)[5]:.3f} ms")
