#!/bin/bash
# One device call: ex2 probe, SASS checks, correctness of the defaults and of BLOCK_N=176, then all
# variants timed interleaved against cuDNN on the seed shapes. Full log under $OUT; table last.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp}
export OUT
log="$OUT/device.log"
status=0
run() { echo "== $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log" | grep -v "^ok " ; [ "${PIPESTATUS[0]}" = 0 ] || status=1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee -a "$log"
run python3 probe_ex2.py
run python3 dev_sm90.py sass
SM90_MODE=rtz run python3 dev_sm90.py sass
run python3 dev_sm90.py sass SM90_BLOCK_N=176
run python3 dev_sm90.py check
run python3 dev_sm90.py check SM90_BLOCK_N=176
CONFIGS=${CONFIGS:-"rtne:SM90_PIN_WAIT=0 rtne rtz:SM90_PIN_WAIT=0+SM90_RTZ_EXACT=1 rtz:SM90_RTZ_EXACT=1 rtz rtna:SM90_PIN_WAIT=0 rtna rtne:SM90_BLOCK_N=176"}
python3 dev_sm90.py bench ${SHAPES:-0,1,2,3,4,5,6,7,8} $CONFIGS > "$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log" >> "$log"
grep -v "^(" "$OUT/bench.log" | tail -40
echo "overall status $status"
exit $status
