"""Lab: the sm90 kernel per head-dim bucket. `check`: accuracy against the fp64 reference (dense full/causal,
GQA) for each D and dtype; `bench`: TF/s of rtcattn (pinned to sm90) against SDPA cuDNN / flash and FA4 (when
installed), B 2, S 4096, H = 4096 // D, BSHD, in the same interleaved rounds. Extra -D defines for A/B runs
go after `--` (NAME=VALUE), passed to the sm90 build.
Usage: headdim.py check|bench [D,...] [bf16,fp16] [-- DEFS]"""
import math
import sys

import torch

import rtcattn
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch
from rtcattn.tools import timing

argv = sys.argv[1:]
defs = argv[argv.index("--") + 1:] if "--" in argv else []
argv = argv[:argv.index("--")] if "--" in argv else argv
what = argv[0]
dims = [int(x) for x in (argv[1] if len(argv) > 1 else "64,96,128,192,256").split(",")]
dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
dts = (argv[2] if len(argv) > 2 else "bf16,fp16").split(",")
opts = tuple(f"-D{d}" for d in defs)


def ours(q, k, v, causal):
    with dispatch.pinned(kernel="sm90", options=opts):
        return rtcattn.forward(q, k, v, layout="bshd", round_mode="rtne", window_size=(-1, 0) if causal else (-1, -1))


def check():
    bad = 0
    for dt in dts:
        for d in dims:
            for (b, hq, hk, sq, sk) in ((2, 4, 2, 1000, 1000), (1, 3, 1, 77, 300), (1, 2, 2, 300, 45)):
                g = torch.Generator(device="cuda").manual_seed(d + sq)
                q = torch.randn(b, sq, hq, d, device="cuda", generator=g).to(dtypes[dt])
                k = torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dtypes[dt])
                v = torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dtypes[dt])
                for causal in (False, True):
                    o = ours(q, k, v, causal)
                    o64, _ = ref.reference_fp64(q, k, v, "bshd", window=(-1, 0) if causal else (-1, -1))
                    err = (o.double() - o64).abs().max().item()
                    tol = (2 ** -7 if dt == "bf16" else 2 ** -10) * 4 * max(1.0, o64.abs().max().item())
                    ok = err <= tol and not torch.isnan(o).any()
                    bad += not ok
                    print(f"{dt} D={d} {b}x{hq}/{hk}x{sq}x{sk} causal={causal}: max err {err:.2e}",
                          "ok" if ok else "FAIL")
    return bad


def fa4():
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func
    except Exception:
        return None


def bench():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    f4 = fa4()
    print(f"{'dtype':>5} {'D':>4} {'causal':>6} {'ours':>7} {'cuDNN':>7} {'FA2':>7} {'FA4':>7} {'/best':>6}")
    for dt in dts:
        for d in dims:
            h = max(1, 4096 // d)
            for causal in (False, True):
                sets = []
                for _i in range(2):
                    q, k, v = (torch.randn(2, 4096, h, d, device="cuda").to(dtypes[dt]) for _ in range(3))
                    sets.append((q, k, v))
                fns = {"ours": lambda q, k, v, causal=causal: ours(q, k, v, causal)}
                for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    def f(q, k, v, be=be, causal=causal):
                        with sdpa_kernel([be]):
                            return torch.nn.functional.scaled_dot_product_attention(
                                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
                    try:
                        f(*sets[0])
                        fns[name] = f
                    except Exception:
                        pass
                if f4 is not None:
                    def g(q, k, v, causal=causal):
                        return f4(q, k, v, causal=causal)
                    try:
                        g(*sets[0])
                        fns["fa4"] = g
                    except Exception:
                        pass
                t = timing.time_rounds(fns, sets, 30, 2.0)
                flops = 4 * 2 * h * 4096 * 4096 * d / (2 if causal else 1)
                tf = {n: flops / (sorted(x)[len(x) // 2] * 1e-3) / 1e12 for n, x in t.items()}
                peers = [v for n, v in tf.items() if n in ("cudnn", "fa4")]
                best = max(peers) if peers else math.nan
                print(f"{dt:>5} {d:>4} {str(causal):>6} {tf['ours']:7.1f} {tf.get('cudnn', math.nan):7.1f} "
                      f"{tf.get('fa2', math.nan):7.1f} {tf.get('fa4', math.nan):7.1f} {tf['ours'] / best:6.3f}",
                      flush=True)


sys.exit(1 if (check() if what == "check" else bench()) else 0)
