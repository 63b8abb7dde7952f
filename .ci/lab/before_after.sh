#!/usr/bin/env bash
# Lab: the product's bench for an older tree (a `git archive` tarball) and this one, alternated in one GPU
# session, so a refactor's speed can be compared within one run. Each bench reports ratios to cuDNN
# measured in its own interleaved rounds; compare those ratios between the trees.
# Usage: bash .ci/lab/before_after.sh BEFORE.tar [bench args...]
set -uo pipefail
cd "$(dirname "$0")/../.."
tar_file=$1; shift
before=$(mktemp -d)/before
mkdir -p "$before" && tar -xf "$tar_file" -C "$before"
(cd "$before" && python3 setup.py -q build_ext --inplace >/dev/null 2>&1) || { echo "before: build failed"; exit 1; }
python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || { echo "after: build failed"; exit 1; }
out=${OUT:-$(mktemp -d)}
for round in 1 2; do
  for side in before after; do
    dir=$PWD; [ "$side" = before ] && dir=$before
    echo "=== round $round: $side"
    PYTHONPATH=$dir/python RTCATTN_CACHE_DIR=$out/cache-$side python3 -m rtcattn bench --json "$out/bench-$side-$round.json" "$@" \
      2>&1 | grep -E "geomean|rtcattn|sdpa-cudnn" | tail -20
  done
done
