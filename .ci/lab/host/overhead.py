"""Lab: the host's cost of one rtcattn call without its kernel, on the CPU: the emulator's arch and dispatch as a
GPU call has them, with the runtime's launch replaced by nothing, so what is timed is validation, dispatch, the
argument block and the allocations (what a GPU call costs the host before its kernel is queued).
Usage: python .ci/lab/host/overhead.py [profile]   (RTCATTN_CACHE_DIR as usual; the variants build once)"""
import cProfile
import os
import pstats
import sys
import time

os.environ.setdefault("RTCATTN_EMULATE", "gfx942")
import torch

import rtcattn
from rtcattn.runtime import dispatch


def cases():
    bf = torch.bfloat16
    q1 = torch.randn(4, 1, 16, 128, dtype=bf).transpose(1, 2)
    k = torch.randn(4, 64, 4, 128, dtype=bf).transpose(1, 2)
    qp = torch.randn(4, 64, 16, 128, dtype=bf).transpose(1, 2)
    qv = torch.randn(256, 16, 128, dtype=bf)
    kv = torch.randn(256, 4, 128, dtype=bf)
    cu = torch.tensor([0, 64, 128, 192, 256], dtype=torch.int32)
    qg, kg = qp.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    go = torch.randn(4, 16, 64, 128, dtype=bf)

    def train():
        out = rtcattn.forward(qg, kg, kg, layout="bhsd", causal=True)
        out.backward(go)
    return {
        "forward decode (bhsd, Sq 1)": lambda: rtcattn.forward(q1, k, k, layout="bhsd", causal=True),
        "forward prefill (bhsd)": lambda: rtcattn.forward(qp, k, k, layout="bhsd", causal=True),
        "forward_varlen": lambda: rtcattn.forward_varlen(qv, kv, kv, cu, cu, 64, 64, causal=True),
        "forward + backward": train,
    }


def main():
    real = dispatch.lib().op_launch
    for fn in cases().values():  # builds and a real launch once: the outputs' memory and caches are warm
        fn()
    lib = dispatch.lib()
    lib.op_launch = lambda *a, **k: None
    try:
        for name, fn in cases().items():
            n = 300
            t = time.perf_counter()
            for _ in range(n):
                fn()
            print(f"{name:30s} {(time.perf_counter() - t) / n * 1e6:8.1f} us/call")
        if sys.argv[1:] == ["profile"]:
            prof = cProfile.Profile()
            fn = cases()["forward decode (bhsd, Sq 1)"]
            prof.enable()
            for _ in range(300):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("cumtime").print_stats(45)
    finally:
        lib.op_launch = real
    return 0


if __name__ == "__main__":
    sys.exit(main())
