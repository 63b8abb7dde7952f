#!/usr/bin/env bash
# Lab (GPU machine, on the branch decode-warps): main's sm90 decode kernel (the branch's patches reversed) against the
# branch's, on the bench's cases, ABAB. Each state is its own copy of the tree with its own build of the extension:
# the runtime's launch plan (sm90_decode/params.h) is compiled into the extension, so a kernel text patched after the
# build would launch with the other state's plan. The quantized decode GPU tests run on the branch's tree first.
set -uo pipefail
cd "$(dirname "$0")/../../.."
P=.ci/lab/sm90_decode
base=/tmp/decode-base
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
rm -rf $base && mkdir -p $base && cp -a . $base/  # built: the base's build recompiles what its patches touch
(cd $base && for p in k_vote nan_vote occupancy; do patch -s -R -p1 < $P/$p.patch || exit 1; done) || { echo "patch -R failed"; exit 1; }
(cd $base && python3 setup.py -q build_ext --inplace >/tmp/build-base.log 2>&1) || { tail -30 /tmp/build-base.log; exit 1; }
PYTHONPATH=$PWD/python timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_sm90_decode_kvquant_gpu.py -x 2>&1 | tail -4
run() {  # run TREE NAME CASE
  echo -n "$2 $3: "; (cd "$1" && PYTHONPATH=$1/python RTCATTN_CACHE_DIR=/tmp/dw-$2 timeout 60 \
    python3 $P/one_case.py "$3" 5 2>&1 | tail -1)
}
for r in 1 2; do
  for c in ${CASES:-1 12 13 15 16}; do run $base base $c; done
  for c in ${CASES:-1 12 13 15 16}; do run $PWD branch $c; done
done
