"""ctypes binding of the C ABI of the JIT runtime (jit/runtime/rtc_abi.h): library loading, status codes -> exceptions.

Each op's argument block is built from the runtime's own description of it (rtc_ops_json), never
declared here: the C++ list in jit/ops/<op>/args.h is its one definition.
"""
from __future__ import annotations

import ctypes
import json
import os
import site
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Loadable by file path too (the cache tests' child processes skip the package's torch import). The library
# is built into the package's top folder (rtcattn/librtcattn_jit.so), one above this engine's.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
LIB_NAME = f"lib{_PACKAGE_DIR.name}_jit.so"
LIB_PATH = _PACKAGE_DIR / LIB_NAME


class CompileError(RuntimeError):
    """The kernel text did not compile; the message names the key, arch, compiler log and saved source."""


class NoCompileError(RuntimeError):
    """RTCATTN_NO_COMPILE=1 and the code object is in no cache."""


class UnavailableError(RuntimeError):
    """No compiler, driver or backend for the request on this machine."""


RTC_OK, RTC_ERR_ARG, RTC_ERR_COMPILE, RTC_ERR_LOAD, RTC_ERR_LAUNCH = 0, 1, 2, 3, 4
RTC_ERR_NO_COMPILE, RTC_ERR_UNAVAILABLE, RTC_ERR_INTERNAL = 5, 6, 7
_EXCEPTIONS = {RTC_ERR_ARG: ValueError, RTC_ERR_COMPILE: CompileError,
               RTC_ERR_NO_COMPILE: NoCompileError, RTC_ERR_UNAVAILABLE: UnavailableError}
ORIGINS = ("compile", "memory", "user_cache", "system_cache")


class Source(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("text", ctypes.c_char_p)]


class BuildRequest(ctypes.Structure):
    _fields_ = [("op", ctypes.c_char_p), ("variant", ctypes.c_char_p), ("arch", ctypes.c_char_p),
                ("compiler", ctypes.c_char_p), ("kernel_symbol", ctypes.c_char_p), ("main", Source),
                ("headers", ctypes.POINTER(Source)), ("n_headers", ctypes.c_int),
                ("options", ctypes.POINTER(ctypes.c_char_p)), ("n_options", ctypes.c_int),
                ("package_version", ctypes.c_char_p)]


class BuildResultC(ctypes.Structure):
    _fields_ = [("program", ctypes.c_uint64), ("path", ctypes.c_char * 1024),
                ("compiler_id", ctypes.c_char * 64), ("cache_name", ctypes.c_char * 256),
                ("compile_ms", ctypes.c_double), ("total_ms", ctypes.c_double),
                ("origin", ctypes.c_int), ("size", ctypes.c_uint64)]


