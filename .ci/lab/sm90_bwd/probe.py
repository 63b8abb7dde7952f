"""Lab probe (not a product benchmark): the backward alone, rtcattn against torch SDPA's cuDNN backend and FA4 (when
installed), a few shapes, CUDA events over `reps` calls after warm-ups; then rtcattn's three launches' times from the
profiler. Usage: python3 .ci/lab/sm90_bwd/probe.py [reps] [D,...] [det]"""
import sys

import torch

import rtcattn

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
dims = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 128, 256]
DET = len(sys.argv) > 3 and sys.argv[3] == "det"  # rtcattn's and FA4's deterministic flag (default: off)
SHAPES = {64: (2, 32, 8192), 96: (2, 24, 8192), 128: (2, 24, 8192), 192: (2, 16, 8192), 256: (2, 8, 8192)}


def timed(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def case(b, h, s, d, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    o = rtcattn.flash_attn_func(q, k, v, causal=causal, deterministic=DET)
    do = torch.randn_like(o)
    ours = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dot = do.transpose(1, 2)
    cud = timed(lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True))
    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    fa4 = float("nan")
    try:
        from flash_attn.cute import flash_attn_func
        qf, kf, vf = (t.detach().requires_grad_() for t in (q, k, v))
        of = flash_attn_func(qf, kf, vf, causal=causal, deterministic=DET)
        of = of[0] if isinstance(of, tuple) else of
        fa4 = timed(lambda: torch.autograd.grad(of, (qf, kf, vf), do, retain_graph=True))
    except Exception as e:  # a lab probe: FA4 may be absent
        print("  FA4:", type(e).__name__, str(e)[:120])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
    stages = [f"{e.device_time / 1e3:.2f}" for e in prof.events() if "attention_bwd" in e.name and e.device_time > 0]
    print(f"D{d:4d} ({b},{h},{s}) causal={int(causal)}  rtcattn {flops / ours / 1e9:6.1f} TF/s  "
          f"cuDNN {flops / cud / 1e9:6.1f}  FA4 {flops / fa4 / 1e9:6.1f}  ours/best {min(cud, fa4) / ours:.3f}  "
          f"stages ms {stages} total {ours:.2f}", flush=True)


for d in dims:
    for causal in (False, True):
        case(*SHAPES[d], d, causal)
