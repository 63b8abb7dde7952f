#!/usr/bin/env bash
# Lab: A/B of a kernel-source patch on the backward, in the same session: the tree with PATCH applied (as it travels)
# against the tree without it, ABAB, `probe.py REPS DIMS` each (kernel sources compile at the call, so each side has
# its own cache dir and the library is built once).
# Usage (on the GPU machine, the patch applied in the tree): bash .ci/lab/sm90_bwd/ab_patch.sh PATCH [DIMS] [REPS]
set -uo pipefail
cd "$(dirname "$0")/../../.."
patch_file=$1; dims=${2:-64,128}; reps=${3:-20}
export PYTHONPATH=$PWD/python
python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || { echo "build failed"; exit 1; }
for r in 1 2; do
  RTCATTN_CACHE_DIR=/tmp/ab-patch-B python3 .ci/lab/sm90_bwd/probe.py "$reps" "$dims" 2>&1 | grep "^D" | sed 's/^/patch /'
  patch -s -R -p1 <"$patch_file"
  RTCATTN_CACHE_DIR=/tmp/ab-patch-A python3 .ci/lab/sm90_bwd/probe.py "$reps" "$dims" 2>&1 | grep "^D" | sed 's/^/base  /'
  patch -s -p1 <"$patch_file"
done
