"""The op manifest (configs/ops.json): parsed as JSON, validated, enumerated into variants and build requests.

Nothing here knows an op: each op declares its axes (a name, a -D define, and either enumerated
values or head-dim style buckets), optionally the combinations of values of its enumerated axes that are
no variant (`exclude`: values an axis takes that mean nothing next to another axis's value) and the variants
`warm` compiles unless asked for all (`warm_default`), and each kernel its archs and the axis values it takes.
Variants, their names, the defines of a build, `warm`'s enumeration and dispatch's conditions all come from that.
"""
from __future__ import annotations

import functools
import itertools
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import paths

__all__ = ["ManifestError", "Manifest", "Axis", "KernelSpec", "OpSpec", "Variant", "BuildRequest", "WarmDefault",
           "Machine", "load"]


@dataclass(frozen=True)
class Machine:
    """An arch's reference part (the manifest's `machine` of the arch; an emulated arch takes its arch's): the
    figures the kernels' planners (the argument block's hbm_gbps, lds_per_cu and gfx_arch) and the static models
    take. The vendors' published peaks; a GPU's own CU count, when there is one, is asked of the GPU."""
    arch: str
    name: str
    cus: int
    hbm_bytes_per_s: float
    clock_hz: float
    lds_per_cu: int

    @property
    def hbm_gbps(self) -> int:
        return round(self.hbm_bytes_per_s / 1e9)

    @property
    def gfx_arch(self) -> int:
        """The arch as the AMD kernels' RTC_GFX names it (the argument block's gfx_arch): gfx90a -> 0x90a; 0 for an
        arch of another vendor."""
        return int(self.arch.removeprefix("gfx"), 16) if self.arch.startswith("gfx") else 0


@dataclass(frozen=True)
class Axis:
    """One compile-time axis of an op: enumerated (values -> define value) or bucketed (an integer
    argument rounded up to the smallest bucket of the kernel that holds it)."""
    name: str
    define: str
    values: tuple = ()        # enumerated axes: ((value, define integer), ...) in the manifest's order
    buckets: bool = False
    prefix: str = ""          # bucketed axes: name part prefix, e.g. "d" -> "d128"

    def value_names(self) -> list:
        return [v for v, _ in self.values]

    def define_value(self, value) -> int:
        return value if self.buckets else dict(self.values)[value]

    def name_part(self, value) -> str:
        return f"{self.prefix}{value}" if self.buckets else str(value)


@dataclass(frozen=True)
class BucketSpec:
    lo: int
    hi: int
    step: int
    buckets: tuple

    def accepts(self, n: int) -> bool:
        return self.lo <= n <= self.hi and (n - self.lo) % self.step == 0

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def describe(self) -> str:
        return f"{self.lo}..{self.hi} in steps of {self.step}"


@dataclass(frozen=True)
class KernelSpec:
    name: str
    symbol: str
    source: str             # file name inside op_sources/<op>/
    archs: tuple
    axes: dict              # axis name -> tuple of accepted values (enumerated) or BucketSpec (bucketed)
    # The manifest's `declines_at_run_time`: which calls of its axis values it leaves, at run time, to the kernels
    # after it (on what only the arguments tell, e.g. sequence lengths); "" when it serves every call they allow.
    declines_at_run_time: str = ""

    def accepted(self, axis: Axis):
        return self.axes[axis.name]

    def why_not(self, axis: Axis, value) -> str | None:
        """Why this kernel does not take value on axis (a call's value: the integer for a bucketed axis)."""
        spec = self.axes[axis.name]
        if axis.buckets:
            return None if spec.accepts(value) else f"{axis.name} {value} outside {spec.describe()}"
        return None if value in spec else f"{axis.name} {value!r} not in {list(spec)}"


@dataclass(frozen=True)
class Exclusion:
    """One entry of an op's `exclude` list: every combination whose value on each named axis is among the
    listed ones is no variant (nothing is compiled for it and no call may ask for it)."""
    index: int              # its place in the manifest's list, named in messages
    values: tuple           # ((axis name, frozenset of value names), ...) in the manifest's order

    def matches(self, values: dict) -> bool:
        return all(values.get(axis) in names for axis, names in self.values)

    def describe(self) -> str:
        return ", ".join(f"{axis} in {sorted(names)}" for axis, names in self.values)


