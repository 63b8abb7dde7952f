#!/usr/bin/env bash
# Lab: Nsight Compute on FA4 and rtcattn's sm90 kernel per head dim (DIMS, default "64 128"; CAUSAL 0/1): instruction
# mix (per opcode), pipes, issue slots, warp stalls, clocks left alone. Full text per case in $OUT/ncu-D-causal.txt.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python RTCATTN_CACHE_DIR=${RTCATTN_CACHE_DIR:-$(mktemp -d)}
out=${OUT:-$(mktemp -d)}
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
for d in ${DIMS:-64 128}; do
  for c in ${CAUSAL:-0}; do
    ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section InstructionStats --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --print-details all \
      python3 .ci/lab/sm90/ncu_headdim.py "$d" "$c" >"$out/ncu-$d-$c.txt" 2>&1
    grep -E "^  [a-z_]|Duration|Executed Ipc|Issue Slots|Issued Warp|No Eligible|Executed Instructions |Registers Per|Block Size|Grid Size" \
      "$out/ncu-$d-$c.txt" | head -60
  done
done
