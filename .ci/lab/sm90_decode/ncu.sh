#!/usr/bin/env bash
# Lab: Nsight Compute on the decode kernel for bench cases (default 11 1): timing first, then one profiled launch of
# the attention stage per case (throughput, memory, warp stalls, occupancy; clocks left alone). The full details go to
# $OUT/ncu-<case>.csv; a few lines are printed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-$(mktemp -d)}
out=${OUT:-$(mktemp -d)}
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
for c in ${CASES:-11 1}; do
  python3 .ci/lab/sm90_decode/one_case.py "$c" 5
  env NOTIME=1 ncu --clock-control none -k regex:${KERNEL:-sm90_decode} --launch-skip ${SKIP:-4} --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' ${NCU_EXTRA:-} \
    --csv --page details python3 .ci/lab/sm90_decode/one_case.py "$c" 6 ${IMPL:-} >"$out/ncu-$c.csv" 2>&1
  python3 - "$out/ncu-$c.csv" <<'X'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr, rows = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(hdr)}
want = ("Duration", "DRAM Throughput", "Memory Throughput", "Registers Per Thread", "Achieved Active Warps Per SM",
        "Issued Warp Per Scheduler", "Grid Size", "Dynamic Shared Memory Per Block", "L2 Hit Rate")
for r in rows:
    name, unit, val = r[ix["Metric Name"]], r[ix["Metric Unit"]], r[ix["Metric Value"]]
    if name in want or ("issue_stalled" in name and float(val.replace(",", "") or 0) > 0.1):
        print(f"  {name[:80]:80s} {val} {unit}")
X
done