@dataclass(frozen=True)
class WarmDefault:
    """An op's `warm_default`: the variants `warm` compiles unless given --all. values narrows enumerated axes
    (an axis not named keeps every value); exclude leaves out combinations of values (entries shaped like the op's
    own exclude list); first_choice_only keeps a kernel's variant only where some call it serves would not be taken
    by a kernel earlier in the manifest's order of preference."""
    values: tuple = ()              # ((axis name, frozenset of value names), ...)
    first_choice_only: bool = False
    why: str = ""
    exclude: tuple = ()             # Exclusion, as the op's (their index: the place in warm_default.exclude)

    def keeps(self, values: dict) -> bool:
        """Whether a variant's or a call's axis values are what the default set is for (values and exclude)."""
        return (all(values.get(axis) in names for axis, names in self.values)
                and not any(e.matches(values) for e in self.exclude))

    def describe(self) -> str:
        parts = [f"{axis} in {sorted(names)}" for axis, names in self.values]
        parts += [f"not ({e.describe()})" for e in self.exclude]
        if self.first_choice_only:
            parts.append("each kernel where it is the first choice")
        return ", ".join(parts) or "every variant"


@dataclass(frozen=True)
class OpSpec:
    name: str
    description: str
    axes: tuple             # Axis, in the manifest's order (the order of variant names and defines)
    kernels: tuple          # KernelSpec, in order of preference: dispatch takes the first that fits
    exclude: tuple = ()     # Exclusion: combinations of axis values that are no variant
    warm_default: WarmDefault = WarmDefault()  # what `warm` compiles without --all (absent: every variant)

    def exclusion(self, values: dict) -> Exclusion | None:
        """The first entry of the op's exclude list that the axis values (a variant's or a call's) match."""
        return next((e for e in self.exclude if e.matches(values)), None)

    def why_excluded(self, values: dict) -> str | None:
        e = self.exclusion(values)
        if e is None:
            return None
        shown = ", ".join(f"{axis}={values[axis]!r}" for axis, _ in e.values)
        return (f"{shown} is no variant of op {self.name!r}: the manifest's ops.{self.name}.exclude[{e.index}] "
                f"({e.describe()}) leaves it out")

    def kernel(self, name: str) -> KernelSpec:
        for k in self.kernels:
            if k.name == name:
                return k
        raise ValueError(f"kernel={name!r} is not a kernel of op {self.name!r}; "
                         f"accepted: {', '.join(k.name for k in self.kernels)}")

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise ValueError(f"axis={name!r} is not an axis of op {self.name!r}; "
                         f"accepted: {', '.join(a.name for a in self.axes)}")

    def rejects(self, k: KernelSpec, arch: str, call: dict) -> str | None:
        """Why kernel k cannot serve the call, or None: its archs and the axis values it takes (dispatch's conditions,
        the manifest's data)."""
        if arch not in k.archs:
            return f"arch {arch} not in {list(k.archs)}"
        for axis in self.axes:
            why = k.why_not(axis, call[axis.name])
            if why:
                return why
        return None

    def first_choice(self, k: KernelSpec, arch: str, values: dict) -> bool:
        """Whether some call that kernel k's variant (values: one per axis, a bucket for a bucketed axis) serves
        on arch is taken by no earlier kernel of the op: dispatch's order, from the manifest's conditions alone
        (a kernel that declines a call at run time, on alignment or strides, falls back past this). An earlier
        kernel that declines whole classes of calls at run time (`declines_at_run_time`) takes none of them for
        sure."""
        earlier = []
        for e in self.kernels[:self.kernels.index(k)]:
            if e.declines_at_run_time:
                continue
            if arch in e.archs and all(e.why_not(a, values[a.name]) is None for a in self.axes if not a.buckets):
                earlier.append(e)
        if not earlier:
            return True
        bucketed = [a for a in self.axes if a.buckets]
        served = [[n for n in range(k.axes[a.name].lo, k.axes[a.name].hi + 1, k.axes[a.name].step)
                   if k.axes[a.name].bucket_for(n) == values[a.name]] for a in bucketed]
        return any(all(any(e.why_not(a, n) for a, n in zip(bucketed, call)) for e in earlier)
                   for call in itertools.product(*served))

    def axis_values(self, name: str) -> list:
        """Every value of an axis any kernel takes: the enumerated values, or the union of the buckets."""
        axis = self.axis(name)
        if not axis.buckets:
            return axis.value_names()
        return sorted({b for k in self.kernels for b in k.axes[name].buckets})


