"""Launches the sm_90a kernel once per config on one seed shape (for a profiler run around it):
python3 profile_launch.py SHAPE_INDEX mode[:DEF=1+DEF=2] ..."""
import sys

import torch

from dev_sm90 import SEED_SHAPES, make
from sm90_driver import Sm90Kernel

B, H, S = SEED_SHAPES[int(sys.argv[1])]
gen = torch.Generator(device="cuda").manual_seed(5)
q, k, v = make(B, H, S, S, "bshd", gen)
for c in sys.argv[2:]:
    mode, _, defs = c.partition(":")
    kern = Sm90Kernel(mode, [d for d in defs.split("+") if d])
    p, _, _ = kern.prepare(q, k, v, "bshd")
    kern.launch(p)
    torch.cuda.synchronize()
    print("launched", c, flush=True)
