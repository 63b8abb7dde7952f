"""For any op of the manifest: chooses arch, kernel and variant for a call, builds it (once per process) and
launches it.

An op's Python stub fills its argument block (from the runtime's description of it) and says which
axis values the call has; everything else here is the same for every op.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import manifest, paths, record

_lock = threading.Lock()
_lib_module = None
_programs: dict = {}     # (variant, cache_dir, extra options) -> build result; the C++ runtime caches too
_plans: dict = {}        # (op, arch, call values, pinned kernel) -> _plan(): the manifest part of a selection
_gpu_facts: dict = {}    # GPU device index -> (arch, SMs/CUs): asked of torch and the manifest once per device
_logged: set = set()


@dataclass(frozen=True)
class Pins:
    """What a lab tool or a test pins for the calls inside `pinned(...)`: a kernel (no fallback), extra
    compile options (a separate cache entry), argument-block fields set before every launch."""
    kernel: str | None = None
    options: tuple = ()
    args: tuple = ()  # ((field, value), ...)


_pins: contextvars.ContextVar = contextvars.ContextVar("rtcattn_pins", default=Pins())


@contextlib.contextmanager
def pinned(kernel: str | None = None, options=(), **args):
    """Within the block, every call runs `kernel` (as the KERNEL knob does), built with `options`
    appended to the manifest's, with argument fields `args` (e.g. tail_split=4) set before launch."""
    token = _pins.set(Pins(kernel, tuple(options), tuple(sorted(args.items()))))
    try:
        yield
    finally:
        _pins.reset(token)


def lib():
    """The ctypes binding, loaded on first use; tells the runtime once where the package's own cache is."""
    global _lib_module
    if _lib_module is None:
        with _lock:
            if _lib_module is None:
                from . import _lib
                if _lib.version() != package_version():
                    raise ImportError(f"the runtime library {_lib.LIB_PATH} is version {_lib.version()} but the "
                                      f"package is {package_version()}; rebuild it with `python setup.py "
                                      "build_ext --inplace` or reinstall")
                cache = paths.package_cache_dir()
                if cache.is_dir():  # absent unless `warm --cache-dir` filled it at image build
                    _lib.set_package_cache_dir(str(cache))
                _check_runtime_knows_manifest(_lib)
                _lib_module = _lib
    return _lib_module


def _check_runtime_knows_manifest(_lib) -> None:
    """Every kernel of the manifest has host code registered in the runtime (one list, checked at load)."""
    registered = _lib.ops_description()
    for name, spec in manifest.load().ops.items():
        missing = [k.name for k in spec.kernels if k.name not in registered.get(name, {}).get("kernels", [])]
        if missing:
            raise ImportError(f"the runtime has no host code for {name} kernels {missing} of the manifest; "
                              f"registered: {registered.get(name, {}).get('kernels', [])}; rebuild the runtime")


def package_version() -> str:
    from .. import __version__
    return __version__


def knob(name: str) -> str:
    return lib().knob(name)


def log(msg: str) -> None:
    if knob("RTCATTN_LOG") == "1":
        print(f"rtcattn: {msg}", file=sys.stderr, flush=True)


def vendor_of(device: torch.device) -> str:
    if device.type == "cpu":
        return "host"
    return "hip" if torch.version.hip else "cuda"


def check_runnable(device: torch.device, emulate: str) -> None:
    """CPU tensors run only on the wave emulator; anything else needs a GPU of the matching vendor."""
    if device.type == "cpu" and not emulate:
        raise ValueError(f"q.device={device} is not supported: CPU tensors run only on the emulator and "
                         "RTCATTN_EMULATE is unset; accepted: CUDA/ROCm tensors, or CPU tensors with "
                         "RTCATTN_EMULATE=gfx942, gfx90a or gfx950")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"q.device={device} is not supported; accepted: cuda (CUDA or ROCm) or cpu "
                         "(with RTCATTN_EMULATE)")