@dataclass(frozen=True)
class Variant:
    """One compiled code object: a kernel of an op for an arch, with one value per axis."""
    op: str
    kernel: str
    arch: str
    values: tuple           # ((axis name, value), ...) in the op's axis order
    name: str               # readable, e.g. "gfx942-rtne-none-dense-d128-bf16": the kernel, then each axis value

    def __getitem__(self, axis: str):
        return dict(self.values)[axis]


def _variant(spec: OpSpec, kernel: str, arch: str, values: tuple) -> Variant:
    name = "-".join([kernel] + [spec.axis(a).name_part(v) for a, v in values])
    return Variant(spec.name, kernel, arch, values, name)


@dataclass(frozen=True)
class BuildRequest:
    """Everything the C ABI's rtc_build_request needs; compilers is the manifest's order of preference."""
    op: str
    variant: str
    arch: str
    compilers: tuple
    kernel_symbol: str
    main: tuple             # (include name, text)
    headers: tuple          # ((include name, text), ...)
    options: tuple
    package_version: str


class Manifest:
    def __init__(self, data: dict, path: Path, root: Path):
        self.path, self.root, self.schema = path, root, data["schema"]
        self.arch_options = data["archs"]
        self.ops = {name: _op_spec(name, op) for name, op in data["ops"].items()}

    def op(self, name: str) -> OpSpec:
        if name not in self.ops:
            raise ValueError(f"op={name!r} is not in {self.path}; accepted: {', '.join(self.ops)}")
        return self.ops[name]

    def machine(self, arch: str) -> Machine | None:
        """The reference part of arch (gfx942-emu: gfx942's), or None where the manifest names none."""
        base = arch.removesuffix("-emu")
        opt = self.arch_options.get(base, {}).get("machine")
        if opt is None:
            return None
        return Machine(base, opt["part"], opt["cus"], opt["hbm_gbps"] * 1e9, opt["clock_mhz"] * 1e6, opt["lds_per_cu"])

    def archs(self, op: str | None = None) -> list:
        seen: list = []
        for spec in ([self.op(op)] if op else self.ops.values()):
            for k in spec.kernels:
                seen += [a for a in k.archs if a not in seen]
        return seen

    def variants(self, op: str, archs=None, kernels=None, default: bool = False, **axis_filters) -> Iterator[Variant]:
        """Every variant of op, optionally filtered: archs, kernels and any axis by name (None = all);
        default=True: only those of the op's warm_default."""
        spec = self.op(op)
        for name in axis_filters:
            spec.axis(name)  # an unknown axis name is an error, not an empty result
        chosen = dict(spec.warm_default.values) if default else {}
        for k in spec.kernels:
            if kernels is not None and k.name not in kernels:
                continue
            per_axis = []
            for axis in spec.axes:
                accepted = k.axes[axis.name].buckets if axis.buckets else k.axes[axis.name]
                wanted, kept = axis_filters.get(axis.name), chosen.get(axis.name)
                per_axis.append([v for v in accepted
                                 if (wanted is None or v in wanted) and (kept is None or v in kept)])
            combos = [tuple(zip((a.name for a in spec.axes), combo)) for combo in itertools.product(*per_axis)]
            combos = [c for c in combos if spec.exclusion(dict(c)) is None
                      and (not default or spec.warm_default.keeps(dict(c)))]
            for arch in k.archs:
                if archs is not None and arch not in archs:
                    continue
                for values in combos:
                    if default and spec.warm_default.first_choice_only and not spec.first_choice(k, arch, dict(values)):
                        continue
                    yield _variant(spec, k.name, arch, values)

    def variant_for(self, op: str, kernel: str, arch: str, call: dict) -> Variant:
        """The variant of kernel that serves a call's axis values (bucketed axes rounded up to their bucket)."""
        spec = self.op(op)
        k = spec.kernel(kernel)
        values = tuple((a.name, k.axes[a.name].bucket_for(call[a.name]) if a.buckets else call[a.name])
                       for a in spec.axes)
        why = spec.why_excluded(dict(values))
        if why:
            raise ValueError(why)
        return _variant(spec, kernel, arch, values)

    def request(self, v: Variant, package_version: str, extra_options=()) -> BuildRequest:
        spec = self.op(v.op)
        kernel = spec.kernel(v.kernel)
        arch_opt = self.arch_options[v.arch]
        defines = [f"-D{spec.axis(a).define}={spec.axis(a).define_value(value)}" for a, value in v.values]
        op_dir = self.root / "op_sources" / v.op
        return BuildRequest(
            op=v.op, variant=v.name, arch=v.arch, compilers=tuple(arch_opt["compiler"]),
            kernel_symbol=kernel.symbol, main=(kernel.source, _read_text(op_dir / kernel.source)),
            headers=tuple(include_closure(op_dir / kernel.source, [op_dir, self.root / "csrc_common"],
                                          v.arch.endswith("-emu"))),
            options=tuple(defines + list(arch_opt["flags"]) + list(extra_options)), package_version=package_version)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise FileNotFoundError(f"kernel text {path} cannot be read ({e.strerror})") from e


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def include_closure(source: Path, roots: list, emulated: bool) -> list:
    """The headers a kernel source reaches through its #includes, as (include name, text).

    Include names are relative to one of the roots (the op's folder, then csrc_common), as the
    compilers see them; only these go into the request and so into the cache key, so editing an
    unrelated header leaves a kernel's cached code objects valid. emu/ headers count only for
    emulated archs. A name found under two roots is an error (which one the compiler took would
    depend on the search order).
    """
    roots = [r.resolve() for r in roots]
    found: dict = {}
    pending, seen = [source.resolve()], set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for spelled in _INCLUDE.findall(_read_text(path)):
            beside = (path.parent / spelled).resolve()
            if beside.is_file() and any(r in beside.parents for r in roots):
                hits = [beside]  # as the compilers do: beside the including file first
            else:
                hits = [(r / spelled).resolve() for r in roots if (r / spelled).is_file()]
            if not hits:
                continue  # a system header
            if len(hits) > 1:
                raise FileNotFoundError(f"#include \"{spelled}\" in {path} is found under two roots: "
                                        f"{hits[0]} and {hits[1]}; rename one")
            root = next(r for r in roots if r in hits[0].parents)
            name = hits[0].relative_to(root).as_posix()
            if name.split("/")[0] == "emu" and not emulated:
                continue
            found.setdefault(name, _read_text(hits[0]))
            pending.append(hits[0])
    return sorted(found.items())


