#!/bin/bash
# One device call (after the FA4 peer is installed: ../shared tools' fa4-peer.sh, call 2) that puts the sm90
# kernel next to FlashAttention-4: Nsight Compute on one launch of each (shape PROF_SHAPE, --set full,
# clocks left alone), FA4's PTX and cubin (CuTe DSL's KEEP), then dev_sm90.py's interleaved bench with an FA4
# column for CONFIGS on SHAPES. Everything lands under $OUT; the bench table comes last.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp}
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-$(mktemp -d)}
export DEV_LEAD=${DEV_LEAD:-1} DEV_LAYOUT=${DEV_LAYOUT:-bshd} DEV_FLASH=${DEV_FLASH:-0}
lab=.ci/lab/sm90
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
if [ -n "${PROF_SHAPE:-}" ]; then
  mkdir -p "$OUT/fa4dump"
  n=$(( 1 + $(echo ${PROF_CONFIGS:-rtne} | wc -w) ))
  CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR="$OUT/fa4dump" timeout 300 ncu --clock-control none --set full \
    --import-source no -k 'regex:attention_fwd_sm90|[Ff]lash' --launch-skip $n --launch-count $n -o "$OUT/prof" \
    python3 $lab/peer_profile.py "$PROF_SHAPE" ${PROF_CONFIGS:-rtne} > "$OUT/ncu.log" 2>&1
  echo "ncu exit $?"; tail -5 "$OUT/ncu.log"
  ncu -i "$OUT/prof.ncu-rep" --page details > "$OUT/details.txt" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
  ls -la "$OUT" "$OUT/fa4dump" | head -30
  grep -E "^  [a-zA-Z_]|Duration|SM Frequency|Compute \(SM\) Throughput|Registers Per|Executed Ipc A" "$OUT/details.txt" | head -40
fi
for defs in ${CHECK:-}; do   # correctness of define sets ("-" = none) through dev_sm90.py check
  d=$([ "$defs" = "-" ] || echo "$defs" | tr '+' ' ')
  timeout 300 python3 $lab/dev_sm90.py check $d > "$OUT/check-$defs.log" 2>&1; echo "check $defs: exit $? ($(grep -c '^ok' "$OUT/check-$defs.log") ok, $(grep -c '^BAD' "$OUT/check-$defs.log") bad)"
done
if [ -n "${TESTS:-}" ]; then
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -x -m gpu $TESTS > "$OUT/tests.log" 2>&1; echo "tests exit $?"; tail -3 "$OUT/tests.log"
fi
if [ -n "${SHAPES:-}" ]; then
  timeout ${BENCH_TIMEOUT:-400} python3 $lab/dev_sm90.py bench "$SHAPES" ${CONFIGS:-rtne rtna rtz} > "$OUT/bench.log" 2>&1
  echo "bench exit $?"
  grep -v "^(" "$OUT/bench.log" | tail -30
fi
