"""Lab: the sha256 of every code object a tree compiles, keyed by variant, to show that a change to the
manifest or the kernel text leaves the compiled code as it was.

Keys are `<op>-<variant>-<arch>-<compiler>` with the variant's layout value left out (the retired `layout`
axis: bshd and bhsd compiled the same text) and without the cache key's hash (it covers the variant name,
the defines and the kernel text, which such a change edits on purpose). Values are the sha256 of the code
object itself: the blob of the cache entry, not the entry's header (which holds the key text). A key whose
layout variants differ maps to {layout: sha256} instead, and is reported. `--drop-part V` leaves the name part V
out of the keys too, so that variants of a tree without an axis line up with one value of the axis in a tree that
has it (e.g. `--drop-part bf16` after the dtype axis came: the bf16 variants then match the old names, and the
other dtypes' variants keep their part and show as keys only in that tree).

  python3 .ci/lab/co_hashes.py warm --cache-dir EMPTY_DIR --arch gfx942,gfx90a,sm_90a --jobs 2 --out A.json
      runs `python3 -m rtcattn warm --all` of this tree (timed), then hashes what it wrote
  python3 .ci/lab/co_hashes.py hash DIR [DIR ...] --out A.json [--exclude-arch ARCH,...] [--drop-part V,...]
  python3 .ci/lab/co_hashes.py compare BEFORE.json AFTER.json
      keys only in one file, keys whose hashes differ, and keys whose layout variants differ in either file
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The values of the retired layout axis: left out of the keys, so variants of both trees line up.
LAYOUTS = ("bshd", "bhsd")
MAGIC = b"RTCATTN-CODE-OBJECT 1\n"


def read_entry(path: Path) -> tuple[dict, bytes]:
    """(key fields, code object) of one cache entry; fields: op, variant, arch, compiler_id, options."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path}: not a cache entry (no {MAGIC!r})")
    pos, head = len(MAGIC), {}
    for field in ("blob-sha256", "blob-size", "key-size"):
        end = data.index(b"\n", pos)
        name, _, value = data[pos:end].decode().partition(" ")
        if name != field:
            raise ValueError(f"{path}: expected {field}, found {name!r}")
        head[field], pos = value, end + 1
    key_size, blob_size = int(head["key-size"]), int(head["blob-size"])
    key_text, blob = data[pos:pos + key_size].decode(), data[pos + key_size:]
    if len(blob) != blob_size or hashlib.sha256(blob).hexdigest() != head["blob-sha256"]:
        raise ValueError(f"{path}: blob size or checksum does not match its header")
    fields: dict = {"options": []}
    for line in key_text.splitlines():
        name, _, value = line.partition("=")
        if name == "option":
            fields["options"].append(value)
        else:
            fields[name] = value
    return fields, blob


def split_layout(variant: str, drop_parts=()) -> tuple[str, str | None]:
    """(variant name without its layout part and the drop_parts, the layout or None)."""
    parts = [p for p in variant.split("-") if p not in drop_parts]
    layouts = [p for p in parts if p in LAYOUTS]
    if len(layouts) > 1:
        raise ValueError(f"variant {variant!r} names more than one layout")
    return "-".join(p for p in parts if p not in LAYOUTS), (layouts[0] if layouts else None)


def collect(dirs: list, exclude_archs=(), drop_parts=()) -> tuple[dict, list]:
    """{key: {layout or "": sha256}} of every entry under dirs, and the problems found (duplicates)."""
    per_key: dict = {}
    problems = []
    for d in dirs:
        for path in sorted(Path(d).glob("*.co")):
            fields, blob = read_entry(path)
            if fields["arch"] in exclude_archs:
                continue
            rest, layout = split_layout(fields["variant"], drop_parts)
            key = f"{fields['op']}-{rest}-{fields['arch']}-{fields['compiler_id']}"
            slot = per_key.setdefault(key, {})
            if (layout or "") in slot:
                problems.append(f"{key}: two entries for layout {layout or '(none)'} (stale files in {d}?)")
            slot[layout or ""] = hashlib.sha256(blob).hexdigest()
    return per_key, problems


def flatten(per_key: dict) -> tuple[dict, list]:
    """{key: sha256 or {layout: sha256}}, and the keys whose layout variants are not byte-identical."""
    out, differ = {}, []
    for key, by_layout in sorted(per_key.items()):
        shas = set(by_layout.values())
        if len(shas) == 1:
            out[key] = shas.pop()
        else:
            out[key] = dict(sorted(by_layout.items()))
            differ.append(key)
    return out, differ


def layout_report(per_key: dict) -> list:
    """Lines about keys built for only some layouts (a tree with the axis builds each variant per layout)."""
    seen = {lay for v in per_key.values() for lay in v}
    if not seen - {""}:
        return []
    return [f"{k}: built for {sorted(v)} only" for k, v in sorted(per_key.items()) if set(v) != set(LAYOUTS)]


