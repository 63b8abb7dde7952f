#!/usr/bin/env bash
# base (main's kernel) vs the branch's chain, with errors shown
set -uo pipefail
export PYTHONPATH=$PWD/python
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_sm90_decode_kvquant_gpu.py -x 2>&1 | tail -4
P=.ci/lab/sm90_decode
for p in k_vote nan_vote occupancy; do patch -s -R -p1 < $P/$p.patch; done
echo "== base case 12, full output"; RTCATTN_CACHE_DIR=/tmp/dwb timeout 120 python3 $P/one_case.py 12 5 2>&1 | tail -12; echo "rc $?"
for p in occupancy nan_vote k_vote; do patch -s -p1 < $P/$p.patch; done
for r in 1 2; do
  for p in k_vote nan_vote occupancy; do patch -s -R -p1 < $P/$p.patch; done
  for c in 1 12 13 15 16; do echo -n "base $c: "; RTCATTN_CACHE_DIR=/tmp/dwb timeout 60 python3 $P/one_case.py $c 5 2>&1 | tail -1; done
  for p in occupancy nan_vote k_vote; do patch -s -p1 < $P/$p.patch; done
  for c in 1 12 13 15 16; do echo -n "branch $c: "; RTCATTN_CACHE_DIR=/tmp/dwk timeout 60 python3 $P/one_case.py $c 5 2>&1 | tail -1; done
done
