#!/usr/bin/env bash
# Lab: the working tree against other trees (`git archive` tarballs of the tree with a change undone, e.g. where
# host and kernel change together, so a -D switch cannot stand in for it), `headdim.py bench` on each in turn, in
# the same machine session, alternating ROUNDS times. Each tree builds its own runtime and uses its own
# code-object cache; a tarball's rows are labelled with its file name.
# Usage: ab_tree.sh D,... bf16,fp16 ROUNDS A.tgz [B.tgz ...]
set -uo pipefail
cd "$(dirname "$0")/../../.."
dims=$1 dts=$2 rounds=$3; shift 3
here=$PWD
[ -f python/rtcattn/librtcattn_jit.so ] || python3 setup.py -q build_ext --inplace >/dev/null 2>&1
declare -A tree cache
tree[work]=$here; cache[work]=$(mktemp -d); names=(work)
for t in "$@"; do
  n=$(basename "$t" .tgz); d=$(mktemp -d)
  tar xzf "$t" -C "$d"
  (cd "$d" && python3 setup.py -q build_ext --inplace >/dev/null 2>&1) || { echo "$n: build failed"; exit 1; }
  tree[$n]=$d; cache[$n]=$(mktemp -d); names+=("$n")
done
for r in $(seq "$rounds"); do
  for n in "${names[@]}"; do
    echo "== round $r: $n"
    (cd "${tree[$n]}" && PYTHONPATH=${tree[$n]}/python RTCATTN_CACHE_DIR=${cache[$n]} \
      python3 "$here/.ci/lab/sm90/headdim.py" bench "$dims" "$dts" 2>&1 | grep -v -i warn)
  done
done
