"""A few small calls of every CUDA kernel, for compute-sanitizer (memcheck, racecheck, synccheck).

Run: compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/sanitizer_smoke.py
Shapes are small (the sanitizer slows kernels down 10-100x) but cover every tail: Sq, Sk of 1, 17, 300.
"""
import os

import torch

import rtcattn
from rtcattn.ops import attention_fwd


def main():
    gen = torch.Generator(device="cuda").manual_seed(11)
    ran = set()
    for d, kernel in ((128, "sm90"), (64, "baseline"), (96, "baseline"), (128, "baseline")):
        os.environ["RTCATTN_KERNEL"] = kernel
        for mode in ("rtne", "rtna", "rtz"):
            for sq, sk in ((1, 1), (17, 300), (300, 17)):
                q = torch.randn(2, sq, 3, d, generator=gen, device="cuda").to(torch.bfloat16)
                k, v = (torch.randn(2, sk, 3, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
                out, lse = rtcattn.forward(q, k, v, round_mode=mode, return_lse=True)
                torch.cuda.synchronize()
                assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
                ran.add(attention_fwd.selection(q, k, v, round_mode=mode).kernel.name)
            # The window variants (the masked sm90 one takes its tiles from a counter through a shared
            # ring), with GQA and with rows and whole tiles that see no key (Sq > Sk, causal).
            for sq, sk, window in ((300, 700, (-1, 0)), (700, 300, (-1, 0)), (260, 260, (17, 3))):
                q = torch.randn(1, sq, 4, d, generator=gen, device="cuda").to(torch.bfloat16)
                k, v = (torch.randn(1, sk, 2, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
                out, lse = rtcattn.forward(q, k, v, round_mode=mode, return_lse=True, window_size=window)
                torch.cuda.synchronize()
                assert torch.isfinite(out.float()).all()
                ran.add(attention_fwd.selection(q, k, v, round_mode=mode, window=window).variant.name)
    print("sanitizer smoke ran kernels:", sorted(ran))


if __name__ == "__main__":
    main()
