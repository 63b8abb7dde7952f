#!/usr/bin/env bash
# Lab: A/B of sm90 tile plans on the device. Each argument is one plan table (the rows of kSm90Plans in
# sm90/params.h, e.g. "{64, 192, 2, 2}, {128, 128, 2, 2}, {192, 112, 2, 1}, {256, 64, 2, 1}"); for each, the
# working copy's table and the manifest's sm90 buckets are replaced, the host rebuilt, and headdim.py bench run on
# DIMS (env, default 64,128,192,256).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python
f=op_sources/attention_fwd/sm90/params.h
cp "$f" /tmp/params.h.orig
cp configs/ops.json /tmp/ops.json.orig
for plans in "$@"; do
  python3 - "$f" "$plans" <<'X'
import re, sys
p, rows = sys.argv[1], sys.argv[2]
s = open("/tmp/params.h.orig").read()
s = re.sub(r"(constexpr Sm90Plan kSm90Plans\[\] = \{)[^;]*(\};)", lambda m: m.group(1) + "\n    " + rows + ",\n" + m.group(2), s)
open(p, "w").write(s)
buckets = ", ".join(re.findall(r"\{(\d+),", rows))
m = open("/tmp/ops.json.orig").read()
i = m.index('"name": "sm90"')
j = m.index('"buckets": [', i)
k = m.index("]", j)
open("configs/ops.json", "w").write(m[:j] + '"buckets": [' + buckets + m[k:])
X
  echo "== plans: $plans"
  python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
  RTCATTN_CACHE_DIR=$(mktemp -d) python3 .ci/lab/sm90/headdim.py bench "${DIMS:-64,128,192,256}" "${DTYPES:-bf16}"
done
cp /tmp/params.h.orig "$f"
cp /tmp/ops.json.orig configs/ops.json
