"""`python -m rtcattn`: warm (fill the code-object cache without a GPU), info, clear, bench, isa."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed


def _csv(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ints(text: str) -> list:
    try:
        return [int(x) for x in _csv(text)]
    except ValueError:
        raise SystemExit(f"rtcattn: {text!r} is not a comma-separated list of integers") from None


def _origin(result) -> str:
    return result.origin  # compile | memory | user_cache | system_cache


def _check_subset(name: str, chosen, accepted) -> None:
    bad = [c for c in chosen if c not in accepted]
    if bad:
        raise SystemExit(f"rtcattn: {name}={','.join(map(str, bad))} is not supported; "
                         f"accepted: {', '.join(map(str, accepted))}")


def _axis_flag(axis: str) -> str:
    return "--" + axis.replace("_", "-")


def _warm_variants(args, default: bool | None = None):
    """The variants `warm` builds: each op's default set (its manifest's warm_default; --all: every kernel x arch x
    axis value), narrowed by the filters."""
    from ..runtime import manifest
    default = not args.all if default is None else default
    m = manifest.load()
    ops = _csv(args.op) if args.op else list(m.ops)
    _check_subset("--op", ops, list(m.ops))
    archs = _csv(args.arch)
    _check_subset("--arch", archs, m.archs())
    kernels = _csv(args.kernels) if args.kernels else None
    _check_subset("--kernels", kernels or [], sorted({k.name for o in ops for k in m.op(o).kernels}))
    variants = []
    for op in ops:
        spec = m.op(op)
        filters = {}
        for axis in spec.axes:
            text = getattr(args, "axis_" + axis.name, None)
            if text is None:
                continue
            accepted = spec.axis_values(axis.name)
            chosen = _ints(text) if axis.buckets else _csv(text)
            _check_subset(_axis_flag(axis.name), chosen, accepted)
            filters[axis.name] = chosen
        variants += m.variants(op, archs=archs, kernels=kernels, default=default, **filters)
    return variants


def _default_sets(ops: list) -> str:
    from ..runtime import manifest
    return "; ".join(f"{op}: {manifest.load().op(op).warm_default.describe()}" for op in ops)


def _interleaved(variants: list) -> list:
    """The variants taking turns by arch (each arch's own order kept). Each arch has its compiler, and one may
    compile one variant at a time per process (hipRTC 5.2's comgr is not thread-safe, so the runtime serializes
    it): queued arch by arch, the jobs would all wait on that one compiler while the others sit idle."""
    by_arch: dict = {}
    for v in variants:
        by_arch.setdefault(v.arch, []).append(v)
    queues = list(by_arch.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def _add_axis_filters(w) -> None:
    """One --<axis> filter per axis of the manifest's ops: adding an axis to ops.json adds its flag."""
    from ..runtime import manifest
    seen = set()
    for spec in manifest.load().ops.values():
        for axis in spec.axes:
            if axis.name in seen:
                continue
            seen.add(axis.name)
            shown = "buckets" if axis.buckets else ",".join(axis.value_names())
            w.add_argument(_axis_flag(axis.name), dest="axis_" + axis.name, metavar="V[,V...]",
                           help=f"only these values of axis {axis.name} ({shown})")


def _print_table(rows: list, headers: tuple) -> None:
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*headers))
    print(line.format(*("-" * w for w in widths)))
    for r in rows:
        print(line.format(*r))


def _recorded_variants(args) -> tuple:
    """`warm --from FILE`: (the variants of the file's records on each --arch, narrowed by --op / --kernels, each
    once; a line for each record and arch no kernel serves, with the reason; the number of records). The rules that
    map a record to an arch are record.map_record's (its module's docstring): the recorded kernel's variant where it
    serves the arch, else the kernel dispatch picks there for the call, keeping the record's role (decode or not)."""
    from ..runtime import manifest, record
    m = manifest.load()
    archs = _csv(args.arch)
    _check_subset("--arch", archs, m.archs())
    ops = _csv(args.op) if args.op else None
    _check_subset("--op", ops or [], list(m.ops))
    kernels = _csv(args.kernels) if args.kernels else None
    _check_subset("--kernels", kernels or [], sorted({k.name for o in (ops or m.ops) for k in m.op(o).kernels}))
    records = record.read(args.from_file, m)  # every line checked before anything compiles
    if not records:
        raise ValueError(f"--from {args.from_file} holds no records (was {record.KNOB} set while the model ran?)")
    variants, skipped = {}, []
    for rec in records:
        if ops is not None and rec.op not in ops:
            continue
        for arch in archs:
            v, why = record.map_record(m, rec, arch)
            if v is None:
                skipped.append(f"{args.from_file}, line {rec.lineno} ({rec.op} {rec.variant}) on {arch}: {why}")
            elif kernels is None or v.kernel in kernels:
                variants.setdefault(v, None)  # duplicates collapse to one build, in the records' order
    return list(variants), skipped, len(records)