def read_headers(common: Path, emulated: bool) -> list:
    """Every header under csrc_common by include name (for test kernels outside the manifest)."""
    out = []
    for p in sorted(common.rglob("*")):
        rel = p.relative_to(common)
        if not p.is_file() or p.suffix not in (".h", ".hpp", ".cuh", ".inc"):
            continue
        if rel.parts[0] == "emu" and not emulated:
            continue
        out.append((rel.as_posix(), _read_text(p)))
    return out


def _op_spec(name: str, op: dict) -> OpSpec:
    axes = tuple(Axis(name=a["name"], define=a["define"], values=tuple(a.get("values", {}).items()),
                      buckets=bool(a.get("buckets", False)), prefix=a.get("prefix", "")) for a in op["axes"])
    kernels = []
    for k in op["kernels"]:
        given = k.get("axes", {})
        per_axis = {}
        for a in axes:
            spec = given.get(a.name)
            if a.buckets:
                per_axis[a.name] = BucketSpec(spec["min"], spec["max"], spec["step"], tuple(sorted(spec["buckets"])))
            else:
                per_axis[a.name] = tuple(spec) if spec is not None else tuple(a.value_names())
        kernels.append(KernelSpec(name=k["name"], symbol=k["symbol"], source=k["source"], archs=tuple(k["archs"]),
                                  axes=per_axis, declines_at_run_time=k.get("declines_at_run_time", "")))
    exclude = tuple(Exclusion(i, tuple((axis, frozenset(names)) for axis, names in e.items()))
                    for i, e in enumerate(op.get("exclude", [])))
    wd = op.get("warm_default", {})
    warm_default = WarmDefault(tuple((axis, frozenset(names)) for axis, names in wd.get("axes", {}).items()),
                               wd.get("first_choice_only", False), wd.get("why", ""),
                               tuple(Exclusion(i, tuple((axis, frozenset(names)) for axis, names in e.items()))
                                     for i, e in enumerate(wd.get("exclude", []))))
    return OpSpec(name=name, description=op.get("description", ""), axes=axes, kernels=tuple(kernels),
                  exclude=exclude, warm_default=warm_default)


_CACHE: dict = {}


