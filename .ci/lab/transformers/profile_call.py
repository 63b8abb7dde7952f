"""Lab: cProfile of rtcattn.forward's host path at a decode shape on the GPU (B 4, Hq 16 / Hk 4, Sq 1, Sk 1056,
D 128, bhsd): the functions that take the host's ~400 us a call (torch SDPA's call: ~35 us)."""
import cProfile
import pstats
import sys
import time

import torch

import rtcattn


def main():
    q = torch.randn(4, 1, 16, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(4, 1056, 4, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    def call():
        rtcattn.forward(q, k, k, layout="bhsd", causal=True)
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(300):
        call()
    torch.cuda.synchronize()
    print(f"per call {(time.perf_counter() - t) / 300 * 1e6:.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        call()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats(sys.argv[1] if len(sys.argv) > 1 else "tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
