"""Lab harness for the sm_90a kernel: A/B of switches you add to a working copy of op_sources/attention_fwd/sm90.cu
or its role headers, sm90/ (`#ifndef LAB_X`), passed here as NAME=VALUE defines. Everything runs through the product:
rtcattn.forward under dispatch.pinned(kernel="sm90", options=("-DNAME=VALUE", ...)), references from
rtcattn.ops.attention_fwd.reference.
Subcommands: check [DEFS] | bench SHAPES [mode[:DEF=1+DEF=2] ...] | build [DEFS] (ptxas report; no GPU needed) |
sass [DEFS] (build + cuobjdump counts) | once SHAPE CONFIG... (one launch each, for a profiler).
Exits 1 on a failure."""
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

import rtcattn
from rtcattn.ops.attention_fwd import reference
from rtcattn.runtime import dispatch, manifest
from rtcattn.tools import timing

MODES = ("rtne", "rtna", "rtz")
SEED_SHAPES = [(2, 24, 8192), (2, 24, 16384), (1, 32, 16384), (4, 16, 16384), (1, 64, 16384),
               (2, 24, 32768), (2, 16, 65536), (2, 8, 86016), (1, 16, 131072)]


def options(defines):
    return tuple(f"-D{d}" for d in defines)


def fwd(q, k, v, layout, mode, defines=(), out=None, lse=True):
    """The product call on the sm90 kernel (no fallback) built with the extra defines."""
    with dispatch.pinned(kernel="sm90", options=options(defines)):
        return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, out=out, return_lse=lse)


def make(B, H, Sq, Sk, layout, gen):
    def r(S):
        shape = (B, S, H, 128) if layout == "bshd" else (B, H, S, 128)
        return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    return r(Sq), r(Sk), r(Sk)


def poisoned(q):
    out = torch.empty_like(q)
    out.view(torch.int16).fill_(-1)  # 0xFFFF: a NaN nobody writes on purpose
    return out


def check_case(defines, mode, B, H, Sq, Sk, layout, gen):
    q, k, v = make(B, H, Sq, Sk, layout, gen)
    o, lse = fwd(q, k, v, layout, mode, defines, out=poisoned(q))
    torch.cuda.synchronize()
    unwritten = (o.view(torch.int16) == -1).sum().item()
    o64, lse64 = reference.reference_fp64(q, k, v, layout)
    err, norm = reference.errors(o, o64)
    err_r, _ = reference.errors(reference.reference_r(q, k, v, layout, mode), o64)
    lse_ok = bool(reference.lse_close(lse, lse64).all())
    ok = (unwritten == 0 and bool(torch.isfinite(o.float()).all()) and err <= 2 * err_r + 1e-5
          and norm < 1e-2 and lse_ok)
    print(f"{'ok ' if ok else 'BAD'} {mode} {layout} B{B} H{H} Sq{Sq} Sk{Sk}: err {err:.2e} (R {err_r:.2e}) "
          f"norm {norm:.2e} lse {'ok' if lse_ok else 'BAD'} unwritten {unwritten}")
    return ok