@functools.lru_cache(maxsize=4)
def _default_location(path: Path) -> tuple:
    return path, path.resolve().parent.parent


# The installed manifest as last loaded, when its file was last looked at (time.monotonic()) and the function that
# located it (paths.data_root; one put in its place, as tests do, locates it again): an op's every call asks for it,
# and a stat with the path's making cost tens of microseconds of each call's host time.
_default: list = [None, 0.0, None]
RESTAT_S = 1.0   # an edited manifest is seen within this long


def load(path: Path | None = None, root: Path | None = None) -> Manifest:
    """Parse and validate the manifest; cached per (path, mtime) so edits during development are seen (the installed
    one's file is looked at again at most every RESTAT_S seconds)."""
    if path is None and root is None:  # the installed manifest: an op's every call asks for it
        now, locate = time.monotonic(), paths.data_root
        if _default[0] is not None and now - _default[1] < RESTAT_S and _default[2] is locate:
            return _default[0]
        path, root = _default_location(paths.manifest_path())
        _default[:] = [load(path, root), now, locate]
        return _default[0]
    path = Path(path) if path is not None else paths.manifest_path()
    root = Path(root) if root is not None else path.resolve().parent.parent
    try:
        stamp = path.stat().st_mtime_ns
        key = (str(path), stamp, str(root))
        if key in _CACHE:
            return _CACHE[key]
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(path, "", None, f"a readable JSON file ({e.strerror})") from e
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(path, f"line {e.lineno} column {e.colno}", e.msg, "valid JSON") from e
    check_manifest(data, path, root)
    _CACHE[key] = Manifest(data, path, root)
    return _CACHE[key]


# ---- schema ------------------------------------------------------------------------------------

COMPILERS = ("auto", "clang", "clang22", "hiprtc", "nvrtc", "host")


class ManifestError(ValueError):
    """A manifest that does not match the schema: names the file, the key path, the value and what is accepted."""

    def __init__(self, path, key: str, value, accepted: str):
        self.path, self.key, self.value, self.accepted = path, key, value, accepted
        shown = json.dumps(value) if _jsonable(value) else repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"{path}: {key or '<top>'} = {shown} is not accepted; expected {accepted}")


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


class _Checker:
    def __init__(self, path):
        self.path = path

    def fail(self, key, value, accepted):
        raise ManifestError(self.path, key, value, accepted)

    def get(self, obj: dict, key: str, where: str, kind, accepted: str, optional=False):
        if key not in obj:
            if optional:
                return None
            self.fail(f"{where}.{key}".lstrip("."), None, f"the key to be present ({accepted})")
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            self.fail(f"{where}.{key}".lstrip("."), value, accepted)
        return value

    def str_list(self, obj, key, where, nonempty=True, choices=None):
        value = self.get(obj, key, where, list, "a list of strings")
        if nonempty and not value:
            self.fail(f"{where}.{key}", value, "a non-empty list of strings")
        for i, item in enumerate(value):
            if not isinstance(item, str) or (choices is not None and item not in choices):
                self.fail(f"{where}.{key}[{i}]", item,
                          "one of " + ", ".join(choices) if choices else "a string")
        return value

    def identifier(self, obj, key, where):
        value = self.get(obj, key, where, str, "a C identifier")
        if not value.isidentifier():
            self.fail(f"{where}.{key}", value, "a C identifier")
        return value

    def name(self, obj, key, where):
        value = self.get(obj, key, where, str, "a non-empty name of letters, digits and '_'")
        if not re.fullmatch(r"[A-Za-z0-9_]+", value):
            self.fail(f"{where}.{key}", value, "a non-empty name of letters, digits and '_'")
        return value


# An arch's `machine`: key -> (JSON type, what is accepted).
MACHINE_KEYS = {"part": (str, "the part's name"), "cus": (int, "a positive integer (compute units)"),
                "hbm_gbps": ((int, float), "a positive number (peak HBM bandwidth, GB/s)"),
                "lds_per_cu": (int, "a positive integer (LDS bytes per CU)"),
                "clock_mhz": ((int, float), "a positive number (peak engine clock, MHz)")}


