#!/bin/bash
# One device call for A/B work on the sm_90a kernel, all through the product (dev_sm90.py: rtcattn.forward with
# the sm90 kernel pinned, extra defines as compile options): builds rtcattn, then the SASS checks and
# correctness of each define set, then all CONFIGS timed interleaved against cuDNN on the seed shapes, with SM
# clock and power sampled alongside. Full log under $OUT; table last.
#   VARIANTS  define sets to check ("-" = none), e.g. "- LAB_X=1 LAB_X=1+LAB_Y=2": switches you added to a
#             working copy of op_sources/attention_fwd/sm90.cu or its role headers, sm90/ (the committed kernel
#             has none)
#   CONFIGS   bench configs ('mode' or 'mode:DEF=1+DEF=2'); SHAPES: seed shape indices
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp}
export OUT PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-$(mktemp -d)}
export DEV_LEAD=${DEV_LEAD:-1} DEV_LAYOUT=${DEV_LAYOUT:-bshd} DEV_FLASH=${DEV_FLASH:-0}
lab=.ci/lab/sm90/dev_sm90.py
log="$OUT/device.log"
status=0
run() { echo "== $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log" | grep -v "^ok " ; [ "${PIPESTATUS[0]}" = 0 ] || status=1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv | tee -a "$log"
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for v in ${VARIANTS:--}; do
  defs=$([ "$v" = "-" ] || echo "$v" | tr '+' ' ')
  run python3 $lab sass $defs
  run python3 $lab check $defs
done
CONFIGS=${CONFIGS:-"rtne rtna rtz"}
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 > "$OUT/smi.csv" &
smi=$!
python3 $lab bench ${SHAPES:-0,1,2,3,4,5,6,7,8} $CONFIGS > "$OUT/bench.log" 2>&1 || status=1
kill $smi
cat "$OUT/bench.log" >> "$log"
python3 - "$OUT/smi.csv" <<'PY'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") == 3]
busy = [(int(r[1].split()[0]), float(r[2].split()[0])) for r in rows if float(r[2].split()[0]) > 300]
if busy:
    c = sorted(x[0] for x in busy); p = sorted(x[1] for x in busy)
    print(f"under load ({len(busy)} samples > 300 W): SM clock median {c[len(c)//2]} MHz (min {c[0]}, max {c[-1]}), power median {p[len(p)//2]:.0f} W (max {p[-1]:.0f})")
PY
grep -v "^(" "$OUT/bench.log" | tail -40
echo "overall status $status"
exit $status
