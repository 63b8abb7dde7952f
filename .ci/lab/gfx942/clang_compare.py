"""The gfx942 kernels' warm-default variants built for gfx942 by both AMD compilers of the registry (clang: clang-19,
clang22: clang-22), side by side: VGPRs, AGPRs, SGPRs, scratch, LDS and the KV loop's instruction counts, and a summary
of what differs (docs/NOTES.md, "gfx950 as an arch"). Compiles into the user cache (about 60 s a kernel on 2 cores).

    python3 .ci/lab/gfx942/clang_compare.py [--kernel gfx942|gfx942_decode] [--all-rows]"""
import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))

from rtcattn.runtime import dispatch, manifest
from rtcattn.tools import coreport

NOTES = ("vgpr_count", "agpr_count", "sgpr_count", "private_segment_fixed_size", "group_segment_fixed_size")
LOOP = ("total", "mfma", "valu", "trans", "cndmask", "lds", "vmem", "s_waitcnt", "s_barrier")


def facts(kernel: str, compiler: str, v: tuple) -> dict:
    mode, mask, kv, d, dtype = v
    var = manifest.load().variant_for(coreport.OP, kernel, "gfx942", {"round_mode": mode, "mask": mask, "kv": kv,
                                                                      "head_dim": d, "dtype": dtype,
                                                                      "kv_dtype": "same", "score_mod": "plain",
                                                                      "dropout": "nodrop"})
    req = manifest.load().request(var, dispatch.package_version())
    res = dispatch.lib().build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                               compiler=compiler, package_version=req.package_version)
    notes, insts = coreport.analyse(res.code(), kernel, "gfx942")
    loop = coreport.count(coreport.kv_loop(insts))
    return {"id": res.compiler_id, **{k: notes[k] for k in NOTES}, **loop}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", default="gfx942", choices=coreport.KERNELS)
    p.add_argument("--all-rows", action="store_true", help="print every variant, not only those that differ")
    args = p.parse_args()
    vs = [v for v in coreport.variants("all", None, "all", args.kernel) if v[0] == "rtne"]  # the warm default
    with ThreadPoolExecutor(max_workers=2) as pool:
        a = list(pool.map(lambda v: facts(args.kernel, "clang", v), vs))
        b = list(pool.map(lambda v: facts(args.kernel, "clang22", v), vs))
    keys = NOTES + LOOP
    rows, same = [], 0
    for v, x, y in zip(vs, a, b):
        diff = [k for k in keys if x[k] != y[k]]
        same += not diff
        if diff or args.all_rows:
            rows.append((f"d{v[3]} {v[4]} {v[1]} {v[2]}", *(f"{x[k]}/{y[k]}" if x[k] != y[k] else x[k] for k in keys)))
    print(f"{args.kernel} on gfx942, {len(vs)} warm-default variants, {a[0]['id']}/{b[0]['id']} where they differ; "
          f"{same} identical in every column")
    short = ("vgpr", "agpr", "sgpr", "scratch", "lds", "loop", "mfma", "valu", "trans", "cndmask", "lds_ops", "vmem",
             "waitcnt", "barrier")
    if rows:
        coreport.table(rows, ("variant", *short))
    for k in keys:
        d = [y[k] - x[k] for x, y in zip(a, b)]
        print(f"{k:28s} clang22 - clang: min {min(d):+d} max {max(d):+d} sum {sum(d):+d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
