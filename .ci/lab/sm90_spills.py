"""Lab: build sm_90a variants side by side and print each one's ptxas spill report (a CPU-only sweep; run where there
are cores). Usage: sm90_spills.py OP KERNEL key=v1,v2 ... (every combination of the values; the rest at defaults)."""
import concurrent.futures as cf
import itertools
import re
import sys
import tempfile

from rtcattn.runtime import _lib, dispatch, manifest

op, kernel = sys.argv[1:3]
base = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16", "score_mod": "plain",
        "dropout": "nodrop", "kv_dtype": "same"}
axes = [(k, [int(x) if x.isdigit() else x for x in v.split(",")]) for k, v in (a.split("=") for a in sys.argv[3:])]
m = manifest.load()
cache = tempfile.mkdtemp()


def one(vals):
    call = {**base, **dict(zip([k for k, _ in axes], vals))}
    req = m.request(m.variant_for(op, kernel, "sm_90a", call), dispatch.package_version())
    res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                     compiler="nvrtc", package_version=req.package_version, cache_dir=cache)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", res.log())
    spill = sum(int(s) + int(ld) for _, s, ld in frames)
    return res.cache_name.split("-sm_90a")[0], spill, bool(re.search(r"C75\d\d", res.log()))


with cf.ThreadPoolExecutor(16) as ex:
    for name, spill, ser in ex.map(one, itertools.product(*[v for _, v in axes])):
        print(f"{name:80s} spill {spill:4d}{'  C75xx' if ser else ''}")
