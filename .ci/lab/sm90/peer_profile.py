"""One launch of FlashAttention-4 and one of each given rtcattn config on a seed shape (bshd), after a
warm-up call each, for Nsight Compute: ncu -k regex:'attention_fwd_sm90|flash' --launch-skip ... .
Usage: peer_profile.py SHAPE_INDEX [config ...] (configs as in dev_sm90.py: 'mode' or 'mode:DEF=1')."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import dev_sm90 as lab

B, H, S = lab.SEED_SHAPES[int(sys.argv[1])]
configs = sys.argv[2:] or ["rtne"]
q, k, v = lab.make(B, H, S, S, "bshd", torch.Generator(device="cuda").manual_seed(5))
fa4 = lab.fa4_fn(q, k, v, "bshd")
calls = ([("fa4", fa4)] if fa4 is not None else []) + [
    (c, (lambda m, d: lambda: lab.fwd(q, k, v, "bshd", m, d, lse=False))(*lab.parse_config(c))) for c in configs]
for _name, f in calls:   # warm-up: compiles, loads; not profiled with --launch-skip
    f()
torch.cuda.synchronize()
for name, f in calls:
    f()
    torch.cuda.synchronize()
    print("launched", name, flush=True)
