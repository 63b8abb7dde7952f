"""Lab: the ptxas report of one sm_90a variant per function (stack frame, spills, registers).
Usage: sm90_spill_log.py OP KERNEL key=v ..."""
import re
import sys
import tempfile

from rtcattn.runtime import _lib, dispatch, manifest

op, kernel = sys.argv[1:3]
call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16", "score_mod": "plain",
        "dropout": "nodrop", "kv_dtype": "same"}
call.update({k: int(v) if v.isdigit() else v for k, v in (a.split("=") for a in sys.argv[3:])})
m = manifest.load()
req = m.request(m.variant_for(op, kernel, "sm_90a", call), dispatch.package_version())
res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                 compiler="nvrtc", package_version=req.package_version, cache_dir=tempfile.mkdtemp())
print(res.cache_name)
for line in res.log().splitlines():
    if re.search(r"Function properties|Compiling|spill|registers|C75", line):
        print("  ", line.strip()[:150])
