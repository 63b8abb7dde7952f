"""Lab: where the transformers integration's time goes on a GPU (host overhead per call vs the kernels), one attention
call at a time: rtcattn through the integration's attention function against torch SDPA, decode and prefill shapes,
unpadded and padded, and forward + backward at training size. Prints wall time per call (device synchronised once per
loop, so it is the steady rate host and device together sustain) and the kernels rtcattn picked."""
import os
import sys
import time

import torch
import torch.nn.functional as F

from rtcattn.integrations import transformers as rt


class M(torch.nn.Module):
    is_causal = True


def rate(fn, n=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def one_shape(m, dev, b, hq, hk, d, sq, sk):
    import rtcattn
    q = torch.randn(b, sq, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn_like(k)
    mask = torch.ones(b, sk, dtype=torch.bool, device=dev)
    mask[1, :100] = False
    mask4 = rt._mask_4d(mask, sq, True, (-1, -1))
    cases = {
        "rtcattn dense": lambda: rt.attention_forward(m, q, k, v, None),
        "rtcattn padded": lambda: rt.attention_forward(m, q, k, v, mask),
        "rtcattn.forward bhsd": lambda: rtcattn.forward(q, k, v, layout="bhsd", causal=True),
        "sdpa dense": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=sq > 1, enable_gqa=True),
        "sdpa 4-D mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask4, enable_gqa=True),
    }
    for name, fn in cases.items():
        print(f"Sq {sq:5d} Sk {sk:5d} {name:22s} {rate(fn):9.1f} us/call", flush=True)
    for name, fn in cases.items():
        kernels(f"Sq {sq} Sk {sk} {name}", fn)


def kernels(what, fn, n=10):
    """The device's kernels a call runs (torch.profiler, n calls): each kernel's device time per call, and the
    kernels rtcattn picked (RTCATTN_LOG=1 on one call)."""
    os.environ["RTCATTN_LOG"] = "1"
    fn()
    os.environ.pop("RTCATTN_LOG")
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / n, e.count // n, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"  {what}: device {total:.1f} us/call in " +
          "; ".join(f"{k[:48]} x{c} {t:.1f}" for t, c, k in rows[:5]), flush=True)


def main():
    dev = "cuda"
    m = M()
    b, hq, hk, d = 4, 16, 4, 128
    for sq, sk in ((1, 1056), (1024, 1024)):
        one_shape(m, dev, b, hq, hk, d, sq, sk)
    # training size: forward + backward
    q = torch.randn(b, 1024, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    k = torch.randn(b, 1024, hk, d, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    v = torch.randn(b, 1024, hk, d, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    go = torch.randn(b, 1024, hq, d, device=dev, dtype=torch.bfloat16)

    def ours():
        out, _ = rt.attention_forward(m, q, k, v, None)
        out.backward(go)

    def theirs():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
        out.backward(go)

    mask = torch.ones(b, 1024, dtype=torch.bool, device=dev)
    for i, n in enumerate((1024, 896, 768, 640)):  # the bench's left-padded batch: the packed form with a gradient
        mask[i, :1024 - n] = False
    mask4 = rt._mask_4d(mask, 1024, True, (-1, -1))

    def ours_padded():
        out, _ = rt.attention_forward(m, q, k, v, mask)
        out.backward(go)

    def theirs_padded():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask4, enable_gqa=True).transpose(1, 2)
        out.backward(go)
    os.environ["RTCATTN_LOG"] = "1"
    ours()
    os.environ.pop("RTCATTN_LOG")
    train = (("rtcattn fwd+bwd", ours), ("sdpa fwd+bwd", theirs), ("rtcattn padded fwd+bwd", ours_padded),
             ("sdpa padded fwd+bwd", theirs_padded))
    for name, fn in train:
        print(f"train 4x1024 {name:22s} {rate(fn, 50):9.1f} us/call", flush=True)
    for name, fn in train:
        kernels(f"train 4x1024 {name}", fn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
