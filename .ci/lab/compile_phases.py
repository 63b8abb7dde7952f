"""Lab: where one variant's compile time goes, per compiler (issue 21's budget: <= 1 s per variant).

Each variant's build request (the manifest's text, headers and options, as the runtime gets them) is compiled
outside the runtime, with each compiler's own phase report:

- NVRTC (sm_*): `--time=FILE`, a CSV of front end / NVVM optimizer / PTX translation (ptxas) times;
- clang (gfx*): `-ftime-trace`, whose totals split front end, optimizer (LLVM IR passes) and code generation;
- g++ (the emulator, *-emu): `-fsyntax-only` (parse and semantics) and -O0 against the full build;
- hipRTC (gfx90a): no phase report; the whole compile, and an empty kernel's (the fixed cost: comgr's
  device-library link and the code-object steps); set against clang's phases for the same text and arch.

  python3 .ci/lab/compile_phases.py [--variants sm_90a:sm90,gfx942:gfx942,...] [--reps 3]

A variant is ARCH:KERNEL[:HEADDIM[:DTYPE]] at round mode rtne, window mask, paged kv (the largest form).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from rtcattn.runtime import manifest  # noqa: E402

DEFAULT = ("sm_90a:sm90,sm_90a:baseline:128:bf16,sm_90a:baseline:128:fp16,gfx942:gfx942,gfx942:baseline:128:bf16,"
           "gfx90a:gfx942,gfx90a:baseline:128:bf16,gfx942-emu:gfx942,gfx942-emu:baseline:128:bf16")


def request(arch: str, kernel: str, head_dim: int, dtype: str):
    m = manifest.load()
    call = {"round_mode": "rtne", "mask": "window", "kv": "paged", "head_dim": head_dim, "dtype": dtype,
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}
    v = m.variant_for("attention_fwd", kernel, arch, call)
    return v, m.request(v, "lab")


def write_sources(req, d: Path) -> None:
    for name, text in list(req.headers) + [req.main]:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)


def timed(argv) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return (time.perf_counter() - t0) * 1e3


def _nvrtc():
    import nvidia
    libdir = next(p for base in nvidia.__path__ for p in glob.glob(f"{base}/cu*/lib") if glob.glob(f"{p}/libnvrtc.so*"))
    ctypes.CDLL(sorted(glob.glob(f"{libdir}/libnvrtc-builtins.so.*"))[0], mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(sorted(glob.glob(f"{libdir}/libnvrtc.so.*"))[0])


def nvrtc_phases(req, reps: int) -> dict:
    lib = _nvrtc()
    csv = scratch() / "time.csv"
    names = [n.encode() for n, _ in req.headers]
    texts = [t.encode() for _, t in req.headers]
    opts = [o.encode() for o in ["--gpu-architecture=" + req.arch, "--ptxas-options=-v", *req.options,
                                 f"--time={csv}"]]
    for _ in range(reps + 1):
        prog = ctypes.c_void_p()
        lib.nvrtcCreateProgram(ctypes.byref(prog), req.main[1].encode(), req.main[0].encode(), len(names),
                               (ctypes.c_char_p * len(names))(*texts), (ctypes.c_char_p * len(names))(*names))
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        if rc != 0:
            raise RuntimeError(f"NVRTC failed ({rc}) on {req.variant}")
    per_phase: dict = {}
    for line in csv.read_text().splitlines()[1:]:
        _, phase, ms, _ = (x.strip() for x in line.split(","))
        per_phase.setdefault(phase, []).append(float(ms))
    return {phase: statistics.median(v[1:]) for phase, v in per_phase.items()}  # the first is a warm-up


def clang_argv(req, d: Path) -> list:
    clang = shutil.which(os.environ.get("RTCATTN_CLANG", "")) or shutil.which("clang++-19") or "clang++"
    return [clang, "-x", "hip", f"--offload-arch={req.arch}", "-nogpulib", "-nogpuinc", "-O3", "--cuda-device-only",
            "--no-gpu-bundle-output", "-I", str(d), *req.options, "-c", str(d / req.main[0]), "-o", str(d / "out.co")]


def scratch() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rtcattn-compile-phases-"))
    SCRATCH.append(d)
    return d


SCRATCH: list = []


def clang_phases(req, reps: int) -> dict:
    d = scratch()
    write_sources(req, d)
    argv = clang_argv(req, d)
    walls = [timed(argv) for _ in range(reps)]
    # The driver drops -ftime-trace for a device-only compile: it goes to the compiler proper (cc1).
    subprocess.run(argv + ["-Xclang", f"-ftime-trace={d / 'trace.json'}"], check=True, capture_output=True)
    events = json.loads((d / "trace.json").read_text())["traceEvents"]
    totals = {e["name"][len("Total "):]: e["dur"] / 1e3 for e in events if e.get("name", "").startswith("Total ")}
    keep = {"Frontend": "front end", "Optimizer": "optimizer (LLVM IR passes)",
            "CodeGenPasses": "code generation (ISA)", "ExecuteCompiler": "the compiler proper (cc1), all"}
    out = {"whole (wall: driver, cc1, lld link)": statistics.median(walls)}
    return {**out, **{name: totals[k] for k, name in keep.items() if k in totals}}


def host_phases(req, reps: int) -> dict:
    d = scratch()
    write_sources(req, d)
    emu_arch = "0x90a" if req.arch == "gfx90a-emu" else "0x942"
    base = ["g++", "-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-Wno-psabi",
            "-DRTC_EMU=1", f"-DRTC_EMU_ARCH={emu_arch}", "-I", str(d), *req.options, "-x", "c++", str(d / req.main[0])]
    whole = statistics.median(timed(base + ["-o", str(d / "k.so")]) for _ in range(reps))
    syntax = statistics.median(timed(base + ["-fsyntax-only"]) for _ in range(reps))
    o0 = statistics.median(timed(base + ["-O0", "-o", str(d / "k0.so")]) for _ in range(reps))
    # (-ftime-report is left out: its own timers double the parse time it reports.)
    return {"whole (wall)": whole, "parse + semantics (-fsyntax-only)": syntax, "whole at -O0": o0,
            "optimizer + code generation at -O2 (whole - parse)": whole - syntax}


def hiprtc_phases(req, reps: int) -> dict:
    lib = None
    for name in ("libhiprtc.so", "libamdhip64.so.5", "libamdhip64.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return {"hipRTC": float("nan")}

    def once(main, headers, opts) -> float:
        prog = ctypes.c_void_p()
        names = [n.encode() for n, _ in headers]
        texts = [t.encode() for _, t in headers]
        lib.hiprtcCreateProgram(ctypes.byref(prog), main[1].encode(), main[0].encode(), len(names),
                                (ctypes.c_char_p * len(names))(*texts), (ctypes.c_char_p * len(names))(*names))
        o = [x.encode() for x in opts]
        t0 = time.perf_counter()
        rc = lib.hiprtcCompileProgram(prog, len(o), (ctypes.c_char_p * len(o))(*o))
        ms = (time.perf_counter() - t0) * 1e3
        lib.hiprtcDestroyProgram(ctypes.byref(prog))
        if rc != 0:
            raise RuntimeError(f"hipRTC failed ({rc}) on {main[0]}")
        return ms

    arch = [f"--offload-arch={req.arch}"]
    empty = ("empty.hip", 'extern "C" __global__ void k(float* p) { p[0] = 1.0f; }')
    once(empty, [], arch + ["-O3"])  # loads comgr
    # No -O0 run: hipRTC 5.2 aborts the process (LLVM ERROR: Not supported instr) on the gfx942 kernel at -O0.
    return {"whole -O3": statistics.median(once(req.main, req.headers, arch + ["-O3", *req.options])
                                           for _ in range(reps)),
            "empty kernel -O3 (fixed cost)": statistics.median(once(empty, [], arch + ["-O3"]) for _ in range(reps))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=DEFAULT)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    for spec in args.variants.split(","):
        arch, kernel, *rest = spec.split(":")
        v, req = request(arch, kernel, int(rest[0]) if rest else 128, rest[1] if len(rest) > 1 else "bf16")
        compiler = req.compilers[0]
        phases = {"nvrtc": nvrtc_phases, "clang": clang_phases, "host": host_phases, "hiprtc": hiprtc_phases}[compiler]
        if arch.startswith("gfx") and not arch.endswith("-emu") and compiler == "hiprtc" and arch == "gfx942":
            phases = clang_phases  # hipRTC 5.2 cannot target gfx942; the runtime takes clang
        print(f"{arch} {v.name} ({phases.__name__.split('_')[0]})")
        for name, ms in phases(req, args.reps).items():
            print(f"  {name:<48}{ms:>8.0f} ms")
        if phases is hiprtc_phases:  # the same text and arch through clang-19, phase by phase
            print(f"{arch} {v.name} (clang, for comparison)")
            for name, ms in clang_phases(req, args.reps).items():
                print(f"  {name:<48}{ms:>8.0f} ms")
    for d in SCRATCH:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