def _cuda_arch(major: int, minor: int, known: list) -> str:
    exact = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    if exact in known:
        return exact
    # A cubin for sm_X0 runs on every sm_Xy with y >= 0 of the same major.
    same_major = sorted(a for a in known if a.startswith(f"sm_{major}") and a[3:5].isdigit()
                        and int(a[4]) <= minor)
    return same_major[-1] if same_major else exact


def arch_of(device: torch.device) -> str:
    """sm_XX on CUDA (sm_90 -> sm_90a), gfxNNN on ROCm (features stripped), <arch>-emu on the CPU emulator."""
    if device.type == "cpu":
        emulate = knob("RTCATTN_EMULATE")
        check_runnable(device, emulate)
        return f"{emulate}-emu"
    check_runnable(device, "")
    if torch.version.hip:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return _cuda_arch(major, minor, manifest.load().archs())


def emulated_cus(arch: str) -> int:
    """Compute units of an emulated part (the manifest's machine of its arch): the planners' input when the
    "device" is the CPU emulator; 1 where the manifest names no machine."""
    m = manifest.load().machine(arch)
    return m.cus if m else 1


def _num_cus(device: torch.device, arch: str) -> int:
    if device.type == "cpu":
        return emulated_cus(arch)
    return torch.cuda.get_device_properties(device).multi_processor_count


def device_facts(device: torch.device) -> tuple:
    """(arch, compute units) of device; a GPU's are fixed for the process, so they are looked up once."""
    if device.type == "cpu":  # the emulated arch follows RTCATTN_EMULATE, which may change between calls
        arch = arch_of(device)
        return arch, _num_cus(device, arch)
    index = device.index if device.index is not None else torch.cuda.current_device()
    facts = _gpu_facts.get(index)
    if facts is None:
        arch = arch_of(device)
        facts = _gpu_facts.setdefault(index, (arch, _num_cus(device, arch)))
    return facts


def arch_fields(arch: str, cus: int) -> dict:
    """The argument block's planner inputs for a device of arch with cus compute units: cus, the HBM bandwidth (GB/s)
    and LDS bytes per CU of the arch's reference part (the manifest's machine) and the arch itself (gfx_arch); 0,
    unknown, where the manifest names no machine: the NVIDIA archs, whose planners take the SM count only."""
    m = manifest.load().machine(arch)
    if m is None:
        return dict(num_cus=cus, hbm_gbps=0, lds_per_cu=0, gfx_arch=0)
    return dict(num_cus=cus, hbm_gbps=m.hbm_gbps, lds_per_cu=m.lds_per_cu, gfx_arch=m.gfx_arch)


def machine_fields(device: torch.device) -> dict:
    """arch_fields of device (its arch and compute units: device_facts)."""
    return arch_fields(*device_facts(device))


@dataclass(frozen=True)
class Selection:
    kernel: manifest.KernelSpec
    variant: manifest.Variant
    why: str   # why this kernel and not an earlier one in the manifest's order
    call: tuple = ()  # the call's ((axis, value), ...) it was chosen for: what RTCATTN_RECORD writes at launch


def _plan(op: str, arch: str, call: dict, kernel: str | None, m: manifest.Manifest | None) -> tuple:
    """Every kernel of the op in the manifest's order: (kernel, its variant, None) or (kernel, None, why not)."""
    m = m or manifest.load()
    spec = m.op(op)
    missing = [a.name for a in spec.axes if a.name not in call]
    if missing:  # an op stub that does not say its value on an axis of the manifest: a bug in the stub
        raise ValueError(f"the call of {op} gives no value for axes {missing} of the manifest; "
                         f"the op's stub must pass one value per axis ({', '.join(a.name for a in spec.axes)})")
    excluded = spec.why_excluded(call)
    if excluded:  # no kernel has a variant for it: the op's stub must map such a call to a compiled combination
        raise ValueError(f"the call of {op} ({_describe(arch, call)}) asks for no variant: {excluded}; the op's "
                         "stub must pass a combination of axis values the manifest compiles")
    if kernel is not None and kernel not in [k.name for k in spec.kernels]:
        raise ValueError(f"RTCATTN_KERNEL={kernel!r} is not accepted for op {op!r}; accepted: "
                         f"{', '.join(k.name for k in spec.kernels)}")
    plan = []
    for k in spec.kernels:
        if kernel is not None and k.name != kernel:
            continue
        why_not = spec.rejects(k, arch, call)
        v = None if why_not else m.variant_for(op, k.name, arch, call)
        plan.append((k, v, why_not))
    return tuple(plan)