def check_manifest(data, path, root=None) -> None:
    """Raises ManifestError on the first deviation from the schema."""
    c = _Checker(path)
    if not isinstance(data, dict):
        c.fail("", data, "a JSON object with keys 'schema', 'archs' and 'ops'")
    schema = c.get(data, "schema", "", int, "the integer 2")
    if schema != 2:
        c.fail("schema", schema, "2")
    archs = c.get(data, "archs", "", dict, "an object mapping arch to its compilers and flags")
    for arch, opt in archs.items():
        w = f"archs.{arch}"
        if not isinstance(opt, dict):
            c.fail(w, opt, "an object with keys compiler, flags")
        c.str_list(opt, "compiler", w, choices=COMPILERS)
        c.str_list(opt, "flags", w, nonempty=False)
        machine = c.get(opt, "machine", w, dict, "an object with keys " + ", ".join(MACHINE_KEYS), optional=True)
        if machine is not None:
            for key, (kind, accepted) in MACHINE_KEYS.items():
                value = c.get(machine, key, f"{w}.machine", kind, accepted)
                if kind is not str and value <= 0:
                    c.fail(f"{w}.machine.{key}", value, accepted)
            extra = sorted(set(machine) - set(MACHINE_KEYS))
            if extra:
                c.fail(f"{w}.machine.{extra[0]}", machine[extra[0]], "one of the keys " + ", ".join(MACHINE_KEYS))
    emulated = [a for a in archs if a.endswith("-emu") and "machine" in archs[a]]
    if emulated:
        c.fail(f"archs.{emulated[0]}.machine", archs[emulated[0]]["machine"],
               "no machine: an emulated arch takes its arch's")
    ops = c.get(data, "ops", "", dict, "an object mapping op name to its spec")
    if not ops:
        c.fail("ops", ops, "at least one op")
    for name, op in ops.items():
        if not re.fullmatch(r"[A-Za-z0-9_]+", name):
            c.fail(f"ops.{name}", name, "an op name of letters, digits and '_'")
        if not isinstance(op, dict):
            c.fail(f"ops.{name}", op, "an object with keys axes, kernels")
        _check_op(c, op, f"ops.{name}", list(archs), Path(root) / "op_sources" / name if root else None)


def _check_op(c: _Checker, op: dict, where: str, archs: list, op_dir: Path | None) -> None:
    c.get(op, "description", where, str, "a string", optional=True)
    axes = c.get(op, "axes", where, list, "a list of axis objects {name, define, values | buckets}")
    seen_axes: dict = {}
    for i, a in enumerate(axes):
        w = f"{where}.axes[{i}]"
        if not isinstance(a, dict):
            c.fail(w, a, "an axis object {name, define, values | buckets}")
        name = c.name(a, "name", w)
        if name in seen_axes:
            c.fail(f"{w}.name", name, "a name not used by another axis of the op")
        c.identifier(a, "define", w)
        if a.get("buckets", False) is True:
            c.get(a, "prefix", w, str, "a string", optional=True)
            if "values" in a:
                c.fail(f"{w}.values", a["values"], "no values on a bucketed axis (kernels give their buckets)")
        else:
            values = c.get(a, "values", w, dict, "an object mapping each value name to its define integer")
            if not values:
                c.fail(f"{w}.values", values, "at least one value")
            for v, n in values.items():
                if not re.fullmatch(r"[A-Za-z0-9_]+", v) or not isinstance(n, int) or isinstance(n, bool):
                    c.fail(f"{w}.values.{v}", n, "value names of letters, digits and '_' mapped to integers")
        seen_axes[name] = a
    _check_exclude(c, op, where, seen_axes)
    _check_warm_default(c, op, where, seen_axes)
    kernels = c.get(op, "kernels", where, list, "a non-empty list of kernel objects")
    if not kernels:
        c.fail(f"{where}.kernels", kernels, "a non-empty list of kernel objects")
    seen = set()
    for i, k in enumerate(kernels):
        w = f"{where}.kernels[{i}]"
        if not isinstance(k, dict):
            c.fail(w, k, "a kernel object")
        _check_kernel(c, k, w, archs, seen_axes, op_dir)
        if k["name"] in seen:
            c.fail(f"{w}.name", k["name"], "a name not used by another kernel of the op")
        seen.add(k["name"])


