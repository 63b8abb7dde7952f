#!/bin/bash
# One device call comparing the two ways of timing the product: `rtcattn bench` in both layouts vs the lab's
# interleaved rounds (dev_sm90.py bench, CONFIGS default rtne) with and without a GPU lead (cuDNN-first bias);
# plus build, GPU tests, host time per call. Tables last.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp}
export OUT PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 RTCATTN_CACHE_DIR=$(mktemp -d)
T0=$SECONDS
stamp() { echo "[$((SECONDS - T0)) s] $*" >> "$OUT/steps.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
stamp build
timeout 150 python3 -m pytest -q -m gpu tests/gpu > "$OUT/pytest.txt" 2>&1; stamp "pytest rc $?"
timeout 200 python3 -m rtcattn bench --layout bshd,bhsd --json "$OUT/bench.json" > "$OUT/bench.txt" 2> "$OUT/bench.err"
stamp "bench rc $?"
# HOST_PKG_DIR: another copy of python/ (e.g. an older one) whose host time per call is printed too.
H=${HOST_PKG_DIR:-}
lab=.ci/lab/sm90
for run in bhsd:0 bhsd:1 bshd:1; do
  DEV_FLASH=0 DEV_LAYOUT=${run%:*} DEV_LEAD=${run#*:} timeout 90 python3 $lab/dev_sm90.py bench 0,1,2,3,4,5 \
    ${CONFIGS:-rtne} > "$OUT/lab_${run%:*}_lead${run#*:}.log" 2>&1
  stamp "lab $run rc $?"
done
timeout 60 python3 $lab/host_overhead.py > "$OUT/host_new.txt" 2>&1
[ -n "$H" ] && timeout 60 python3 $lab/host_overhead.py "$H" > "$OUT/host_other.txt" 2>&1
stamp host
cd "$OUT"
cat steps.txt smi.txt; echo "== host (this tree)"; cat host_new.txt; echo "== host ($H)"; cat host_other.txt 2>/dev/null
for f in lab_*.log; do echo "== $f"; grep -v "^(" "$f" | tail -12; done
echo "== pytest"; tail -4 pytest.txt
echo "== bench"; tail -4 bench.err; cat bench.txt
