#!/usr/bin/env bash
# Lab (GPU machine, one call, on the branch decode-warps), each step time-boxed, most wanted first: the transformers
# bench (FA4's transformers path too when flash_attn.cute is installed: shared tools' fa4-peer.sh), main's sm90 decode
# kernel against the branch's with the quantized decode GPU tests (base_vs_branch.sh), then the integration's per-call
# host and device time (overhead.py: rtcattn against SDPA, the kernels each runs).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-/tmp/rtc-next}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "== transformers bench"; timeout 160 python3 -m rtcattn bench --suite transformers --reps 3 2>&1 | tail -9
echo "== decode"; [ -f .ci/lab/sm90_decode/occupancy.patch ] && timeout 270 bash .ci/lab/sm90_decode/base_vs_branch.sh 2>&1 | tail -25
echo "== overhead"; timeout ${OVERHEAD_S:-100} python3 .ci/lab/transformers/overhead.py 2>&1 | grep -v "^\[rtcattn\]" | tail -45
