"""Lab: the soft cap's accuracy margin on the sm90 kernel, err / err(R) of numerics §5's rule for a model's cap over
large scores (score_mod_suite.LARGE_CAP), per head dim and seed. Prints one line per case."""
import sys

import torch

sys.path.insert(0, "tests")
import rtcattn
import score_mod_suite as sms
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

for cap in (50.0, 30.0, 10.0):
    for d in (64, 128, 256):
        worst = 0.0
        for seed in range(3):
            q, _, _ = sms._qkv((2, 200, 4, d), (1,), "cuda", torch.bfloat16, seed, sms.LARGE_CAP_QK)
            _, k, v = sms._qkv((1,), (2, 600, 2, d), "cuda", torch.bfloat16, seed + 1, sms.LARGE_CAP_QK)
            with dispatch.pinned(kernel="sm90"):
                out = rtcattn.forward(q, k, v, causal=True, softcap=cap)
            o64, _ = ref.reference_fp64(q, k, v, "bshd", None, (-1, 0), softcap=cap)
            r = ref.reference_r(q, k, v, "bshd", "rtne", None, (-1, 0), softcap=cap)
            err, err_r = ref.errors(out.cpu(), o64.cpu())[0], ref.errors(r.cpu(), o64.cpu())[0]
            worst = max(worst, err / err_r)
        print(f"cap {cap:5.1f} D {d:3d}: max err / err(R) over 3 seeds {worst:.3f} (the rule: <= 2)")
