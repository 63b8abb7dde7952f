"""Compares the product path (rtcattn.forward) with the dev harness on the same inputs (debug aid)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refs  # noqa: E402
import sm90_driver  # noqa: E402

import rtcattn  # noqa: E402
from rtcattn import dispatch  # noqa: E402

torch.manual_seed(0)
dev = sm90_driver.Sm90Kernel("rtne")
for (B, H, Sq, Sk) in [(1, 2, 1, 1), (1, 2, 128, 128), (1, 2, 1000, 1000), (2, 3, 17, 300)]:
    q = torch.randn(B, Sq, H, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Sk, H, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Sk, H, 128, device="cuda", dtype=torch.bfloat16)
    o64 = refs.ref64(q, k, v, "bshd", 128 ** -0.5)[0].transpose(1, 2)  # [B,Sq,H,D]
    out = rtcattn.forward(q, k, v, layout="bshd", round_mode="rtne")
    torch.cuda.synchronize()
    sel = dispatch.last_selection.kernel.name
    o_dev = dev(q, k, v, "bshd")[0]
    e_prod = (out.double() - o64.to(out.device).double()).abs().max().item()
    e_dev = (o_dev.double() - o64.to(out.device).double()).abs().max().item() if o_dev is not None else float("nan")
    print(f"B={B} H={H} Sq={Sq} Sk={Sk}: product[{sel}] err {e_prod:.3g}  dev err {e_dev:.3g}", flush=True)