class MemRange(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("bytes", ctypes.c_uint64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("vendor", ctypes.c_char_p), ("device", ctypes.c_int), ("stream", ctypes.c_void_p),
                ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("ranges", ctypes.POINTER(MemRange)), ("n_ranges", ctypes.c_int)]


def _load() -> ctypes.CDLL:
    if not LIB_PATH.is_file():
        raise ImportError(f"rtcattn runtime library not found at {LIB_PATH}; build it with "
                          "`pip install -e .` or `python setup.py build_ext --inplace` in the source tree")
    try:
        return ctypes.CDLL(str(LIB_PATH))
    except OSError as e:
        raise ImportError(f"cannot load the rtcattn runtime library {LIB_PATH}: {e}; rebuild it with "
                          "`python setup.py build_ext --inplace`") from e


_lib = _load()
_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_SIGNATURES = {
    "rtc_last_error": ([], ctypes.c_char_p),
    "rtc_version": ([], ctypes.c_char_p),
    "rtc_knob_get": ([ctypes.c_char_p, ctypes.c_char_p, _SZ], _I),
    "rtc_set_package_cache_dir": ([ctypes.c_char_p], _I),
    "rtc_add_library_dir": ([ctypes.c_char_p], _I),
    "rtc_sha256_hex": ([_P, _SZ, ctypes.c_char_p], _I),
    "rtc_build": ([ctypes.POINTER(BuildRequest), ctypes.c_char_p, ctypes.POINTER(BuildResultC)], _I),
    "rtc_program_bytes": ([ctypes.c_uint64, ctypes.POINTER(_P), ctypes.POINTER(_SZ)], _I),
    "rtc_program_log": ([ctypes.c_uint64, ctypes.POINTER(_P), ctypes.POINTER(_SZ)], _I),
    "rtc_program_path": ([ctypes.c_uint64, ctypes.c_char_p, _SZ, ctypes.POINTER(_SZ)], _I),
    "rtc_cache_check_entry": ([_P, _SZ, ctypes.c_char_p, ctypes.c_char_p, _SZ, ctypes.POINTER(_I)], _I),
    "rtc_info_json": ([ctypes.c_char_p, _SZ, ctypes.POINTER(_SZ)], _I),
    "rtc_cache_clear": ([ctypes.c_char_p, ctypes.POINTER(_I)], _I),
    "rtc_cache_prepare": ([ctypes.c_char_p, ctypes.c_char_p, _SZ, ctypes.POINTER(_SZ)], _I),
    "rtc_device_count": ([ctypes.c_char_p, ctypes.POINTER(_I)], _I),
    "rtc_launch": ([ctypes.c_uint64, ctypes.POINTER(LaunchConfig), _P, _SZ], _I),
    "rtc_ops_json": ([ctypes.c_char_p, _SZ, ctypes.POINTER(_SZ)], _I),
    "rtc_op_supports": ([ctypes.c_char_p, ctypes.c_char_p, _P, _SZ, ctypes.c_char_p, ctypes.c_char_p, _SZ,
                         ctypes.POINTER(_I)], _I),
    "rtc_op_workspace_bytes": ([ctypes.c_char_p, ctypes.c_char_p, _P, _SZ, ctypes.POINTER(ctypes.c_int64)], _I),
    "rtc_op_plan_json": ([ctypes.c_char_p, ctypes.c_char_p, _P, _SZ, ctypes.c_char_p, _SZ, ctypes.POINTER(_SZ)], _I),
    "rtc_op_launch": ([ctypes.c_uint64, ctypes.c_char_p, ctypes.c_char_p, _P, _SZ, ctypes.c_char_p, _I, _P], _I),
}
for _name, (_args, _res) in _SIGNATURES.items():
    _fn = getattr(_lib, _name)
    _fn.argtypes, _fn.restype = _args, _res


def _check(status: int) -> None:
    if status != RTC_OK:
        message = (_lib.rtc_last_error() or b"").decode(errors="replace")
        raise _EXCEPTIONS.get(status, RuntimeError)(message)


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s) if isinstance(s, os.PathLike) else str(s).encode()


def version() -> str:
    return _lib.rtc_version().decode()


_knobs: dict = {}   # (name, its raw value in the environment) -> the runtime's checked value
_KNOB_PREFIX = _PACKAGE_DIR.name.upper() + "_"


def knob(name: str) -> str:
    """The checked value of an RTCATTN_* variable ("" when unset); ValueError names a bad value. Asked of the
    runtime once per (name, raw value): every call of an op reads a few."""
    env = name if name.startswith(_KNOB_PREFIX) else _KNOB_PREFIX + name  # the runtime takes either form
    key = (name, os.environ.get(env))
    hit = _knobs.get(key)
    if hit is not None:
        return hit
    buf = ctypes.create_string_buffer(4096)
    _check(_lib.rtc_knob_get(_b(name), buf, len(buf)))
    value = _knobs[key] = buf.value.decode()
    return value


def set_package_cache_dir(path: str) -> None:
    _check(_lib.rtc_set_package_cache_dir(_b(str(path))))


def add_library_dir(path: str) -> None:
    _check(_lib.rtc_add_library_dir(_b(str(path))))


def sha256_hex(data: bytes) -> str:
    out = ctypes.create_string_buffer(65)
    _check(_lib.rtc_sha256_hex(data, len(data), out))
    return out.value.decode()


@dataclass(frozen=True)
class BuildResult:
    program: int
    path: str
    compiler_id: str
    cache_name: str
    compile_ms: float
    total_ms: float
    origin: str          # compile | memory | user_cache | system_cache
    size: int

    def code(self) -> bytes:
        return program_bytes(self.program)

    def log(self) -> str:
        return program_log(self.program)


