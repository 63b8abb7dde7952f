"""Emulator benchmark (not a test): wall time of the baseline kernel at (B=1, H=2, Sq=Sk=512, D=128)
on the wave emulator, and fiber switches per second.
Usage: python .ci/lab/bench_emu.py [gfx942|gfx90a] [kernel: baseline (default) | gfx942]"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import time, torch, rtcattn
q, k, v = (torch.randn(1, 512, 2, 128).to(torch.bfloat16) for _ in range(3))
rtcattn.forward(q, k, v)                       # compile or load, and a first run
import sys
sys.stderr.write("TIMED-BEGIN\\n"); sys.stderr.flush()
t0 = time.perf_counter()
rtcattn.forward(q, k, v)
print("WALL", time.perf_counter() - t0)
sys.stderr.write("TIMED-END\\n"); sys.stderr.flush()
import ctypes, struct, tempfile, numpy as np, emu_harness as h
prog = h.build("switch_bench.hip", "switch_bench", rtcattn_arch, tempfile.mkdtemp())
out = np.zeros(8 * 256, dtype=np.uint32)
h.launch(prog, (8, 1, 1), (256, 1, 1), struct.pack("Qi4x", out.ctypes.data, 10))
t0 = time.perf_counter()
h.launch(prog, (8, 1, 1), (256, 1, 1), struct.pack("Qi4x", out.ctypes.data, 2000))
print("SWITCH", time.perf_counter() - t0)
"""


def main() -> int:
    arch = sys.argv[1] if len(sys.argv) > 1 else "gfx942"
    kernel = sys.argv[2] if len(sys.argv) > 2 else "baseline"
    env = dict(os.environ, RTCATTN_EMULATE=arch, RTCATTN_LOG="1", RTCATTN_KERNEL=kernel,
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests" / "emu"),
                                           os.environ.get("PYTHONPATH", "")]))
    child = f"rtcattn_arch = '{arch}-emu'\n" + CHILD
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        print(res.stdout, res.stderr, file=sys.stderr)
        return 1
    wall = float(re.search(r"WALL (\S+)", res.stdout).group(1))
    pattern = (r"host launch \S+: (\S+) ms, (\d+) workgroups, (\d+) barriers, (\d+) wave collectives, "
               r"(\d+) fiber switches")
    timed = res.stderr.split("TIMED-BEGIN")[1].split("TIMED-END")[0]
    # the timed forward may be several launches (the fast kernel: V transpose, attention, merge)
    ms, wgs, bars, colls, switches = (sum(float(x[i]) for x in re.findall(pattern, timed)) for i in range(5))
    kernel_s = ms / 1e3
    print(f"arch {arch}-emu, kernel {kernel}, B=1 H=2 Sq=Sk=512 D=128")
    print(f"forward wall time     {wall:.3f} s (kernel launch {kernel_s:.3f} s, {os.cpu_count()} host cores)")
    print(f"workgroups {wgs:.0f}, barriers {bars:.0f}, wave collectives {colls:.0f}, fiber switches {switches:.0f}")
    print(f"fiber switches per second (whole launch) {switches / kernel_s:,.0f}")
    ms, wgs, bars, colls, switches = re.findall(pattern, res.stderr)[-1]  # the timed switch-only launch
    sw_s = float(re.search(r"SWITCH (\S+)", res.stdout).group(1))
    print(f"switch-only kernel: {switches} switches ({bars} barriers, {colls} collectives) in {sw_s:.3f} s: "
          f"{int(switches) / sw_s:,.0f} switches per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
