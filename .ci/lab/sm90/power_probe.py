"""Clock and power while one implementation runs alone, back to back, on a seed shape (bshd): FA4 and the
given rtcattn configs, each for about SECONDS, with nvidia-smi sampled every 100 ms in the background.
Usage: power_probe.py SHAPE_INDEX SECONDS [config ...]"""
import subprocess
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import dev_sm90 as lab

B, H, S = lab.SEED_SHAPES[int(sys.argv[1])]
secs = float(sys.argv[2])
configs = sys.argv[3:] or ["rtne"]
q, k, v = lab.make(B, H, S, S, "bshd", torch.Generator(device="cuda").manual_seed(5))
out = torch.empty_like(q)
calls = [("fa4", lab.fa4_fn(q, k, v, "bshd"))] + [
    (c, (lambda m, d: lambda: lab.fwd(q, k, v, "bshd", m, d, out=out, lse=False))(*lab.parse_config(c)))
    for c in configs]
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "100"], stdout=subprocess.PIPE, text=True)
windows = []
flops = 4 * B * H * S * S * 128
for name, f in calls * 2:
    if f is None:
        continue
    f()
    torch.cuda.synchronize()
    t0 = time.time()
    n = 0
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    while time.time() - t0 < secs:
        f()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    b.record()
    torch.cuda.synchronize()
    ms = a.elapsed_time(b) / n
    windows.append((name, t0 + 0.3 * secs, time.time(), ms))
    time.sleep(1.0)
smi.terminate()
samples = []
for line in smi.stdout.read().splitlines():
    try:
        ts, clk, pw = [x.strip() for x in line.split(",")]
        t = time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1])
        samples.append((t, int(clk), float(pw)))
    except ValueError:
        pass
for name, t0, t1, ms in windows:
    s = [x for x in samples if t0 <= x[0] <= t1]
    clk = sorted(x[1] for x in s)
    pw = sorted(x[2] for x in s)
    print(f"{name:24s} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  SM clock median {clk[len(clk) // 2] if clk else 0}"
          f" MHz  power median {pw[len(pw) // 2] if pw else 0:.0f} W  ({len(s)} samples)")
