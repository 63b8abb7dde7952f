"""Lab: one variant's cold compile time, per arch and compiler, kernel, head-dim bucket and dtype (issue 21's
budget: <= 1 s each), with nothing else compiling beside it.

Each variant is compiled --reps times into a fresh cache dir (so neither the disk cache nor the runtime's
in-process map answers), one at a time, in one process. The first compile of each compiler in the process also
pays for loading the compiler library (NVRTC, hipRTC) or its first exec; it is reported apart ("first") and is
not one of the timed reps. Only round mode rtne is timed by default: the round modes are one `-D` each and
compile the same code otherwise.

  python3 .ci/lab/compile_budget.py [--arch sm_90a,gfx942,gfx90a,gfx942-emu] [--reps 3]
                                    [--mask none,window] [--kv dense,varlen,paged] [--json F]

Prints one row per (arch, compiler, kernel, bucket, dtype): the median over the reps and the mask/kv forms, the
slowest form with its time, and the median CPU time (the process's threads and its compiler children), which
other work on the machine changes far less than the wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from rtcattn.runtime import dispatch, manifest  # noqa: E402


def _csv(text):
    return [x for x in text.split(",") if x]


def _cpu_s() -> float:
    """CPU seconds of this process (every thread: NVRTC and hipRTC compile in it) and its reaped children
    (clang, g++): one compile at a time, so a difference is that compile's, whatever else the machine runs."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cold(variant, scratch: Path, tag: str) -> tuple:
    """(compile ms as the runtime reports it, CPU ms, compiler id) of one compile into a fresh cache dir."""
    d = tempfile.mkdtemp(prefix=f"{tag}-", dir=scratch)
    cpu0 = _cpu_s()
    r = dispatch.build(variant, d)
    cpu = (_cpu_s() - cpu0) * 1e3
    if r.origin != "compile":
        raise RuntimeError(f"{variant.name} on {variant.arch} came from {r.origin}, not a compile")
    return r.compile_ms, cpu, r.compiler_id


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90a,gfx942,gfx90a,gfx942-emu")
    p.add_argument("--op", default="attention_fwd")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--round-mode", default="rtne")
    p.add_argument("--mask", default="none")
    p.add_argument("--kv", default="dense")
    p.add_argument("--kernels", help="only these kernels (default: every kernel of the op)")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    for k in [k for k in os.environ if k.startswith("RTCATTN_")]:
        del os.environ[k]
    m = manifest.load()
    filters = {"round_mode": _csv(args.round_mode), "mask": _csv(args.mask), "kv": _csv(args.kv)}
    scratch = Path(tempfile.mkdtemp(prefix="rtcattn-compile-budget-"))
    groups: dict = {}
    first: dict = {}
    t_all = time.perf_counter()
    for arch in _csv(args.arch):
        variants = list(m.variants(args.op, archs=[arch], kernels=_csv(args.kernels) if args.kernels else None,
                                   **filters))
        for v in variants:
            if (arch, v.kernel) not in first:  # library load / first exec, kept out of the reps
                first[(arch, v.kernel)] = cold(v, scratch, "first")[0]
            runs = [cold(v, scratch, f"r{i}") for i in range(args.reps)]
            times, cpus, compiler = [r[0] for r in runs], [r[1] for r in runs], runs[0][2]
            key = (arch, compiler, v.kernel, v["head_dim"], v["dtype"])
            groups.setdefault(key, []).append((statistics.median(times), statistics.median(cpus), v.name))
            shown = " ".join(f"{t:.0f}/{c:.0f}" for t, c in zip(times, cpus))
            print(f"{arch} {v.name}: {shown} ms (wall/cpu)", file=sys.stderr, flush=True)
    rows = []
    for (arch, compiler, kernel, bucket, dtype), forms in groups.items():
        worst = max(forms)
        rows.append({"arch": arch, "compiler": compiler, "kernel": kernel, "bucket": bucket, "dtype": dtype,
                     "median_ms": statistics.median(f[0] for f in forms), "max_ms": worst[0],
                     "cpu_ms": statistics.median(f[1] for f in forms), "slowest": worst[2],
                     "first_ms": first.get((arch, kernel)), "forms": len(forms)})
    head = (f"{'arch':<12}{'compiler':<11}{'kernel':<10}{'D':>5} {'dtype':<6}{'median ms':>10}{'max ms':>8}"
            f"{'cpu ms':>8}  slowest")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['arch']:<12}{r['compiler']:<11}{r['kernel']:<10}{r['bucket']:>5} {r['dtype']:<6}"
              f"{r['median_ms']:>10.0f}{r['max_ms']:>8.0f}{r['cpu_ms']:>8.0f}  {r['slowest']}")
    for (arch, kernel), ms in first.items():
        print(f"first compile in the process, {arch} {kernel}: {ms:.0f} ms (includes loading the compiler)")
    print(f"{sum(len(f) for f in groups.values()) * args.reps} timed compiles, {time.perf_counter() - t_all:.0f} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
