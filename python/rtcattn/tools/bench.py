"""`python -m rtcattn bench`: the ops' benchmark suites on a GPU, against their peers.

The driver knows no op: each op's rtcattn/ops/<op>/bench.py registers its suites (register below), and
`bench` imports every such module it finds. A suite is a function of the parsed arguments that prints its
table and returns {"rows": [...], ...}; `--json` writes that with the device's name, `--plot` draws it
when the suite gives a chart. A suite's plan (optional) lists its cases without timing anything: `--dry-run`
prints it, on any machine (no GPU needed), which is what the CPU tests run."""
from __future__ import annotations

import datetime
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from . import timing


@dataclass(frozen=True)
class Suite:
    name: str
    run: object              # (args) -> {"rows": [...], "title": chart title (optional), other JSON fields}
    help: str
    add_arguments: object    # (parser) -> None, or None
    plot: object             # (rows, path, pyplot, title) -> None, or None: no chart
    plan: object = None      # (args) -> {"rows": [...]}: prints the cases, times nothing; None: no --dry-run


SUITES: dict = {}
_default = []


def register(name: str, run, help: str, add_arguments=None, plot=None, default: bool = False, plan=None) -> None:
    """Makes a suite selectable with `bench --suite NAME` (default=True: the one run without --suite)."""
    if name in SUITES:
        raise ValueError(f"bench suite {name!r} is registered twice")
    SUITES[name] = Suite(name, run, help, add_arguments, plot, plan)
    if default:
        _default.append(name)


def check_choice(name: str, value, accepted) -> None:
    if value not in accepted:
        raise ValueError(f"{name} {value!r} is not supported; accepted: {', '.join(map(repr, accepted))}")


def _discover() -> None:
    """Imports rtcattn.ops.<op>.bench for every op folder that has one, rtcattn.integrations.<client>.bench and
    rtcattn.<package>.bench (distributed) likewise (each registers its suites). By name, as a plugin registry does:
    the driver imports no op."""
    top = Path(__file__).resolve().parent.parent
    root = __package__.rsplit(".", 1)[0]
    kinds = ("ops", "integrations")
    folders = [(f"{root}.{kind}.{f.name}", f) for kind in kinds for f in sorted((top / kind).iterdir())]
    folders += [(f"{root}.{f.name}", f) for f in sorted(top.iterdir()) if f.name not in (*kinds, "tools")]
    for package, folder in folders:
        if (folder / "bench.py").is_file() and (folder / "__init__.py").is_file():
            importlib.import_module(f"{package}.bench")


def add_arguments(p) -> None:
    _discover()
    p.add_argument("--suite", choices=sorted(SUITES), default=_default[0] if _default else None,
                   help="; ".join(f"{s.name}: {s.help}" for s in SUITES.values()))
    p.add_argument("--reps", type=int, default=10, help="timed rounds per case (fewer for slow cases)")
    p.add_argument("--budget-s", type=float, default=12.0,
                   help="GPU seconds of timed rounds per case at most (caps --reps)")
    p.add_argument("--quick", action="store_true", help="3 shapes, 1 mode, 3 reps")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="bar chart per case of TFLOP/s, or of the suite's own figure (needs matplotlib)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cases the suite would time (with their FLOPs or bytes), run nothing: no GPU "
                        "needed")
    for suite in SUITES.values():
        if suite.add_arguments is not None:
            suite.add_arguments(p)


def _suite(args):
    """The suite that runs: --suite's, or the one `--shapes NAME` names with the default suite (the default suite
    runs it, so its chart is that suite's own, not the default's)."""
    shapes = (getattr(args, "shapes", None) or "").strip()
    if _default and args.suite == _default[0] and shapes in SUITES:
        return SUITES[shapes]
    return SUITES[args.suite]


def main(args) -> int:
    if args.dry_run:
        return dry_run(args)
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("bench needs a CUDA or ROCm GPU and torch sees none "
                           f"(torch {torch.__version__}); run it on a GPU machine")
    suite = _suite(args)
    plt = timing.matplotlib_pyplot() if args.plot else None   # fails before the runs, not after
    if args.quick:
        args.reps = 3
    result = suite.run(args)
    title = result.pop("title", None)
    device = torch.cuda.get_device_name()
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": device, **result}, fh, indent=1)
    if plt is not None and suite.plot is not None and title is not None:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        suite.plot(result["rows"], args.plot, plt, f"{device}, {when}: {title}")
    return 0


def dry_run(args) -> int:
    suite = SUITES[args.suite]
    if suite.plan is None:
        raise ValueError(f"--dry-run is not supported for suite {suite.name!r}; accepted: "
                         + ", ".join(s.name for s in SUITES.values() if s.plan is not None))
    if args.quick:
        args.reps = 3
    result = suite.plan(args)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": None, "dry_run": True, **result}, fh, indent=1)
    return 0
