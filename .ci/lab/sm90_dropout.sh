#!/usr/bin/env bash
# Lab run on an H200 (issue 25, dropout on sm_90a): build, warm the variants the dropout tests and the score-mod bench
# take (16 compiles at a time), the dropout GPU tests, then the score-mod bench (dropout against plain, same rounds).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
export PYTHONPATH=$PWD/python:$PWD/tests RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-$(mktemp -d)} PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py -q build_ext --inplace >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
w="python3 -m rtcattn warm --all --arch sm_90a --kernels sm90 --round-mode rtne --kv-dtype same --jobs 16"
$w --dtype bf16 --head-dim 64,128,256 --kv dense >"$out/warm.log" 2>&1
$w --dropout dropout --score-mod plain --kv dense,varlen >>"$out/warm.log" 2>&1
echo "warm: $((SECONDS - t0)) s; $(grep -c . "$out/warm.log") lines"; tail -2 "$out/warm.log"
timeout ${TEST_S:-240} python3 -m pytest -q -ra -m gpu tests/gpu/test_dropout_gpu.py "${@}" 2>&1 | tee "$out/tests.log" | tail -25
echo "tests: $((SECONDS - t0)) s"
timeout ${BENCH_S:-150} python3 -m rtcattn bench --shapes scoremod --reps 8 --budget-s 1.5 --json "$out/scoremod.json" 2>&1 |
  tee "$out/scoremod.txt" | tail -34
echo "total: $((SECONDS - t0)) s"