def _check_exclude(c: _Checker, op: dict, where: str, axes: dict) -> None:
    """`exclude` (the op's, or its warm_default's): a list of objects, each naming two or more enumerated axes of the
    op, each with a non-empty list of its values; a combination matching every named axis is no variant (the op's)
    or not in the default set (warm_default's)."""
    entries = c.get(op, "exclude", where, list, "a list of objects {axis name: [values], ...}", optional=True)
    enumerated = [n for n, a in axes.items() if a.get("buckets", False) is not True]
    for i, e in enumerate(entries or []):
        w = f"{where}.exclude[{i}]"
        if not isinstance(e, dict) or len(e) < 2:
            c.fail(w, e, "an object naming two or more enumerated axes of the op, each with a list of its values "
                         "(to drop a value everywhere, remove it from its axis)")
        for name, values in e.items():
            if name not in enumerated:
                c.fail(f"{w}.{name}", values, f"an enumerated axis of the op ({', '.join(enumerated)})")
            c.str_list(e, name, w, choices=list(axes[name]["values"]))


WARM_DEFAULT_KEYS = ("axes", "exclude", "first_choice_only", "why")


def _check_warm_default(c: _Checker, op: dict, where: str, axes: dict) -> None:
    """`warm_default`: an object with optional `axes` ({enumerated axis name: non-empty list of its values}: the
    values the default set keeps), `exclude` (combinations it leaves out, entries as the op's exclude list's),
    `first_choice_only` (a bool) and `why` (a string saying why)."""
    wd = c.get(op, "warm_default", where, dict, "an object with keys " + ", ".join(WARM_DEFAULT_KEYS), optional=True)
    if wd is None:
        return
    w = f"{where}.warm_default"
    for key in wd:
        if key not in WARM_DEFAULT_KEYS:
            c.fail(f"{w}.{key}", wd[key], "one of the keys " + ", ".join(WARM_DEFAULT_KEYS))
    c.get(wd, "why", w, str, "a string", optional=True)
    c.get(wd, "first_choice_only", w, bool, "true or false", optional=True)
    chosen = c.get(wd, "axes", w, dict, "an object {enumerated axis name: [values the default set keeps]}",
                   optional=True) or {}
    enumerated = [n for n, a in axes.items() if a.get("buckets", False) is not True]
    for name in chosen:
        if name not in enumerated:
            c.fail(f"{w}.axes.{name}", chosen[name], f"an enumerated axis of the op ({', '.join(enumerated)}; "
                                                      "every bucket of a bucketed axis is in the default set)")
        c.str_list(chosen, name, f"{w}.axes", choices=list(axes[name]["values"]))
    _check_exclude(c, wd, w, axes)


def _check_kernel(c: _Checker, k: dict, w: str, archs: list, axes: dict, op_dir: Path | None) -> None:
    c.name(k, "name", w)
    c.identifier(k, "symbol", w)
    source = c.get(k, "source", w, str, "a file name inside op_sources/<op>/")
    if not source or "/" in source or source.startswith("."):
        c.fail(f"{w}.source", source, "a file name inside op_sources/<op>/")
    if op_dir is not None and not (op_dir / source).is_file():
        c.fail(f"{w}.source", source, f"a file that exists in {op_dir}")
    c.str_list(k, "archs", w, choices=archs)
    c.get(k, "declines_at_run_time", w, str,
          "a string: the calls the kernel leaves to the kernels after it at run time", optional=True)
    given = c.get(k, "axes", w, dict, "an object: axis name -> accepted values or buckets", optional=True) or {}
    for name in given:
        if name not in axes:
            c.fail(f"{w}.axes.{name}", given[name], f"an axis of the op ({', '.join(axes)})")
    for name, axis in axes.items():
        spec, ws = given.get(name), f"{w}.axes.{name}"
        if axis.get("buckets", False) is True:
            if not isinstance(spec, dict):
                c.fail(ws, spec, "an object {min, max, step, buckets} (required for a bucketed axis)")
            lo, hi, step = (c.get(spec, key, ws, int, "a positive integer") for key in ("min", "max", "step"))
            if lo <= 0 or step <= 0 or hi < lo:
                c.fail(ws, spec, "0 < min <= max and step > 0")
            buckets = c.get(spec, "buckets", ws, list, "a non-empty list of integers")
            if not buckets or not all(isinstance(b, int) and not isinstance(b, bool) for b in buckets):
                c.fail(f"{ws}.buckets", buckets, "a non-empty list of integers")
            if max(buckets) < hi:
                c.fail(f"{ws}.buckets", buckets, f"a bucket >= max ({hi})")
        elif spec is not None:
            c.str_list(given, name, f"{w}.axes", choices=list(axis["values"]))
