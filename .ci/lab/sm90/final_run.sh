#!/bin/bash
# Device call closing the gap study: build, GPU tests, host time per call (this tree, optionally another), product bench in the default layout with more rounds. Tables last; few files under $OUT.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp}
export OUT PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 RTCATTN_CACHE_DIR=$(mktemp -d)
log="$OUT/log.txt"
python3 setup.py -q build_ext --inplace > "$log" 2>&1 || { tail -30 "$log"; exit 1; }
timeout 150 python3 -m pytest -q -m gpu tests/gpu > "$OUT/pytest.txt" 2>&1; echo "pytest rc $?" >> "$OUT/pytest.txt"
# HOST_PKG_DIR: another copy of python/ (e.g. an older one) whose host time per call is printed too.
H=${HOST_PKG_DIR:-}
lab=.ci/lab/sm90
{ echo "== host, this tree"; timeout 60 python3 $lab/host_overhead.py;
  [ -n "$H" ] && { echo "== host, $H"; timeout 60 python3 $lab/host_overhead.py "$H"; }; } > "$OUT/host.txt" 2>&1
timeout 200 python3 -m rtcattn bench --reps 15 --budget-s 15 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>> "$log"
echo "bench rc $?" >> "$OUT/bench.txt"
cat "$OUT/host.txt"; tail -3 "$OUT/pytest.txt"; cat "$OUT/bench.txt"
