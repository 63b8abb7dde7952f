#!/usr/bin/env bash
# Lab (GPU machine, one call): what the last sessions left to run on a GPU, most wanted first, each step time-boxed
# so that a 600 s call returns with the first ones done. WHAT picks a subset: transformers, overhead, cp, decode.
#   transformers: issue 26's GPU test and `bench --suite transformers` on this tree (the left-padded path's effect)
#   overhead:     the integration's per-call host and device time against SDPA (.ci/lab/transformers/overhead.py)
#   cp:           issue 27's one-GPU part: `bench --suite context_parallel --cp-compute-only` (128k, 256k)
#   decode:       the branch decode-warps only: its quantized decode GPU tests and the patches' A/B (decode_warps.sh)
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-/tmp/rtc-pending}
what=${WHAT:-"transformers overhead cp decode"}
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
for w in $what; do
  echo "== $w"
  case $w in
    transformers) timeout 300 bash .ci/device transformers 2>&1 | tail -24 ;;
    overhead) timeout 100 python3 .ci/lab/transformers/overhead.py 2>&1 | tail -40 ;;
    cp) timeout 120 python3 -m rtcattn bench --suite context_parallel --cp-compute-only --cp-lengths 131072,262144 \
          --reps 2 2>&1 | tail -7 ;;
    decode) if [ -f .ci/lab/session/decode_warps.sh ]; then timeout 400 bash .ci/lab/session/decode_warps.sh 2>&1 |
              tail -30; else echo "not on the decode-warps branch"; fi ;;
  esac
done
