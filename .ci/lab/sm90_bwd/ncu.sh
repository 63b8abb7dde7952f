#!/usr/bin/env bash
# Lab: Nsight Compute on the sm_90a backward's DKDV launch (D, causal from D / CAUSAL; default 128, full) at
# (2, Hq, 8192): one profiled launch with the full set and source counters; the report, the details page and the
# SASS page (stall samples per instruction) go to $OUT. A few lines are printed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-$(mktemp -d)}
out=${OUT:-$(mktemp -d)}
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
cat >/tmp/one_bwd.py <<'X'
import os, torch, rtcattn
d = int(os.environ.get("D", "128")); causal = os.environ.get("CAUSAL", "0") == "1"
h = {64: 32, 128: 24, 256: 8}.get(d, 16)
q, k, v = (torch.randn(2, 8192, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
o = rtcattn.flash_attn_func(q, k, v, causal=causal, deterministic=os.environ.get("DET", "0") == "1")
do = torch.randn_like(o)
for _ in range(2):
    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
X
python3 /tmp/one_bwd.py || exit 1
ncu --clock-control none -k regex:attention_bwd_sm90 --launch-skip ${SKIP:-4} --launch-count 1 --set full \
  --import-source no -o "$out/bwd" -f python3 /tmp/one_bwd.py >"$out/ncu.log" 2>&1 || { tail -20 "$out/ncu.log"; exit 1; }
ncu -i "$out/bwd.ncu-rep" --csv --page details >"$out/details.csv" 2>&1
ncu -i "$out/bwd.ncu-rep" --csv --page source --print-source sass >"$out/sass.csv" 2>"$out/sass.err" || tail -5 "$out/sass.err"
python3 - "$out/details.csv" <<'X'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr, rows = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(hdr)}
for r in rows:
    name, unit, val = r[ix["Metric Name"]], r[ix["Metric Unit"]], r[ix["Metric Value"]]
    if any(w in name for w in ("Duration", "Throughput", "Registers", "Issued Warp", "Stall", "Pipe", "Tensor",
                               "Executed Ipc", "Warp Cycles", "Shared Memory", "L2 Hit", "Bank")):
        print(f"  {name[:80]:80s} {val} {unit}")
X
ls -la "$out"
