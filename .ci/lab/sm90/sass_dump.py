"""Lab: the SASS of one sm90 forward variant (cuobjdump -sass), for reading the steady loop.
Usage: sass_dump.py OUT_FILE [key=value ...] (head_dim, mask, kv, dtype, round_mode; default the open d128 bf16)."""
import os
import shutil
import subprocess
import sys
import tempfile

from rtcattn.runtime import _lib, dispatch, manifest

call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16", "kv_dtype": "same",
        "score_mod": "plain", "dropout": "nodrop"}
for kv in sys.argv[2:]:
    k, v = kv.split("=")
    call[k] = int(v) if v.isdigit() else v
m = manifest.load()
req = m.request(m.variant_for("attention_fwd", "sm90", "sm_90a", call), dispatch.package_version())
d = tempfile.mkdtemp()
res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                 compiler="nvrtc", package_version=req.package_version, cache_dir=d)
code = res.code()
elf = os.path.join(d, "k.cubin")
open(elf, "wb").write(code[code.find(b"\x7fELF"):])
tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
open(sys.argv[1], "w").write(subprocess.run([tool, "-sass", elf], capture_output=True, text=True, check=True).stdout)
print("wrote", sys.argv[1], res.cache_name)