def _pick(op: str, plan: tuple, supports: Callable | None, what: str, call: tuple = ()) -> Selection:
    """The first planned kernel that supports (None = ask nothing) accepts; its why lists the ones skipped."""
    skipped = []
    for k, v, why_not in plan:
        if why_not is None and supports is not None:
            why_not = supports(k)
        if why_not is None:
            return Selection(k, v, "first match" if not skipped else "fallback; " + "; ".join(skipped), call)
        skipped.append(f"{k.name}: {why_not}")
    raise ValueError(f"no kernel of {op} serves {what}; why not: {'; '.join(skipped)}")


def _describe(arch: str, call: dict) -> str:
    return ", ".join([f"arch={arch!r}"] + [f"{a}={v!r}" for a, v in call.items()])


def select(op: str, arch: str, call: dict, kernel: str | None = None, m: manifest.Manifest | None = None,
           supports: Callable | None = None) -> Selection:
    """The first kernel of the manifest (in its order of preference) whose conditions the call meets.

    call: the call's value for every axis of the op (bucketed axes: the integer, e.g. the head dim).
    supports(kernel) -> None or why not: asked of each kernel whose manifest conditions hold, for what
    only the call's arguments tell (pointer alignment, strides); a kernel it declines falls back to the next.
    """
    return _pick(op, _plan(op, arch, call, kernel, m), supports, _describe(arch, call) + f" (kernel={kernel!r})",
                 tuple(call.items()))


def runtime_check(op: str, args, vendor: str) -> Callable:
    """A supports() for select: the runtime's check of these arguments for each kernel (no device needed)."""
    return lambda k: lib().op_supports(op, k.name, args, vendor)


def choose(op: str, arch: str, call: dict, args, vendor: str) -> Selection:
    """select() with the runtime's check of args and the pins; logs (RTCATTN_LOG=1) each distinct choice once."""
    pinned_kernel = _pins.get().kernel
    forced = pinned_kernel or lib().knob("RTCATTN_KERNEL") or None  # a named kernel, no fallback
    key = (op, arch, tuple(call.items()), forced)
    plan = _plans.get(key)
    if plan is None:  # the plan reads the manifest: once per (op, arch, axis values) per process
        plan = _plans.setdefault(key, _plan(op, arch, call, forced, None))
    what = _describe(arch, call)
    if forced:
        what += f" with kernel {forced!r} pinned" if pinned_kernel else f" with RTCATTN_KERNEL={forced!r}"
    sel = _pick(op, plan, runtime_check(op, args, vendor), what, key[2])
    if (arch, sel.variant, sel.why) not in _logged:
        _logged.add((arch, sel.variant, sel.why))
        log(f"{op}: kernel {sel.kernel.name} ({sel.variant.name}, {arch}): {sel.why}")
    return sel


def build(variant: manifest.Variant, cache_dir: str | None = None, extra_options=()):
    """The built program of a variant: from this process's map, else through the C++ cache/compilers."""
    key = (variant, cache_dir, tuple(extra_options))
    hit = _programs.get(key)
    if hit is not None:
        return hit
    req = manifest.load().request(variant, package_version(), extra_options)
    result = lib().build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                         compiler=",".join(req.compilers), package_version=req.package_version,
                         cache_dir=cache_dir)
    with _lock:
        _programs.setdefault(key, result)
    return result


def select_for(op: str, device: torch.device, call: dict, args) -> Selection:
    """The kernel that runs op on device for args (its argument block, filled by the op's stub), with
    the pins applied; the runtime checks the arguments (sizes, extents, alignment) here, before any
    allocation or launch, and an error names the argument and its value."""
    check_knobs()
    arch, _ = device_facts(device)
    for name, value in _pins.get().args:
        setattr(args, name, value)
    return choose(op, arch, call, args, vendor_of(device))