def check_special(defines, mode):
    """NaN / +-inf inputs: the NaN pattern, zero rows and LSE of the fp64 reference's special-value table."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = make(1, 2, 200, 300, "bhsd", gen)
    k[..., 0] = k[..., 0].abs() + 0.1
    q[0, 0, 3] = float("nan")                        # NaN row of Q -> NaN row
    q[0, 0, 10] = 0
    q[0, 0, 10, 0] = float("-inf")                   # every score -inf -> zero row, LSE -inf
    q[0, 0, 20] = 0
    q[0, 0, 20, 0] = float("inf")                    # +inf score -> NaN row
    v[0, 1, 5, 7] = float("nan")                     # NaN in V[j, d] -> column d NaN (head 1)
    o, lse = fwd(q, k, v, "bhsd", mode, defines, out=poisoned(q))
    torch.cuda.synchronize()
    o64, lse64 = reference.reference_fp64(q, k, v, "bhsd")
    nan, canon = torch.isnan(o.float()), o.view(torch.int16) == 0x7FFF
    ok = torch.equal(nan, torch.isnan(o64)) and torch.equal(nan, canon)   # every NaN canonical, none unwritten
    ok = ok and bool((o[0, 0, 10] == 0).all()) and bool(reference.lse_close(lse, lse64).all())
    ok = ok and reference.errors(o, o64)[1] < 1e-2
    print(f"{'ok ' if ok else 'BAD'} special values ({mode})")
    return ok


def check_strided(defines, mode):
    gen = torch.Generator(device="cuda").manual_seed(3)
    qkv = torch.randn(2, 333, 3, 4, 128, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o, l1 = fwd(q, k, v, "bshd", mode, defines)
    o2, l2 = fwd(q, k, v, "bshd", mode, defines)
    torch.cuda.synchronize()
    o64, _ = reference.reference_fp64(q, k, v, "bshd")
    err, norm = reference.errors(o, o64)
    err_r, _ = reference.errors(reference.reference_r(q, k, v, "bshd", mode), o64)
    ok = err <= 2 * err_r + 1e-5 and norm < 1e-2
    ok = ok and torch.equal(o.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)
    print(f"{'ok ' if ok else 'BAD'} strided qkv view + determinism ({mode}): err {err:.2e} norm {norm:.2e}")
    return ok


def check(defines=()):
    shapes = [(1, 2, 1, 1), (2, 3, 17, 17), (1, 2, 128, 128), (1, 2, 1000, 1000), (1, 3, 17, 1000),
              (1, 2, 1000, 130), (2, 2, 4096, 4096), (1, 4, 4096, 1)]
    ok = True
    for mode in MODES:
        gen = torch.Generator(device="cuda").manual_seed(1)
        for layout in ("bshd", "bhsd"):
            for (B, H, Sq, Sk) in shapes:
                ok &= check_case(defines, mode, B, H, Sq, Sk, layout, gen)
        ok &= check_strided(defines, mode)
        ok &= check_special(defines, mode)
    return ok


def median_ms(fn, reps):
    return time_interleaved({"f": fn}, reps)["f"]


def time_interleaved(fns, reps):
    """Median ms of each callable, the reps taken round-robin so that clock drift hits all alike.
    A round is queued without host syncs. DEV_LEAD=1 also queues a GPU sleep ahead of each round and
    varies the order (timing.round_orders: every callable follows every other equally often; at the power
    cap a call is faster after a low-power one): otherwise the first callable of a round starts on an
    idle GPU and its events include its host dispatch."""
    lead = os.environ.get("DEV_LEAD", "0") == "1"
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        ev = {}
        order = [names[i] for i in timing.round_orders(len(names), reps)[r]] if lead else names
        if lead:
            torch.cuda._sleep(5_000_000)
        for k in order:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fns[k]()
            b.record()
            ev[k] = (a, b)
        torch.cuda.synchronize()
        for k, (a, b) in ev.items():
            times[k].append(a.elapsed_time(b))
    return {k: sorted(t)[len(t) // 2] for k, t in times.items()}


def parse_config(c):
    """'mode' or 'mode:DEF=1+DEF=2' -> (mode, [defines])."""
    mode, _, defs = c.partition(":")
    return mode, [d for d in defs.split("+") if d]


def fa4_fn(q, k, v, layout):
    """FlashAttention-4 (flash_attn.cute) as a peer column when it imports (DEV_FA4=0 turns it off)."""
    if os.environ.get("DEV_FA4", "1") != "1":
        return None
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        return None
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v)) if layout == "bhsd" else (q, k, v)
    return lambda: flash_attn_func(qs, ks, vs, causal=False)


def timed_shape(B, H, S, layout, configs, gen):
    """ms of SDPA cuDNN (and flash, DEV_FLASH=1) and of every config, interleaved, on one shape; out= preallocated."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = make(B, H, S, S, layout, gen)
    out = torch.empty_like(q)
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v)) if layout == "bshd" else (q, k, v)

    def sdpa(be):
        def f():
            with sdpa_kernel([be]):
                torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
        return f
    fns = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    if os.environ.get("DEV_FLASH", "1") == "1":
        fns["flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    fa4 = fa4_fn(q, k, v, layout)
    if fa4 is not None:
        fns["fa4"] = fa4
    for c in configs:
        mode, defs = parse_config(c)
        fns[c] = (lambda m, d: lambda: fwd(q, k, v, layout, m, d, out=out, lse=False))(mode, defs)
    return time_interleaved(fns, max(3, min(15, int(1500 / (4 * B * H * S * S * 128 / 600e9)))))


def bench(shapes, configs):
    """Every config against SDPA cuDNN per seed shape (layout DEV_LAYOUT); rows of ms, TFLOP/s, x cuDNN."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    rows = [f"matmul 8192^3: {2 * 8192 ** 3 / median_ms(lambda: a @ a, 10) / 1e9:.0f} TFLOP/s"]
    gen = torch.Generator(device="cuda").manual_seed(5)
    table = {}
    layout = os.environ.get("DEV_LAYOUT", "bhsd")
    for (B, H, S) in shapes:
        res = timed_shape(B, H, S, layout, configs, gen)
        def tf(t, flop=4 * B * H * S * S * 128):
            return flop / t / 1e9
        line = (f"({B},{H},{S}) {layout} cudnn {res['cudnn']:.3f} ({tf(res['cudnn']):.0f}) "
                f"fa4 {res.get('fa4', 0):.3f} ({tf(res['fa4']) if 'fa4' in res else 0:.0f})")
        for c in configs:
            line += f" | {c} {res[c]:.3f} {tf(res[c]):.0f} x{res['cudnn'] / res[c]:.3f}"
        rows.append(line)
        table[(B, H, S)] = res
        print(line, flush=True)
    return rows, table


def summary(table, configs):
    """Compact ratio table (peer ms / ours ms; the peer is FA4 when it ran, else cuDNN) with the geomean per config."""
    names = [f"c{i}" for i in range(len(configs))]
    peer = "fa4" if all("fa4" in r for r in table.values()) else "cudnn"
    out = ["configs: " + "; ".join(f"{n}={c}" for n, c in zip(names, configs)) + f"; ratios x {peer}",
           f"{'shape':>15} {'cudnn':>8} " + " ".join(f"{n:>6}" for n in names)]
    logs = [0.0] * len(configs)
    for shp, res in table.items():
        peer = res.get("fa4", res["cudnn"])
        rat = [peer / res[c] for c in configs]
        logs = [lg + math.log(r) for lg, r in zip(logs, rat)]
        out.append(f"{str(shp):>15} {res['cudnn']:8.3f} " + " ".join(f"{r:6.3f}" for r in rat))
    out.append(f"{'geomean':>15} {'':>8} " + " ".join(f"{math.exp(lg / len(table)):6.3f}" for lg in logs))
    return out


def overlapped_ex2(text):
    """MUFU.EX2 count between the steady state's wait_group 1 and its wait_group 0: the softmax that
    runs under the in-flight P V GEMM (ptxas once hoisted the wait and left this at 0)."""
    i = text.find("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    j = text.find("WARPGROUP.DEPBAR.LE gsb0, 0x0", i)
    return text[i:j].count("MUFU.EX2") if i >= 0 and j >= 0 else 0


def build(defines=(), disasm=False):
    """Builds the sm90 variant of each mode (DEV_MODES) through dispatch.build, in a fresh cache so that the
    ptxas report is this compile's; with disasm, counts HGMMA / LDL+STL / overlapped MUFU.EX2 in cuobjdump -sass."""
    m = manifest.load()
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if disasm and not os.path.exists(tool):
        print("cuobjdump not found (PATH, /usr/local/cuda/bin): use `build` for the ptxas report only")
        return False
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for mode in os.environ.get("DEV_MODES", " ".join(MODES)).split():
            v = m.variant_for("attention_fwd", "sm90", "sm_90a",
                              {"round_mode": mode, "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16",
                               "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"})
            res = dispatch.build(v, cache_dir=os.path.join(tmp, mode), extra_options=options(defines))
            log = res.log().replace("\x00", "").strip()
            regs = re.search(r"Used (\d+) registers", log)
            spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill", log))
            warn = [ln for ln in log.splitlines() if re.search(r"warning( #|\s*:)", ln, re.I)]
            line = (f"{v.name} {' '.join(defines)}: {regs.group(1) if regs else '?'} regs, {spills} spill bytes, "
                    f"{len(warn)} compiler warnings, {len(res.code())} bytes ({res.origin}, {res.compile_ms:.0f} ms)")
            good = bool(regs) and spills == 0 and not warn
            if disasm:
                path = os.path.join(tmp, f"{v.name}.cubin")
                open(path, "wb").write(res.code())
                text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
                n_hgmma, n_local = text.count("HGMMA"), text.count("LDL") + text.count("STL")
                line += f"; SASS {n_hgmma} HGMMA, {n_local} LDL/STL, {overlapped_ex2(text)} MUFU.EX2 under P V"
                good = good and n_hgmma > 0 and n_local == 0
            print(f"{'ok ' if good else 'BAD'} {line}" + "".join(f"\n    {w}" for w in warn))
            ok &= good
    return ok


def once(shape, configs):
    """One launch per config on a seed shape (bshd), for a profiler: ncu -k attention_fwd_sm90 ..."""
    B, H, S = SEED_SHAPES[shape]
    q, k, v = make(B, H, S, S, "bshd", torch.Generator(device="cuda").manual_seed(5))
    for c in configs:
        mode, defs = parse_config(c)
        fwd(q, k, v, "bshd", mode, defs, lse=False)
        torch.cuda.synchronize()
        print("launched", c, flush=True)
    return True


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    defines = [d for d in rest if "=" in d and ":" not in d]
    if what == "check":
        ok = check(defines)
    elif what in ("build", "sass"):
        ok = build(defines, disasm=what == "sass")
    elif what == "bench":
        configs = rest[1:] or ["rtne"]
        rows, table = bench([SEED_SHAPES[int(i)] for i in rest[0].split(",")], configs)
        print("\n".join(rows + summary(table, configs)))
        ok = True
    elif what == "once":
        ok = once(int(rest[0]), rest[1:] or ["rtne"])
    else:
        sys.exit(f"unknown subcommand {what!r}; accepted: check, bench, build, sass, once")
    sys.exit(0 if ok else 1)
