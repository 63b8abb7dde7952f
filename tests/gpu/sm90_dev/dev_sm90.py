"""Device run for the sm_90a kernel: `check` (accuracy, special values, determinism), `bench` (seed shapes
vs torch SDPA cuDNN/flash), `sass` (HGMMA / local-memory counts). Prints short tables; exits non-zero on failure."""
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import refs  # noqa: E402
from sm90_driver import Sm90Kernel  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
SEED_SHAPES = [(2, 24, 8192), (2, 24, 16384), (1, 32, 16384), (4, 16, 16384), (1, 64, 16384),
               (2, 24, 32768), (2, 16, 65536), (2, 8, 86016), (1, 16, 131072)]


def make(B, H, Sq, Sk, layout, gen):
    def r(S):
        shape = (B, S, H, 128) if layout == "bshd" else (B, H, S, 128)
        return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    return r(Sq), r(Sk), r(Sk)


def check_case(kern, mode, B, H, Sq, Sk, layout, gen, tag=""):
    q, k, v = make(B, H, Sq, Sk, layout, gen)
    scale = 1.0 / math.sqrt(128)
    o, lse = kern(q, k, v, layout)
    torch.cuda.synchronize()
    o = refs.to_bhsd(o, layout)
    unwritten = (o.view(torch.int16) == -1).sum().item()
    o64, lse64 = refs.ref64(q, k, v, layout, scale)
    r = refs.ref_same_precision(q, k, v, layout, scale, mode)
    e_ours, n_ours = refs.errors(o, o64)
    e_r, _ = refs.errors(r, o64)
    lse_err = ((lse.double() - lse64).abs() / lse64.abs().clamp(min=1)).max().item()
    ok = (unwritten == 0 and torch.isfinite(o.float()).all().item() and e_ours <= 2 * e_r + 1e-5
          and n_ours < 1e-2 and lse_err <= 1e-4)
    print(f"{'ok ' if ok else 'BAD'} {tag}{mode} {layout} B{B} H{H} Sq{Sq} Sk{Sk}: err {e_ours:.2e} "
          f"(R {e_r:.2e}) norm {n_ours:.2e} lse {lse_err:.1e} unwritten {unwritten}")
    return ok


def check_special(kern):
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = make(1, 2, 200, 300, "bhsd", gen)
    k[..., 0] = k[..., 0].abs() + 0.1
    q[0, 0, 3] = float("nan")                       # NaN row of Q -> row NaN
    q[0, 0, 10] = 0; q[0, 0, 10, 0] = float("-inf")  # all scores -inf -> row 0, LSE -inf
    q[0, 0, 20] = 0; q[0, 0, 20, 0] = float("inf")   # +inf score -> row NaN
    v[0, 1, 5, 7] = float("nan")                    # NaN in V[j, d] -> column d NaN (head 1)
    o, lse = kern(q, k, v, "bhsd")
    torch.cuda.synchronize()
    bits = o.view(torch.int16)
    nan_bits = (bits == 0x7FFF)
    ok = bool(nan_bits[0, 0, 3].all() and nan_bits[0, 0, 20].all())
    ok &= bool((bits[0, 0, 10] == 0).all() and lse[0, 0, 10].item() == float("-inf"))
    ok &= bool(nan_bits[0, 1, :, 7].all()) and not bool(nan_bits[0, 1, :, 8].any())
    others = [i for i in range(200) if i not in (3, 10, 20)]
    ok &= bool(torch.isfinite(o[0, 0, others].float()).all())
    ok &= not bool(torch.isnan(o.float()).logical_and(~nan_bits).any())  # every NaN canonical
    print(f"{'ok ' if ok else 'BAD'} special values")
    return ok


