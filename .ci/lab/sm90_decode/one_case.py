"""Lab: run one decode bench case's rtcattn call a few times (for ncu, or a quick timing). Usage:
python3 .ci/lab/sm90_decode/one_case.py CASE [CALLS] [impl]; CASE numbered as `bench --shapes decode --dry-run`,
or b,context,hq,hk,page[,d[,sq]]."""
import os
import sys
import time

import torch

from rtcattn.ops.attention_fwd import bench_decode as bd

# CASE: a number of the bench's cases, or b,context,hq,hk,page[,d[,sq]] for another shape.
c = (bd.DECODE_CASES[int(sys.argv[1]) - 1] if "," not in sys.argv[1]
     else bd.DecodeCase(*(int(x) for x in sys.argv[1].split(","))))
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 5
impl = sys.argv[3] if len(sys.argv) > 3 else "rtcattn"
inputs, meta = bd._decode_inputs(c)
fn = bd._decode_impls(c, meta, None)[impl]
for _ in range(calls):
    fn(*inputs[0])
torch.cuda.synchronize()
if calls > 1 and not os.environ.get("NOTIME"):
    # N calls queued behind a GPU sleep longer than their host time: the events bracket GPU time only (the
    # product's timing harness leads with 3 ms, which a slow host outruns on short calls).
    n = 20
    for _ in range(3):
        torch.cuda._sleep(int(60e6))  # ~30 ms
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        for _ in range(n):
            fn(*inputs[0])
        e.record()
        host_ms = (time.perf_counter() - t0) * 1e3 / n
        torch.cuda.synchronize()
        ms = s.elapsed_time(e) / n
    print(f"case {sys.argv[1]} {c.label()}: {impl} {ms:.4f} ms, {c.kv_bytes / ms / 1e6:.0f} GB/s "
          f"(host {host_ms:.3f} ms a call)")