def _from_conflicts(args) -> list:
    """The flags that choose among the manifest's variants, which a record file replaces."""
    given = ["--all"] if args.all else []
    return given + [_axis_flag(name[len("axis_"):]) for name, value in sorted(vars(args).items())
                    if name.startswith("axis_") and value is not None]


def cmd_warm(args) -> int:
    if args.from_file is not None:
        conflicts = _from_conflicts(args)
        if conflicts:
            print(f"rtcattn warm: --from cannot be combined with {', '.join(conflicts)}; accepted beside --from: "
                  "--arch, --op, --kernels, --cache-dir, --jobs", file=sys.stderr)
            return 2
        variants, skipped, n = _recorded_variants(args)
        for line in skipped:
            print(f"rtcattn warm: skipped {line}", flush=True)
        if not variants:
            if args.op or args.kernels:
                raise SystemExit(f"rtcattn: no variant of the records of {args.from_file} matches the given "
                                 "--op/--kernels")
            print(f"rtcattn warm: no record of {args.from_file} has a kernel on {args.arch}; nothing to compile")
            return 0
        return _build_all(args, variants, f"{n} records of {args.from_file}, {len(skipped)} skipped")
    variants = _warm_variants(args)
    if not variants:
        if not args.all and _warm_variants(args, default=False):
            ops = _csv(args.op) if args.op else sorted({v.op for v in _warm_variants(args, default=False)})
            raise SystemExit("rtcattn: no variant of the default set matches the given --op/--arch/--kernels and "
                             f"axis filters (the default set: {_default_sets(ops)}); add --all to choose among "
                             "every variant")
        raise SystemExit("rtcattn: no variant matches the given --op/--arch/--kernels and axis filters")
    which = "every variant" if args.all else f"the default set (--all: {len(_warm_variants(args, default=False))})"
    return _build_all(args, variants, which)


