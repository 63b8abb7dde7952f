"""Lab: where the host time of one decode call goes (cProfile over 50 calls of a bench case's rtcattn call, after
warm-up). Usage: python3 .ci/lab/sm90_decode/host_profile.py CASE [impl]."""
import cProfile
import pstats
import sys

import torch

from rtcattn.ops.attention_fwd import bench_decode as bd

c = bd.DECODE_CASES[int(sys.argv[1]) - 1]
impl = sys.argv[2] if len(sys.argv) > 2 else "rtcattn"
inputs, meta = bd._decode_inputs(c)
fn = bd._decode_impls(c, meta, None)[impl]
for _ in range(5):
    fn(*inputs[0])
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    fn(*inputs[0])
pr.disable()
torch.cuda.synchronize()
st = pstats.Stats(pr)
st.sort_stats("cumulative").print_stats(40)
st.sort_stats("tottime").print_stats(25)