def check_strided(kern, mode):
    gen = torch.Generator(device="cuda").manual_seed(3)
    qkv = torch.randn(2, 333, 3, 4, 128, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o, _ = kern(q, k, v, "bshd")
    torch.cuda.synchronize()
    o64, _ = refs.ref64(q, k, v, "bshd", 1 / math.sqrt(128))
    e, n = refs.errors(refs.to_bhsd(o, "bshd"), o64)
    r = refs.ref_same_precision(q, k, v, "bshd", 1 / math.sqrt(128), mode)
    ok = e <= 2 * refs.errors(r, o64)[0] + 1e-5 and n < 1e-2
    o2, _ = kern(q, k, v, "bshd")
    ok &= bool(torch.equal(o.view(torch.int16), o2.view(torch.int16)))
    print(f"{'ok ' if ok else 'BAD'} strided qkv view + determinism ({mode}): err {e:.2e} norm {n:.2e}")
    return ok


def check(defines=(), modes=refs.MODES):
    shapes = [(1, 2, 1, 1), (2, 3, 17, 17), (1, 2, 128, 128), (1, 2, 1000, 1000), (1, 3, 17, 1000),
              (1, 2, 1000, 130), (2, 2, 4096, 4096), (1, 4, 4096, 1)]
    ok = True
    for mode in modes:
        kern = Sm90Kernel(mode, defines)
        gen = torch.Generator(device="cuda").manual_seed(1)
        for layout in ("bshd", "bhsd"):
            for (B, H, Sq, Sk) in shapes:
                ok &= check_case(kern, mode, B, H, Sq, Sk, layout, gen)
        ok &= check_strided(kern, mode)
        if mode == "rtne":
            ok &= check_special(kern)
    return ok


def median_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def time_interleaved(fns, reps):
    """Median ms of each callable, the reps taken round-robin so that clock drift hits all alike.
    A round is queued without host syncs. DEV_LEAD=1 also queues a GPU sleep ahead of each round and
    rotates the order: otherwise the first callable of a round (cuDNN) starts on an idle GPU and its
    events include its host dispatch."""
    lead = os.environ.get("DEV_LEAD", "0") == "1"
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        ev = {}
        order = names[r % len(names):] + names[:r % len(names)] if lead else names
        if lead:
            torch.cuda._sleep(5_000_000)
        for k in order:
            f = fns[k]
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); f(); b.record()
            ev[k] = (a, b)
        torch.cuda.synchronize()
        for k, (a, b) in ev.items():
            times[k].append(a.elapsed_time(b))
    return {k: sorted(t)[len(t) // 2] for k, t in times.items()}


def bench(shapes, configs):
    """configs: 'mode' or 'mode:DEF=1+DEF=2' strings, all timed in the same run, interleaved."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    kerns = {}
    for c in configs:
        mode, _, defs = c.partition(":")
        kerns[c] = None if mode == "product" else Sm90Kernel(mode, [d for d in defs.split("+") if d])
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = median_ms(lambda: a @ a, 10)
    rows = [f"matmul 8192^3: {2 * 8192 ** 3 / mm / 1e9:.0f} TFLOP/s"]
    gen = torch.Generator(device="cuda").manual_seed(5)
    table = {}
    layout = os.environ.get("DEV_LAYOUT", "bhsd")
    for (B, H, S) in shapes:
        q, k, v = make(B, H, S, S, layout, gen)
        flops = 4 * B * H * S * S * 128

        def sdpa(be):
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v)) if layout == "bshd" else (q, k, v)

            def f():
                with sdpa_kernel([be]):
                    F.scaled_dot_product_attention(qs, ks, vs)
            return f
        fns = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
        if os.environ.get("DEV_FLASH", "1") == "1":
            fns["flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
        for c, kern in kerns.items():
            if kern is None:  # "product:<mode>": the same inputs through rtcattn.forward
                import rtcattn
                fns[c] = (lambda m: lambda: rtcattn.forward(q, k, v, layout=layout, round_mode=m))(c.split(":")[1])
                continue
            p, _, _ = kern.prepare(q, k, v, layout)
            fns[c] = (lambda kern, p: lambda: kern.launch(p))(kern, p)
        reps = max(3, min(15, int(1500 / (flops / 600e9))))
        res = time_interleaved(fns, reps)
        tf = lambda t: flops / t / 1e9
        line = f"({B},{H},{S}) {layout} cudnn {res['cudnn']:.3f} ({tf(res['cudnn']):.0f}) flash {res.get('flash', 0):.3f}"
        for c in configs:
            line += f" | {c} {res[c]:.3f} {tf(res[c]):.0f} x{res['cudnn'] / res[c]:.3f}"
        rows.append(line)
        table[(B, H, S)] = res
        print(line, flush=True)
        del q, k, v
    return rows, table


def summary(table, configs):
    """Compact ratio table (cuDNN ms / ours ms) with the geomean per config."""
    names = [f"c{i}" for i in range(len(configs))]
    out = ["configs: " + "; ".join(f"{n}={c}" for n, c in zip(names, configs)),
           f"{'shape':>15} {'cudnn':>8} " + " ".join(f"{n:>6}" for n in names)]
    logs = [0.0] * len(configs)
    for shp, res in table.items():
        rat = [res["cudnn"] / res[c] for c in configs]
        logs = [l + math.log(r) for l, r in zip(logs, rat)]
        out.append(f"{str(shp):>15} {res['cudnn']:8.3f} " + " ".join(f"{r:6.3f}" for r in rat))
    out.append(f"{'geomean':>15} {'':>8} " + " ".join(f"{math.exp(l / len(table)):6.3f}" for l in logs))
    return out


def overlapped_ex2(text):
    """MUFU.EX2 count between the steady state's wait_group 1 and its wait_group 0: the softmax that
    runs under the in-flight P V GEMM (ptxas once hoisted the wait and left this at 0)."""
    i = text.find("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    j = text.find("WARPGROUP.DEPBAR.LE gsb0, 0x0", i)
    return text[i:j].count("MUFU.EX2") if i >= 0 and j >= 0 else 0


def sass(defines=(), mode="rtne"):
    kern = Sm90Kernel(mode, defines)
    tag = "_".join([mode] + [d.replace("=", "") for d in defines])
    path = os.path.join(OUT, f"attn_sm90_{tag}.cubin")
    open(path, "wb").write(kern.cubin)
    text = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    os.remove(path)
    n_hgmma = text.count("HGMMA")
    n_local = sum(text.count(x) for x in ("LDL", "STL"))
    n_ov = overlapped_ex2(text)
    warn = [ln for ln in kern.log.splitlines() if "warning" in ln.lower()]
    print(f"SASS {tag}: {n_hgmma} HGMMA, {n_local} LDL/STL, {n_ov} MUFU.EX2 under P V, "
          f"{len(warn)} ptxas warnings; {kern.log.strip().splitlines()[-2:]}")
    return n_hgmma > 0 and n_local == 0 and not warn


if __name__ == "__main__":
    what = sys.argv[1]
    defines = [d for d in sys.argv[2:] if "=" in d and ":" not in d]
    if what == "check":
        sys.exit(0 if check(defines) else 1)
    if what == "sass":
        sys.exit(0 if sass(defines, os.environ.get("SM90_MODE", "rtne")) else 1)
    if what == "bench":
        sel = [int(i) for i in sys.argv[2].split(",")]
        rows, table = bench([SEED_SHAPES[i] for i in sel], sys.argv[3:] or ["rtne"])
        print("\n".join(rows + summary(table, sys.argv[3:] or ["rtne"])))
