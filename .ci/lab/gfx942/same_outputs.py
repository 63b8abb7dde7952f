"""Lab: the gfx942 kernel's outputs on the emulator, bit for bit, from two trees (a change that must leave what a
call computes unchanged: the head-dim buckets kept D = 128's outputs).

Each tree runs the same fixed cases in its own process (its own package, build and cache): dense calls in both
layouts, the three round modes, the tail split off and forced, causal and sliding windows, GQA, special values,
packed and paged sequences, all at head dim 128 in bf16 on the emulated gfx942 and gfx90a; outputs and LSEs are
saved and compared bit for bit.

  python3 .ci/lab/gfx942/same_outputs.py BEFORE_TREE AFTER_TREE [--cache-dir DIR]
      (each tree built: python3 setup.py build_ext --inplace)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = r'''
import sys, torch
import numerics_suite as suite, varlen_suite as vs, gfx942_driver as drv
import rtcattn
from rtcattn.runtime import dispatch
out = {}
for arch in ("gfx942", "gfx90a"):
    for layout in ("bshd", "bhsd"):
        for mode in ("rtne", "rtna", "rtz"):
            for split in (0, 3):
                for i, (sq, sk, hk) in enumerate(((1, 17, None), (100, 385, 1), (385, 1000, None), (700, 130, 1))):
                    q, k, v = suite.make_qkv(layout, 1, 2, sq, sk, 128, "cpu", seed=7 + i, hk=hk)
                    for window in ((-1, -1), (-1, 0), (37, 5)):
                        o, lse = drv.forward(q, k, v, layout, mode, None, True, arch=arch, tail_split=split,
                                             window=window)
                        out[f"{arch} {layout} {mode} split={split} {sq}x{sk} hk={hk} {window}"] = (o, lse)
        q, k, v = suite._special_inputs(layout, "cpu", 20, 300, 128)
        out[f"{arch} {layout} special"] = drv.forward(q, k, v, layout, "rtne", None, True, arch=arch)
    b = vs.make_batch([0, 1, 17, 100, 385, 700], [5, 1, 64, 65, 130, 800], 4, 2, 128, "cpu", seed=3)
    with dispatch.pinned(kernel="gfx942"):
        import os
        os.environ["RTCATTN_EMULATE"] = arch
        for mode in ("rtne", "rtz"):
            for window in ((-1, -1), (-1, 0)):
                out[f"{arch} varlen {mode} {window}"] = vs.run(b, mode, window)
                out[f"{arch} paged {mode} {window}"] = vs.run(vs.to_paged(b, 32, seed=3), mode, window)
torch.save({k: tuple(t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32) for t in v)
            for k, v in out.items()}, sys.argv[1])
'''


def run_tree(tree: Path, out: Path, cache: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(tree / p) for p in ("python", "tests", "tests/emu"))
    env["RTCATTN_CACHE_DIR"] = str(cache)
    res = subprocess.run([sys.executable, "-c", CASES, str(out)], env=env, cwd=tree, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{tree}: the cases failed:\n{res.stderr[-4000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--cache-dir", type=Path, help="kernel caches go under it (default: a temporary dir)")
    args = p.parse_args(argv)
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        root = args.cache_dir or Path(tmp)
        results = []
        for name, tree in (("before", args.before), ("after", args.after)):
            path = Path(tmp) / f"{name}.pt"
            run_tree(tree.resolve(), path, root / name)
            results.append(torch.load(path))
    before, after = results
    if before.keys() != after.keys():
        raise SystemExit(f"different cases: {sorted(before.keys() ^ after.keys())}")
    differ = [k for k in before if any(not torch.equal(a, b) for a, b in zip(before[k], after[k]))]
    for k in differ:
        print(f"DIFFERENT {k}")
    print(f"{len(before) - len(differ)} of {len(before)} cases bit-identical (outputs and LSE)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
