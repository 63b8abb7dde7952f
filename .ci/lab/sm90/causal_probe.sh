#!/usr/bin/env bash
# Lab: where the causal call's extra time goes (issue 21). Times the causal row of tile_cost.py on the working tree,
# then on variants of the kernel source made by sed (timing probes: "nomask" skips the cut block's mask and gives
# wrong numerics), restoring the source after each. Usage: causal_probe.sh [D,...] [variant ...]
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python
dims=${1:-128,256}; shift || true
m=op_sources/attention_fwd/sm90/mask.h
l=op_sources/attention_fwd/sm90/mainloop.h
cp $m /tmp/mask.h.orig; cp $l /tmp/mainloop.h.orig
d=op_sources/attention_fwd/sm90
for f in $d/*.h; do cp $f /tmp/$(basename $f).orig; done
for v in base "$@"; do
  case $v in
    base) ;;
    nomask) sed -i 's/if (wm.cuts(n)) mask_window(r.s, wm.rows, n \* kN);/(void)0;/' $l ;;
    old=*) cp "${v#old=}"/*.h $d/ ;;  # the sm90/ headers of a directory (e.g. the previous commit's)
    hionly) sed -i 's/if (col < w.lo\[i\] || col > w.hi\[i\])/if (col > w.hi[i])/' $m ;;
    *) echo "unknown variant $v"; continue ;;
  esac
  echo "== $v"
  RTCATTN_CACHE_DIR=$(mktemp -d) python3 .ci/lab/sm90/tile_cost.py "$dims" ${MODE:-causal} 2>&1 | grep -v -i warn | grep -v generate_mlir
  cp /tmp/mask.h.orig $m; cp /tmp/mainloop.h.orig $l
  for f in $d/*.h; do cp /tmp/$(basename $f).orig $f; done
done
