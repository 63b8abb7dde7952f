"""The op manifest (configs/ops.json): parsed as JSON, validated against its schema, enumerated into build requests."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from . import paths

__all__ = ["ManifestError", "Manifest", "KernelSpec", "OpSpec", "Variant", "BuildRequest", "load",
           "bucket_for", "variant_name"]


@dataclass(frozen=True)
class KernelSpec:
    name: str
    kind: str
    symbol: str
    source: str
    headers: tuple
    archs: tuple
    head_dim_min: int
    head_dim_max: int
    head_dim_step: int
    buckets: tuple
    when: dict = field(default_factory=dict)  # condition name -> accepted values (see dispatch)

    def supports_head_dim(self, d: int) -> bool:
        return self.head_dim_min <= d <= self.head_dim_max and (d - self.head_dim_min) % self.head_dim_step == 0

    def head_dims(self) -> list:
        return list(range(self.head_dim_min, self.head_dim_max + 1, self.head_dim_step))


@dataclass(frozen=True)
class OpSpec:
    name: str
    kernels: tuple          # in order of preference: dispatch takes the first that fits
    axes: dict              # axis name -> {"values": [...], "define": str, "map": {...}}
    arch_options: dict      # arch -> {"compiler": [...], "flags": [...]}

    def kernel(self, name: str) -> KernelSpec:
        for k in self.kernels:
            if k.name == name:
                return k
        raise ValueError(f"kernel={name!r} is not a kernel of op {self.name!r}; "
                         f"accepted: {', '.join(k.name for k in self.kernels)}")

    def axis_values(self, axis: str) -> list:
        return list(self.axes[axis]["values"])


@dataclass(frozen=True)
class Variant:
    op: str
    kernel: str
    arch: str
    layout: str
    round_mode: str
    head_dim_bucket: int


@dataclass(frozen=True)
class BuildRequest:
    """Everything the C ABI's rtc_build_request needs; compilers is the manifest's order of preference."""
    op: str
    variant: str
    arch: str
    compilers: tuple
    kernel_symbol: str
    kernel_kind: str
    main: tuple             # (include name, text)
    headers: tuple          # ((include name, text), ...)
    options: tuple
    package_version: str


def bucket_for(kernel: KernelSpec, head_dim: int) -> int:
    """The smallest compiled head-dim bucket that holds head_dim (kernels loop to the runtime D)."""
    for b in sorted(kernel.buckets):
        if b >= head_dim:
            return b
    raise ValueError(f"head_dim={head_dim} exceeds every bucket of kernel {kernel.name!r}; "
                     f"accepted: {kernel.head_dim_min}..{kernel.head_dim_max}")


def variant_name(v: Variant) -> str:
    """Readable name, e.g. "bshd-rtne-d128"; kernels other than the baseline prefix their name."""
    base = f"{v.layout}-{v.round_mode}-d{v.head_dim_bucket}"
    return base if v.kernel == "baseline" else f"{v.kernel}-{base}"


class Manifest:
    def __init__(self, data: dict, path: Path, root: Path):
        self.path, self.root, self.schema = path, root, data["schema"]
        self.ops = {name: _op_spec(name, op) for name, op in data["ops"].items()}

    def op(self, name: str = "attention_fwd") -> OpSpec:
        if name not in self.ops:
            raise ValueError(f"op={name!r} is not in {self.path}; accepted: {', '.join(self.ops)}")
        return self.ops[name]

    def archs(self, op: str = "attention_fwd") -> list:
        seen: list = []
        for k in self.op(op).kernels:
            seen += [a for a in k.archs if a not in seen]
        return seen

    def variants(self, op: str = "attention_fwd", archs=None, kernels=None, layouts=None,
                 round_modes=None, buckets=None) -> Iterator[Variant]:
        """Every variant, optionally filtered on each axis (None = all)."""
        spec = self.op(op)
        for k in spec.kernels:
            if kernels is not None and k.name not in kernels:
                continue
            for arch in k.archs:
                if archs is not None and arch not in archs:
                    continue
                for layout in spec.axis_values("layout"):
                    if layouts is not None and layout not in layouts:
                        continue
                    for mode in spec.axis_values("round_mode"):
                        if round_modes is not None and mode not in round_modes:
                            continue
                        for b in k.buckets:
                            if buckets is None or b in buckets:
                                yield Variant(op, k.name, arch, layout, mode, b)

    def request(self, v: Variant, package_version: str) -> BuildRequest:
        spec = self.op(v.op)
        kernel = spec.kernel(v.kernel)
        arch_opt = spec.arch_options[v.arch]
        defines = [_define(spec.axes["layout"], v.layout), _define(spec.axes["round_mode"], v.round_mode),
                   f"-D{spec.axes['head_dim_bucket']['define']}={v.head_dim_bucket}"]
        return BuildRequest(
            op=v.op, variant=variant_name(v), arch=v.arch, compilers=tuple(arch_opt["compiler"]),
            kernel_symbol=kernel.symbol, kernel_kind=kernel.kind,
            main=(kernel.source, _read_text(self.root / "op_sources" / kernel.source)),
            headers=tuple(_headers_for(kernel, self.root, v.arch.endswith("-emu"))),
            options=tuple(defines + list(arch_opt["flags"])), package_version=package_version)


def _define(axis: dict, value: str) -> str:
    return f"-D{axis['define']}={axis['map'][value]}"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise FileNotFoundError(f"kernel text {path} cannot be read ({e.strerror})") from e


def _headers_for(kernel: KernelSpec, root: Path, emulated: bool) -> list:
    """The headers the kernel can see: the #include closure of its source, by include name.

    Only these go into the request (and so into the cache key): editing an unrelated header leaves
    this kernel's cached code objects valid. emu/ headers are reached only for emulated archs.
    """
    common = root / "csrc_common"
    missing = [h for h in kernel.headers if not (common / h).is_file()]
    if missing:
        raise FileNotFoundError(f"kernel {kernel.name!r} lists headers {missing} that are not in {common}")
    found: dict = {}
    pending = [(root / "op_sources" / kernel.source).resolve()]
    seen = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _INCLUDE.findall(_read_text(path)):
            hit = _resolve_include(name, path.parent, common)
            if hit is None:
                continue  # a system header, or a fallback spelling for builds outside the JIT
            rel = hit.relative_to(common).as_posix()
            if rel.split("/")[0] == "emu" and not emulated:
                continue
            found.setdefault(rel, _read_text(hit))
            pending.append(hit)
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


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def _resolve_include(name: str, here: Path, common: Path) -> Optional[Path]:
    """An include as the compilers resolve it: beside the including file, then from csrc_common."""
    common = common.resolve()
    for base in (here, common):
        cand = (base / name).resolve()
        if cand.is_file() and common in cand.parents:
            return cand
    return None


def _op_spec(name: str, op: dict) -> OpSpec:
    kernels = tuple(
        KernelSpec(name=k["name"], kind=k["kind"], symbol=k["symbol"], source=k["source"],
                   headers=tuple(k["headers"]), archs=tuple(k["archs"]),
                   head_dim_min=k["head_dims"]["min"], head_dim_max=k["head_dims"]["max"],
                   head_dim_step=k["head_dims"]["step"], buckets=tuple(sorted(k["head_dim_buckets"])),
                   when=dict(k.get("when", {})))
        for k in op["kernels"])
    return OpSpec(name=name, kernels=kernels, axes=op["axes"], arch_options=op["arch_options"])


_CACHE: dict = {}


def load(path: Optional[Path] = None, root: Optional[Path] = None) -> Manifest:
    """Parse and validate the manifest; cached per (path, mtime) so edits during development are seen."""
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

COMPILERS = ("auto", "clang", "hiprtc", "nvrtc", "host")
WHEN_KEYS = ("head_dim", "layout", "round_mode", "arch")


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


def check_manifest(data, path, root=None) -> None:
    """Raises ManifestError on the first deviation from the schema."""
    c = _Checker(path)
    if not isinstance(data, dict):
        c.fail("", data, "a JSON object with keys 'schema' and 'ops'")
    schema = c.get(data, "schema", "", int, "the integer 1")
    if schema != 1:
        c.fail("schema", schema, "1")
    ops = c.get(data, "ops", "", dict, "an object mapping op name to its spec")
    if not ops:
        c.fail("ops", ops, "at least one op")
    for name, op in ops.items():
        if not isinstance(op, dict):
            c.fail(f"ops.{name}", op, "an object with keys kernels, axes, arch_options")
        _check_op(c, op, f"ops.{name}")


def _check_op(c: _Checker, op: dict, where: str) -> None:
    c.get(op, "description", where, str, "a string", optional=True)
    axes = c.get(op, "axes", where, dict, "an object with axes layout, round_mode, head_dim_bucket")
    for axis in ("layout", "round_mode"):
        _check_axis(c, c.get(axes, axis, f"{where}.axes", dict, "an object"), f"{where}.axes.{axis}")
    hd = c.get(axes, "head_dim_bucket", f"{where}.axes", dict, "an object with key 'define'")
    c.identifier(hd, "define", f"{where}.axes.head_dim_bucket")
    arch_options = c.get(op, "arch_options", where, dict, "an object mapping arch to its options")
    for arch, opt in arch_options.items():
        w = f"{where}.arch_options.{arch}"
        if not isinstance(opt, dict):
            c.fail(w, opt, "an object with keys compiler, flags")
        c.str_list(opt, "compiler", w, choices=COMPILERS)
        c.str_list(opt, "flags", w, nonempty=False)
    kernels = c.get(op, "kernels", where, list, "a non-empty list of kernel objects")
    if not kernels:
        c.fail(f"{where}.kernels", kernels, "a non-empty list of kernel objects")
    seen = set()
    for i, k in enumerate(kernels):
        w = f"{where}.kernels[{i}]"
        if not isinstance(k, dict):
            c.fail(w, k, "a kernel object")
        _check_kernel(c, k, w, list(arch_options), axes)
        if k["name"] in seen:
            c.fail(f"{w}.name", k["name"], "a name not used by another kernel of the op")
        seen.add(k["name"])


def _check_axis(c: _Checker, axis: dict, where: str) -> None:
    values = c.str_list(axis, "values", where)
    c.identifier(axis, "define", where)
    mapping = c.get(axis, "map", where, dict, "an object mapping each value to an integer")
    for v in values:
        if not isinstance(mapping.get(v), int) or isinstance(mapping.get(v), bool):
            c.fail(f"{where}.map.{v}", mapping.get(v), "an integer for every listed value")


def _check_kernel(c: _Checker, k: dict, w: str, archs: list, axes: dict) -> None:
    name = c.get(k, "name", w, str, "a non-empty string")
    if not name or not all(ch.isalnum() or ch == "_" for ch in name):
        c.fail(f"{w}.name", name, "a non-empty name of letters, digits and '_'")
    c.get(k, "kind", w, str, "a kernel kind known to the runtime, e.g. 'baseline'")
    c.identifier(k, "symbol", w)
    source = c.get(k, "source", w, str, "a file name inside op_sources/")
    if not source or "/" in source or source.startswith("."):
        c.fail(f"{w}.source", source, "a file name inside op_sources/")
    c.str_list(k, "headers", w, nonempty=False)
    c.str_list(k, "archs", w, choices=archs)
    hd = c.get(k, "head_dims", w, dict, "an object {min, max, step}")
    lo, hi, step = (c.get(hd, key, f"{w}.head_dims", int, "a positive integer") for key in ("min", "max", "step"))
    if lo <= 0 or step <= 0 or hi < lo:
        c.fail(f"{w}.head_dims", hd, "0 < min <= max and step > 0")
    buckets = c.get(k, "head_dim_buckets", w, list, "a non-empty list of integers")
    if not buckets or not all(isinstance(b, int) and not isinstance(b, bool) for b in buckets):
        c.fail(f"{w}.head_dim_buckets", buckets, "a non-empty list of integers")
    if max(buckets) < hi:
        c.fail(f"{w}.head_dim_buckets", buckets, f"a bucket >= head_dims.max ({hi})")
    when = c.get(k, "when", w, dict, f"an object with keys among {', '.join(WHEN_KEYS)}", optional=True)
    for key, accepted in (when or {}).items():
        if key not in WHEN_KEYS:
            c.fail(f"{w}.when.{key}", accepted, f"a condition among {', '.join(WHEN_KEYS)}")
        if not isinstance(accepted, list) or not accepted:
            c.fail(f"{w}.when.{key}", accepted, "a non-empty list of accepted values")