def _build_all(args, variants: list, which: str) -> int:
    """warm's compile of the variants into the target cache dir (checked first), with progress and the table."""
    from ..runtime import dispatch
    variants = _interleaved(variants)
    cache_dir = os.path.abspath(args.cache_dir) if args.cache_dir else None
    if cache_dir:  # the target is this process's user cache: the runtime's own checks of that dir apply
        os.environ["RTCATTN_CACHE_DIR"] = cache_dir
    target = dispatch.lib().info()["user_cache"]
    # warm's job is to write: the dir is made (as the first compile would) and checked before compiling anything
    problem = dispatch.lib().prepare_cache(target["path"])
    if not problem and not os.access(target["path"], os.W_OK | os.X_OK):
        problem = "is not writable by this user"
    if problem:
        print(f"rtcattn warm: cache dir {target['path']} {problem}; nothing was written", file=sys.stderr)
        return 2
    print(f"rtcattn warm: {len(variants)} variants, {which}, {args.jobs} jobs, cache {target['path']}", flush=True)
    rows, failures, t0 = [], [], time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # ctypes drops the GIL in rtc_build
        futures = {pool.submit(dispatch.build, v, cache_dir): v for v in variants}
        for i, fut in enumerate(as_completed(futures), 1):
            v = futures[fut]
            name = f"{v.arch} {v.op}/{v.name}"
            try:
                r = fut.result()
            except Exception as e:  # report every failure, keep warming the rest
                failures.append((name, e))
                print(f"[{i}/{len(variants)}] {name}: FAILED ({type(e).__name__})", flush=True)
                continue
            if _origin(r) == "compile" and not r.path:  # compiled, but the runtime could not write it
                failures.append((name, RuntimeError(f"compiled but not written to {target['path']} (the runtime's "
                                                    "warning above says why)")))
                print(f"[{i}/{len(variants)}] {name}: FAILED (not written)", flush=True)
                continue
            rows.append((v.arch, f"{v.op}/{v.name}", r.size, f"{r.compile_ms:.0f}", _origin(r), r.path))
            print(f"[{i}/{len(variants)}] {name}: {_origin(r)} {r.compile_ms:.0f} ms", flush=True)
    rows.sort()
    if rows:
        _print_table(rows, ("arch", "variant", "size", "compile ms", "origin", "path"))
    compiled = sum(1 for r in rows if r[4] == "compile")
    print(f"{len(rows)} ready ({compiled} compiled), {len(failures)} failed, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    for name, e in failures:
        print(f"--- {name} ---\n{e}", file=sys.stderr)
    return 1 if failures else 0


def _gpu_lines() -> list:
    import torch

    from ..runtime import dispatch
    if not torch.cuda.is_available():
        return ["torch GPU: none (torch " + torch.__version__ + ")"]
    lines = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        lines.append(f"torch GPU {i}: {torch.cuda.get_device_name(i)} arch {dispatch.arch_of(dev)} "
                     f"vendor {dispatch.vendor_of(dev)}")
    return lines


def _print_json_tree(value, indent: int = 0) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                print(f"{pad}{key}:")
                _print_json_tree(item, indent + 1)
            else:
                shown = (item or "-") if isinstance(item, str) else json.dumps(item)
                print(f"{pad}{key}: {shown}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                print(f"{pad}- " + ", ".join(f"{k}={v}" for k, v in item.items()))
            else:
                print(f"{pad}- {item}")
    else:
        print(f"{pad}{value}")


def cmd_info(args) -> int:
    from .. import __version__
    from ..runtime import dispatch, paths
    info = dispatch.lib().info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"rtcattn {__version__}")
    print(f"kernel data: {paths.data_root()}")
    print(f"package cache: {paths.package_cache_dir()}")
    print(f"emulator target (RTCATTN_EMULATE): {dispatch.knob('RTCATTN_EMULATE') or 'unset'}")
    for line in _gpu_lines():
        print(line)
    _print_json_tree(info)
    return 0


def cmd_clear(args) -> int:
    from ..runtime import dispatch
    cache_dir = os.path.abspath(args.cache_dir) if args.cache_dir else None
    removed = dispatch.lib().clear_cache(cache_dir)
    print(f"removed {removed} cache entries from {cache_dir or 'the user cache dir'}")
    return 0


def cmd_bench(args) -> int:
    from . import bench
    return bench.main(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rtcattn", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("warm", help="compile the default set of variants (--all: every variant; --from FILE: the "
                                    "variants RTCATTN_RECORD wrote there) for the given archs (no GPU needed)")
    w.add_argument("--arch", required=True, help="comma-separated, e.g. gfx942,gfx90a,sm_90a")
    w.add_argument("--all", action="store_true",
                   help="every variant, not only each op's default set (configs/ops.json: ops.<op>.warm_default)")
    w.add_argument("--cache-dir", help="write here instead of the user cache (e.g. the package's _cache)")
    w.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    w.add_argument("--op", help="only these ops (comma-separated; default: every op of the manifest)")
    w.add_argument("--kernels", help="only these kernels (comma-separated)")
    w.add_argument("--from", dest="from_file", metavar="FILE",
                   help="the variants recorded in FILE (RTCATTN_RECORD), mapped to each --arch: the recorded kernel "
                        "where it serves the arch, else the kernel dispatch picks there for the call (a decode "
                        "record's first kernel that takes it, any other's first that declines no call at run time); "
                        "not with --all or the axis filters")
    _add_axis_filters(w)
    w.set_defaults(func=cmd_warm)
    i = sub.add_parser("info", help="GPUs, archs, compilers (with versions), cache dirs and entries")
    i.add_argument("--json", action="store_true", help="print the runtime's JSON as is")
    i.set_defaults(func=cmd_info)
    c = sub.add_parser("clear", help="remove the entries of the user cache dir (or --cache-dir)")
    c.add_argument("--cache-dir")
    c.set_defaults(func=cmd_clear)
    from . import bench
    bench.add_arguments(sub.add_parser("bench", help="GPU: the ops' benchmark suites against their peers"))
    sub.choices["bench"].set_defaults(func=cmd_bench)
    from . import coreport, firstcall
    coreport.add_parser(sub)
    firstcall.add_parser(sub)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "jobs", 1) is not None and getattr(args, "jobs", 1) < 1:
        raise SystemExit(f"rtcattn: --jobs={args.jobs} is not supported; accepted: an integer >= 1")
    try:
        return args.func(args)
    except (ImportError, OSError, ValueError, RuntimeError) as e:
        print(f"rtcattn {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
