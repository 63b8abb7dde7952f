"""Host time per rtcattn.forward call on a GPU (CPU timer over many calls of a tiny shape), split by layer.

Usage: python3 host_overhead.py [PKG_DIR]  (PKG_DIR: another copy of the python package to time, e.g. an
older one; default: the one on PYTHONPATH). Prints one line per layer in microseconds per call."""
import os
import sys
import time

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402

import rtcattn  # noqa: E402
from rtcattn import dispatch, validate  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def per_call_us(fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main():
    q, k, v = (torch.randn(1, 128, 1, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    prob = validate.check_inputs(q, k, v, "bshd", "rtne", None)
    lines = {
        "rtcattn.forward": lambda: rtcattn.forward(q, k, v),
        "forward(out=)": lambda: rtcattn.forward(q, k, v, out=out),
        "torch.ops.rtcattn.fwd": lambda: torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", prob.scale, False),
        "validate.check_inputs": lambda: validate.check_inputs(q, k, v, "bshd", "rtne", None),
        "dispatch.run": lambda: dispatch.run(q, k, v, out, None, "bshd", "rtne", prob),
    }
    rtcattn.forward(q, k, v)
    sel = dispatch.last_selection
    args = dispatch.attention_args(q, k, v, out, None, "bshd", prob, 132)
    prog = dispatch.build(sel.variant).program
    stream = torch.cuda.current_stream().cuda_stream
    lines["C rtc_attention_fwd (3 maps + launch)"] = lambda: dispatch.lib().attention_fwd(
        prog, sel.kernel.kind, args, "cuda", 0, stream)
    try:
        from sm90_driver import Sm90Kernel
        kern = Sm90Kernel("rtne")
        p, _, _ = kern.prepare(q, k, v, "bshd")
        lines["harness cuLaunchKernel only"] = lambda: kern.launch(p)
    except Exception as e:  # the harness needs NVRTC through ctypes; the product lines stand alone
        print(f"(harness line skipped: {e})")
    for name, fn in lines.items():
        print(f"host {name:<40} {per_call_us(fn):8.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
