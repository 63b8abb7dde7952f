#!/usr/bin/env bash
# Lab (GPU machine, one call, on the branch decode-warps): the transformers integration's per-call host and device
# time (overhead.py: rtcattn against SDPA, the kernels each runs), then main's sm90 decode kernel against the branch's
# on the bench's bf16 / FP8 / FP4 cases (base_vs_branch.sh, with base's errors shown).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-/tmp/rtc-next}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "== overhead"; timeout 100 python3 .ci/lab/transformers/overhead.py 2>&1 | grep -v "^\[rtcattn\]" | tail -60
echo "== transformers bench"; timeout 170 python3 -m rtcattn bench --suite transformers --reps 3 2>&1 | tail -9
echo "== decode"; [ -f .ci/lab/sm90_decode/occupancy.patch ] && timeout 290 bash .ci/lab/sm90_decode/base_vs_branch.sh 2>&1 | tail -30
