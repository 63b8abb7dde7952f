"""`python -m rtcattn first-call`: how much longer a fresh process's first forward takes than the steady state.

Each measurement runs in a new process (so nothing is warm in Python), after one earlier process has
filled the code-object cache: the figure is what a user pays once per process with a warm cache.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import rtcattn
t2 = time.perf_counter()
dev, shape = sys.argv[1], tuple(int(x) for x in sys.argv[2].split(","))
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
q, k, v = (torch.randn(shape, device=dev).to(torch.bfloat16) for _ in range(3))
sync()
def timed():
    t = time.perf_counter()
    rtcattn.forward(q, k, v)
    sync()
    return time.perf_counter() - t
first = timed()
steady = [timed() for _ in range(int(sys.argv[3]))]
print("RESULT " + json.dumps({"import_torch_s": t1 - t0, "import_rtcattn_s": t2 - t1, "first_s": first,
                              "steady_s": steady, "dynamo_imported": "torch._dynamo" in sys.modules}))
"""


def _shape(text: str) -> str:
    """--shape: B,S,H,D as four positive integers with a head dim the op accepts (checked here, in the parent,
    so a bad value is an error naming the flag rather than a measuring process's traceback)."""
    from ..ops.attention_fwd.validate import head_dim_rule
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a q/k/v shape; accepted: B,S,H,D, four positive "
                                         "integers (e.g. 1,1024,8,128)")
    supports, rule = head_dim_rule()
    if not supports(dims[3]):
        raise argparse.ArgumentTypeError(f"{text!r} has head dim D={dims[3]}; accepted: {rule}")
    return text


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; accepted: an integer >= 1")
    return n


def add_parser(sub) -> None:
    p = sub.add_parser("first-call", help="time a fresh process's first forward against the steady state")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"),
                   help="cuda or cpu (cpu needs RTCATTN_EMULATE); default: cuda if present")
    p.add_argument("--shape", default="1,1024,8,128", type=_shape, help="q/k/v shape B,S,H,D (bshd)")
    p.add_argument("--runs", type=_positive, default=3,
                   help="fresh processes measured (after one that warms the cache)")
    p.add_argument("--steady", type=_positive, default=20, help="calls after the first, for the steady state")
    p.set_defaults(func=cmd, parser=p)


def _device(args) -> str:
    """The device to measure on, checked here so that a machine that cannot run it is told which flag to change."""
    import torch

    from ..runtime import dispatch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    chosen = f"--device={args.device}" if args.device else f"--device (default here: {device}, as torch sees no GPU)"
    if device == "cuda" and not torch.cuda.is_available():
        args.parser.error(f"argument {chosen}: torch {torch.__version__} sees no CUDA or ROCm GPU on this machine; "
                          "accepted here: cpu, on the wave emulator (RTCATTN_EMULATE)")
    try:
        dispatch.arch_of(torch.device(device))
    except ValueError as e:
        args.parser.error(f"argument {chosen}: {e}")
    return device


def _child(device: str, shape: str, steady: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, device, shape, str(steady)], capture_output=True, text=True,
                       env=dict(os.environ), timeout=900)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"the measuring process failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(line[-1][len("RESULT "):])


def cmd(args) -> int:
    device = _device(args)
    _child(device, args.shape, 1)  # fills the cache, so every measured process finds its code object
    rows = []
    for i in range(args.runs):
        r = _child(device, args.shape, args.steady)
        steady = statistics.median(r["steady_s"])
        rows.append((r["import_rtcattn_s"], r["first_s"], steady, r["first_s"] - steady, r["dynamo_imported"]))
        print(f"process {i + 1}: import rtcattn {r['import_rtcattn_s'] * 1e3:7.1f} ms, first forward "
              f"{r['first_s'] * 1e3:8.1f} ms, steady {steady * 1e3:7.2f} ms, first - steady "
              f"{(r['first_s'] - steady) * 1e3:7.1f} ms, torch._dynamo imported: {r['dynamo_imported']}")
    over = statistics.median(r[3] for r in rows)
    print(f"first call over steady state, median of {len(rows)} fresh processes ({device}, shape {args.shape}, warm "
          f"cache): {over * 1e3:.1f} ms")
    return 0
