#!/usr/bin/env bash
# Lab: time decode bench cases (CASES, default "11 1") on variants of the decode main loop, each a sed expression
# over op_sources/attention_fwd/sm90_decode/mainloop.h, or F's file (results are wrong on purpose: only the time matters). Each
# variant runs in a fresh process with a fresh cache; the base runs first and last. The file is restored at the end.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python
f=${F:-op_sources/attention_fwd/sm90_decode/mainloop.h}
cp "$f" /tmp/variant.orig
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
declare -A V=(
  [base]=''
  [no_blocks]='s/const int blocks = kStageKeys \/ 16 \/ role.groups;/const int blocks = 0;/'
  [no_pv]='s/^  accumulate<NB>(s, st, sm, slot, bl, role.ch, lane);/  st.o[0] += s[0];/'
  [fp8_no_nan]='s/^  if (!kFp16) {$/  if (false) {/'
  [fp8_no_expand]='s/^  return sm90::fma_bf16x2((x << 4) \& 0x87F087F0u, 0x7B807B80u, 0x80008000u);/  return x;/'
  [fp8_raw]='s/^  if (!kFp16) {$/  if (false) {/; s/^  return sm90::fma_bf16x2((x << 4) \& 0x87F087F0u, 0x7B807B80u, 0x80008000u);/  return x;/'
  [no_qk]='s/^  scores<NB>(s, qf, sm, slot, bl, role.rt, lane);/  for (int x = 0; x < 8 * NB; ++x) s[x] = 0.01f * (x + lane);/'
)
for name in base ${VARIANTS:-no_blocks no_pv no_qk} base; do
  cp /tmp/variant.orig "$f"
  [ -n "${V[$name]}" ] && sed -i "${V[$name]}" "$f"
  cmp -s "$f" /tmp/variant.orig && [ "$name" != base ] && { echo "$name: sed changed nothing"; continue; }
  for c in ${CASES:-11 1}; do
    echo -n "$name: "; RTCATTN_CACHE_DIR=$(mktemp -d) python3 .ci/lab/sm90_decode/one_case.py "$c" 5 2>&1 | tail -1
  done
done
cp /tmp/variant.orig "$f"