def launch(op: str, device: torch.device, sel: Selection, args, workspace_bytes: int | None = None) -> None:
    """Builds (once) and launches the selected kernel; out pointers in args must be final.

    An op whose kernels need scratch memory has the fields workspace / workspace_bytes: dispatch
    allocates it through torch's caching allocator (repeated calls cost no device malloc). workspace_bytes: its
    size when the caller knows it (a repeat of a call: ops/repeat.py), else the kernel's host says.
    """
    vendor = vendor_of(device)
    program = build(sel.variant, extra_options=_pins.get().options).program
    if _record_to and sel.call:  # RTCATTN_RECORD: once per variant and call (a set lookup), before the launch
        record.note(_record_to, sel.variant, sel.call)
    nbytes = lib().op_workspace_bytes(op, sel.kernel.name, args) if workspace_bytes is None else workspace_bytes
    if nbytes > 0:
        check_fits(op, f"the workspace of kernel {sel.kernel.name}", nbytes, args, device)
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if vendor == "host":  # poisoned on the emulator, as its LDS is: a read of unwritten scratch shows up
            workspace.fill_(0xFF)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), nbytes
    index = 0 if device.type == "cpu" else (device.index if device.index is not None else torch.cuda.current_device())
    stream = torch.cuda.current_stream(device).cuda_stream if vendor != "host" else 0
    lib().op_launch(program, op, sel.kernel.name, args, vendor, index, stream)


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cpu":
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return torch.cuda.get_device_properties(device).total_memory


def check_fits(op: str, what: str, nbytes: int, args, device: torch.device) -> None:
    """A buffer larger than the device's memory means sizes no call can run with: say which, before asking
    the allocator (whose out-of-memory error would not name them)."""
    have = _memory_bytes(device)
    if nbytes > have:
        sizes = ", ".join(f"{name}={getattr(args, name)}" for name, t in args._fields_
                          if t in (ctypes.c_int64, ctypes.c_int32) and not name.endswith("_bytes"))
        raise ValueError(f"{op}: {what} of {nbytes} bytes for {sizes} is more than the {have} bytes of "
                         f"{device}; accepted: sizes whose buffers fit the device")


def run(op: str, device: torch.device, call: dict, args) -> Selection:
    """select_for, then launch: for a stub whose outputs already exist."""
    sel = select_for(op, device, call, args)
    launch(op, device, sel, args)
    return sel


_knob_env: dict = {}
_record_to = ""  # RTCATTN_RECORD as check_knobs last read it: launch() records there when set


def _our_env() -> dict:
    """The RTCATTN_* variables as set now. Read from CPython's encoded store where it has one: every call of an op
    looks, and decoding each of the environment's variables cost more than the rest of the check."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):  # bytes keys
        return {k: v for k, v in data.items() if k[:8] == b"RTCATTN_"}
    return {k: v for k, v in os.environ.items() if k.startswith("RTCATTN_")}


def knob_env() -> dict:
    """The RTCATTN_* variables as check_knobs last read them: a new object whenever they changed."""
    return _knob_env


def pins() -> Pins:
    """The pins in effect (pinned())."""
    return _pins.get()


def check_knobs() -> None:
    """Every RTCATTN_* variable that is set is parsed (and a bad value named) before anything compiles or
    runs, not when the code that reads it is reached; re-checked only when the environment changed.
    Variables the runtime does not declare (a script's own RTCATTN_ARCHS) are not ours to judge."""
    global _knob_env, _record_to
    env = _our_env()
    if env != _knob_env:
        for name in (os.fsdecode(k) if isinstance(k, bytes) else k for k in env):
            try:
                lib().knob(name)  # raises ValueError naming the variable, its value and what is accepted
            except ValueError as e:
                if not str(e).startswith("unknown knob"):
                    raise
        _record_to = lib().knob(record.KNOB)  # read here, once per environment, not at every launch
        _knob_env = env