def build(op: str, variant: str, arch: str, kernel_symbol: str, main: tuple[str, str],
          headers: Sequence[tuple[str, str]] = (), options: Sequence[str] = (), *,
          compiler: str = "auto", package_version: str = "", cache_dir: str | None = None) -> BuildResult:
    """Key -> memory -> user cache -> system caches -> compile. main/headers are (include name, text)."""
    hdrs = (Source * max(1, len(headers)))(*[Source(_b(n), _b(t)) for n, t in headers])
    opts = (ctypes.c_char_p * max(1, len(options)))(*[_b(o) for o in options])
    req = BuildRequest(_b(op), _b(variant), _b(arch), _b(compiler), _b(kernel_symbol),
                       Source(_b(main[0]), _b(main[1])), hdrs, len(headers), opts, len(options),
                       _b(package_version))
    res = BuildResultC()
    _check(_lib.rtc_build(ctypes.byref(req), _b(None if cache_dir is None else str(cache_dir)), ctypes.byref(res)))
    return BuildResult(res.program, program_path(res.program), res.compiler_id.decode(), res.cache_name.decode(),
                       res.compile_ms, res.total_ms, ORIGINS[res.origin], res.size)


def program_path(program: int) -> str:
    """The program's cache file, whole (BuildResultC.path is cut at 1023 bytes); "" when held in memory only."""
    n = ctypes.c_size_t()
    _check(_lib.rtc_program_path(program, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(_lib.rtc_program_path(program, buf, len(buf), ctypes.byref(n)))
    return os.fsdecode(buf.value)


def check_cache_entry(data: bytes, key_text) -> str | None:
    """For tests: None when the runtime's entry parser accepts data as the entry of key_text, else why not."""
    why, valid = ctypes.create_string_buffer(1024), ctypes.c_int()
    key = key_text.encode() if isinstance(key_text, str) else bytes(key_text)
    _check(_lib.rtc_cache_check_entry(data, len(data), key, why, len(why), ctypes.byref(valid)))
    return None if valid.value else why.value.decode(errors="replace")


def program_bytes(program: int) -> bytes:
    data, size = ctypes.c_void_p(), ctypes.c_size_t()
    _check(_lib.rtc_program_bytes(program, ctypes.byref(data), ctypes.byref(size)))
    return ctypes.string_at(data, size.value)


def program_log(program: int) -> str:
    """The compiler log (NVRTC: ptxas -v registers/spills); "" when a cached entry has no .log beside it."""
    text, size = ctypes.c_void_p(), ctypes.c_size_t()
    _check(_lib.rtc_program_log(program, ctypes.byref(text), ctypes.byref(size)))
    return ctypes.string_at(text, size.value).decode(errors="replace") if size.value else ""


def _json(fn, *args) -> dict:
    """Calls a runtime function of the form f(..., buf, n, *len) that writes JSON: once for the size, once to fill."""
    n = ctypes.c_size_t()
    _check(fn(*args, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 4096)  # room for a dir that grew meanwhile (info)
    _check(fn(*args, buf, len(buf), ctypes.byref(n)))
    return json.loads(buf.value.decode())


def info() -> dict:
    return _json(_lib.rtc_info_json)


def clear_cache(cache_dir: str | None = None) -> int:
    removed = ctypes.c_int()
    _check(_lib.rtc_cache_clear(_b(None if cache_dir is None else str(cache_dir)), ctypes.byref(removed)))
    return removed.value


def prepare_cache(cache_dir: str | None = None) -> str:
    """Makes the user cache dir (or cache_dir) as the first compile would; "" when the runtime will use it, else
    the rest of a sentence "cache dir <dir> ..." saying why not."""
    n = ctypes.c_size_t()
    arg = _b(None if cache_dir is None else str(cache_dir))
    _check(_lib.rtc_cache_prepare(arg, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(_lib.rtc_cache_prepare(arg, buf, len(buf), ctypes.byref(n)))
    return buf.value.decode(errors="replace")


def device_count(vendor: str) -> int:
    n = ctypes.c_int()
    _check(_lib.rtc_device_count(_b(vendor), ctypes.byref(n)))
    return n.value


def launch(program: int, vendor: str, device: int, grid: Sequence[int], block: Sequence[int],
           params: bytes, *, stream: int = 0, shared_bytes: int = 0, ranges: Sequence[tuple] = ()) -> None:
    """ranges: (address, bytes) of the buffers the kernel may touch (the emulator checks every access)."""
    mem = (MemRange * max(1, len(ranges)))(*[MemRange(a, n) for a, n in ranges])
    cfg = LaunchConfig(_b(vendor), device, stream or None, (ctypes.c_uint * 3)(*grid),
                       (ctypes.c_uint * 3)(*block), shared_bytes, mem, len(ranges))
    _check(_lib.rtc_launch(program, ctypes.byref(cfg), params, len(params)))


# ---- ops: argument blocks described by the runtime --------------------------------------------------

_KINDS = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}
_ARG_TYPES: dict = {}


def ops_description() -> dict:
    """{op: {"args_size", "fields", "kernels"}} as the runtime registered them."""
    return _json(_lib.rtc_ops_json)


def _args_type(op: str, desc: dict) -> type:
    """A ctypes Structure with the runtime's fields of op's argument block, checked field by field."""
    fields = []
    for f in desc["fields"]:
        t = _KINDS[f["kind"]]
        fields.append((f["name"], t * f["count"] if f["count"] > 1 else t))
    cls = type(f"{op}_args", (ctypes.Structure,), {"_fields_": fields})
    got = [(f["name"], getattr(cls, f["name"]).offset) for f in desc["fields"]]
    want = [(f["name"], f["offset"]) for f in desc["fields"]]
    if got != want or ctypes.sizeof(cls) != desc["args_size"]:
        raise ImportError(f"the argument block of {op} does not lay out in ctypes as the runtime declares it "
                          f"(size {ctypes.sizeof(cls)} vs {desc['args_size']}, offsets {got} vs {want}); "
                          "rebuild the runtime")
    return cls


def op_args(op: str, **values) -> ctypes.Structure:
    """A zeroed argument block of op with the given fields set (sequences fill array fields)."""
    cls = _ARG_TYPES.get(op)
    if cls is None:
        ops = ops_description()
        if op not in ops:
            raise ValueError(f"op={op!r} is not registered in the runtime; registered: {', '.join(ops)}")
        cls = _ARG_TYPES.setdefault(op, _args_type(op, ops[op]))
    args = cls()
    for name, value in values.items():
        if not hasattr(cls, name):
            raise ValueError(f"{name!r} is not a field of {op}'s argument block; fields: "
                             f"{', '.join(n for n, _ in cls._fields_)}")
        if isinstance(value, (list, tuple)):
            getattr(args, name)[:] = value
        else:
            setattr(args, name, value)
    return args


def _block(args: ctypes.Structure):
    return ctypes.byref(args), ctypes.sizeof(args)


def op_supports(op: str, kernel: str, args: ctypes.Structure, vendor: str) -> str | None:
    """None when the kernel takes these runtime arguments (alignment, strides) on vendor, else why not."""
    why, ok = ctypes.create_string_buffer(1024), ctypes.c_int()
    _check(_lib.rtc_op_supports(_b(op), _b(kernel), *_block(args), _b(vendor), why, len(why), ctypes.byref(ok)))
    return None if ok.value else why.value.decode(errors="replace")


def op_workspace_bytes(op: str, kernel: str, args: ctypes.Structure) -> int:
    n = ctypes.c_int64()
    _check(_lib.rtc_op_workspace_bytes(_b(op), _b(kernel), *_block(args), ctypes.byref(n)))
    return n.value


def op_plan(op: str, kernel: str, args: ctypes.Structure) -> dict:
    """The kernel's launch plan for these arguments (grids, splits, workspace), knobs applied."""
    return _json(_lib.rtc_op_plan_json, _b(op), _b(kernel), *_block(args))


def op_launch(program: int, op: str, kernel: str, args: ctypes.Structure, vendor: str, device: int,
              stream: int = 0) -> None:
    _check(_lib.rtc_op_launch(program, _b(op), _b(kernel), *_block(args), _b(vendor), device, stream or None))


def _register_wheel_library_dirs() -> None:
    """pip's CUDA wheels (nvidia-cuda-nvrtc, ...) live in site-packages/nvidia/*/lib: let the runtime look there."""
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # some virtualenvs lack site.getsitepackages
        pass
    seen = set()
    for d in dirs:
        if d and d not in seen and os.path.isdir(os.path.join(d, "nvidia")):
            seen.add(d)
            add_library_dir(d)


_register_wheel_library_dirs()