def write_hashes(dirs: list, out: Path, exclude_archs=(), drop_parts=()) -> int:
    per_key, problems = collect(dirs, exclude_archs, drop_parts)
    flat, differ = flatten(per_key)
    problems += layout_report(per_key)
    n_files = sum(len(v) for v in per_key.values())
    out.write_text(json.dumps(flat, indent=1, sort_keys=True) + "\n")
    print(f"{n_files} code objects, {len(flat)} keys -> {out}")
    if exclude_archs:
        print(f"left out archs: {', '.join(exclude_archs)}")
    if drop_parts:
        print(f"left out of the keys: variant name parts {', '.join(drop_parts)}")
    by_arch: dict = {}
    for key in flat:
        by_arch[_arch_of(key)] = by_arch.get(_arch_of(key), 0) + 1
    print("keys per arch: " + ", ".join(f"{a} {n}" for a, n in sorted(by_arch.items())))
    if any(len(v) > 1 for v in per_key.values()):
        print(f"layout variants byte-identical: {len(flat) - len(differ)} of {len(flat)} keys")
    for key in differ:
        print(f"LAYOUTS DIFFER {key}: {flat[key]}")
    for p in problems:
        print(f"PROBLEM {p}")
    return 1 if differ or problems else 0


def _arch_of(key: str) -> str:
    """The arch of a key: the field before the compiler id, with the '-emu' of an emulated arch."""
    parts = key.split("-")
    return "-".join(parts[-3:-1]) if parts[-2] == "emu" else parts[-2]


def cmd_warm(args) -> int:
    cache = Path(args.cache_dir)
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"--cache-dir {cache} is not empty; give an empty or new dir")
    cmd = [sys.executable, "-m", "rtcattn", "warm", "--all", "--arch", args.arch, "--jobs", str(args.jobs),
           "--cache-dir", str(cache)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print(f"tree {ROOT} at {rev or '?'}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = run.stdout.splitlines()
    print("\n".join([ln for ln in lines if ln.startswith("rtcattn warm:")] + lines[-1:]))
    print(f"warm exit {run.returncode}, wall {wall:.1f} s")
    if run.returncode != 0:
        print(run.stderr[-4000:], file=sys.stderr)
        return run.returncode
    return write_hashes([cache], Path(args.out), _csv(args.exclude_arch), _csv(args.drop_part))


def cmd_hash(args) -> int:
    return write_hashes(args.dirs, Path(args.out), _csv(args.exclude_arch), _csv(args.drop_part))


def cmd_compare(args) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (args.before, args.after))
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    common = sorted(set(a) & set(b))
    differ = [k for k in common if a[k] != b[k]]
    split = [(name, k) for name, side in (("before", a), ("after", b)) for k in sorted(side)
             if isinstance(side[k], dict)]
    print(f"{args.before}: {len(a)} keys; {args.after}: {len(b)} keys; {len(common)} in both")
    for k in only_a:
        print(f"only in {args.before}: {k}")
    for k in only_b:
        print(f"only in {args.after}: {k}")
    for name, k in split:
        print(f"layout variants differ in {name}: {k}")
    for k in differ:
        print(f"DIFFERENT {k}: {a[k]} -> {b[k]}")
    print(f"{len(common) - len(differ)} of {len(common)} common keys have identical code objects; "
          f"{len(only_a)} only before, {len(only_b)} only after")
    return 1 if only_a or only_b or differ or split else 0


DROP_HELP = ("variant name parts to leave out of the keys (comma-separated), e.g. bf16: an axis value that a tree "
             "before the axis had no part for")


def _csv(text) -> list:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("warm", help="warm this tree's variants into an empty dir, then hash them")
    w.add_argument("--cache-dir", required=True)
    w.add_argument("--arch", required=True, help="comma-separated, as for `python3 -m rtcattn warm`")
    w.add_argument("--jobs", type=int, default=1)
    w.add_argument("--out", required=True, help="the JSON to write")
    w.add_argument("--exclude-arch", help="archs to leave out of the JSON (comma-separated)")
    w.add_argument("--drop-part", help=DROP_HELP)
    w.set_defaults(func=cmd_warm)
    h = sub.add_parser("hash", help="hash the code objects of warmed cache dirs")
    h.add_argument("dirs", nargs="+")
    h.add_argument("--out", required=True)
    h.add_argument("--exclude-arch", help="archs to leave out of the JSON (comma-separated)")
    h.add_argument("--drop-part", help=DROP_HELP)
    h.set_defaults(func=cmd_hash)
    c = sub.add_parser("compare", help="compare two JSONs of this tool")
    c.add_argument("before")
    c.add_argument("after")
    c.set_defaults(func=cmd_compare)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
