#!/usr/bin/env bash
# Lab: A/B of sm90_decode ring plans on the device. Each argument is one plan table (the rows of kSm90DecodePlans in
# sm90_decode/params.h, e.g. "{32, 8}, {64, 6}, {96, 4}, {128, 3}, {160, 4}, {192, 4}, {256, 3}"); for each, the
# working copy's table is replaced, the host rebuilt, and the decode bench run (CASES env: --decode-cases, default
# all). The table is restored at the end.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python
f=op_sources/attention_fwd/sm90_decode/params.h
cp "$f" /tmp/decode-params.h.orig
for plans in "$@"; do
  python3 - "$f" "$plans" <<'X'
import re, sys
p, rows = sys.argv[1], sys.argv[2]
s = open("/tmp/decode-params.h.orig").read()
s = re.sub(r"(constexpr Sm90DecodePlan kSm90DecodePlans\[\] = \{)[^;]*(\};)",
           lambda m: m.group(1) + "\n    " + rows + ",\n" + m.group(2), s)
open(p, "w").write(s)
X
  echo "== plans: $plans"
  python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
  RTCATTN_CACHE_DIR=$(mktemp -d) python3 -m rtcattn bench --shapes decode ${CASES:+--decode-cases $CASES} 2>&1 |
    grep -E "^ +[0-9]+ " | cut -c1-100
done
cp /tmp/decode-params.h.orig "$f"
