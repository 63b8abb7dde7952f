"""Lab: the host's cost of one call of the transformers integration's attention function on the CPU, with sm_90a's
selection and the runtime's launch replaced by nothing (what a GPU call costs the host before its kernels are queued;
the device copies a GPU does, e.g. q into rows, are real CPU work here). Prints the kernel each call selects first.
Usage: RTCATTN_EMULATE=gfx942 python .ci/lab/transformers/host_cpu.py [profile]"""
import cProfile
import pstats
import sys
import time

import torch

from rtcattn.integrations import transformers as rt
from rtcattn.runtime import dispatch


class M(torch.nn.Module):
    is_causal = True


def main():
    dispatch.device_facts = lambda dev: ("sm_90a", 132)
    dispatch.vendor_of = lambda dev: "cuda"
    dispatch.check_runnable = lambda *a: None
    chosen = []
    dispatch.launch = lambda op, device, sel, *a, **k: chosen.append(f"{sel.kernel.name} ({sel.variant.name})")
    b, hq, hk, d = 4, 16, 4, 128
    for sq, sk in ((1, 1056), (1024, 1024)):
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(b, sk, hk, d, dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn_like(k)
        mask = torch.ones(b, sk, dtype=torch.bool)
        mask[1, :100] = False
        for name, m in (("dense", None), ("left-padded", mask)):
            def f(q=q, k=k, v=v, m=m):
                return rt.attention_forward(M(), q, k, v, m)
            chosen.clear()
            f()
            first = chosen[:]
            n = 200
            t = time.perf_counter()
            for _ in range(n):
                f()
            print(f"Sq {sq:5d} Sk {sk:5d} {name:12s} {(time.perf_counter() - t) / n * 1e6:7.0f} us/call  {first}")
            if sys.argv[1:] == ["profile"] and name != "dense" and sq == 1:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(n):
                    f()
                prof.disable()
                pstats.Stats(prof).sort_stats("cumtime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
