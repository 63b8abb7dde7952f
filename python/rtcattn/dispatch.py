"""Chooses arch, kernel and variant for a call, builds it (once per process) and launches it on the caller's stream."""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import manifest, paths, validate

OP = "attention_fwd"
# Compute units of the emulated parts: the planner's input when the "device" is the CPU emulator.
EMULATED_CUS = {"gfx942-emu": 304, "gfx90a-emu": 110}

_lock = threading.Lock()
_lib_module = None
_programs: dict = {}     # (variant, cache_dir) -> build result; the C++ runtime caches too
_plans: dict = {}       # (arch, D, layout, round_mode) -> _plan(): the manifest part of a selection
_gpu_facts: dict = {}   # GPU device index -> (arch, SMs/CUs): asked of torch and the manifest once per device
_logged: set = set()
last_selection: Optional["Selection"] = None  # what the latest call ran (bench reports it)


def lib():
    """The ctypes binding, loaded on first use; tells the runtime once where the package's own cache is."""
    global _lib_module
    if _lib_module is None:
        with _lock:
            if _lib_module is None:
                from . import _lib
                cache = paths.package_cache_dir()
                if cache.is_dir():  # absent unless `warm --cache-dir` filled it at image build
                    _lib.set_package_cache_dir(str(cache))
                _lib_module = _lib
    return _lib_module


def package_version() -> str:
    from . import __version__
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
        validate.check_runnable(device, emulate)
        return f"{emulate}-emu"
    validate.check_runnable(device, "")
    if torch.version.hip:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return _cuda_arch(major, minor, manifest.load().archs(OP))


@dataclass(frozen=True)
class Selection:
    kernel: manifest.KernelSpec
    variant: manifest.Variant
    why: str   # why this kernel and not an earlier one in the manifest's order


def _rejects(k: manifest.KernelSpec, arch: str, conds: dict) -> Optional[str]:
    """Why kernel k cannot serve the call, or None. Conditions are data: the manifest's "when"."""
    if arch not in k.archs:
        return f"arch {arch} not in {list(k.archs)}"
    if not k.supports_head_dim(conds["head_dim"]):
        return f"head_dim {conds['head_dim']} outside {k.head_dim_min}..{k.head_dim_max} step {k.head_dim_step}"
    for key, accepted in k.when.items():
        if conds.get(key) not in accepted:
            return f"{key} {conds.get(key)!r} not in {accepted}"
    return None


def _plan(arch: str, head_dim: int, layout: str, round_mode: str, kernel: Optional[str],
          m: Optional[manifest.Manifest]) -> tuple:
    """Every kernel of the op in the manifest's order: (kernel, its variant, None) or (kernel, None, why not)."""
    spec = (m or manifest.load()).op(OP)
    conds = {"arch": arch, "head_dim": head_dim, "layout": layout, "round_mode": round_mode}
    plan = []
    for k in spec.kernels:
        if kernel is not None and k.name != kernel:
            continue
        why_not = _rejects(k, arch, conds)
        v = None if why_not else manifest.Variant(OP, k.name, arch, layout, round_mode, manifest.bucket_for(k, head_dim))
        plan.append((k, v, why_not))
    if not plan and kernel is not None:
        plan.append((None, None, f"none named {kernel!r}"))
    return tuple(plan)


def _pick(plan: tuple, supports: Optional[Callable], what: str) -> Selection:
    """The first planned kernel that supports (None = ask nothing) accepts; its why lists the ones skipped."""
    skipped = []
    for k, v, why_not in plan:
        if why_not is None and supports is not None:
            why_not = supports(k)
        if why_not is None:
            return Selection(k, v, "first match" if not skipped else "fallback; " + "; ".join(skipped))
        skipped.append(f"{k.name}: {why_not}" if k is not None else why_not)
    names = ", ".join(k.name for k in manifest.load().op(OP).kernels)
    raise ValueError(f"no kernel of {OP} serves {what}; kernels: {names}; why not: {'; '.join(skipped)}")


def select(arch: str, head_dim: int, layout: str, round_mode: str, kernel: Optional[str] = None,
           m: Optional[manifest.Manifest] = None, supports: Optional[Callable] = None) -> Selection:
    """The first kernel of the manifest (in its order of preference) whose conditions the call meets.

    supports(kernel) -> None or why not: asked of each kernel whose manifest conditions hold, for what
    only the call's arguments tell (pointer alignment, strides); a kernel it declines falls back to the next.
    """
    plan = _plan(arch, head_dim, layout, round_mode, kernel, m)
    what = f"arch={arch!r}, head_dim={head_dim}, layout={layout!r}, round_mode={round_mode!r} (kernel={kernel!r})"
    return _pick(plan, supports, what)


def runtime_check(args, vendor: str) -> Callable:
    """A supports() for select: the runtime's per-kind check of these attention args (no device needed)."""
    return lambda k: lib().attention_supports(k.kind, args, vendor)


def choose(arch: str, head_dim: int, layout: str, round_mode: str, args, vendor: str) -> Selection:
    """select() with the runtime's check of args; logs (RTCATTN_LOG=1) each distinct choice once per process."""
    global last_selection
    forced = lib().knob("RTCATTN_KERNEL") or None  # a named kernel, no fallback (tests, A/B runs)
    key = (arch, head_dim, layout, round_mode, forced)
    plan = _plans.get(key)
    if plan is None:  # the plan reads the manifest: once per (arch, D, layout, mode) per process
        plan = _plans.setdefault(key, _plan(arch, head_dim, layout, round_mode, forced, None))
    what = f"arch={arch!r}, head_dim={head_dim}, layout={layout!r}, round_mode={round_mode!r}"
    if forced:
        what += f" with RTCATTN_KERNEL={forced!r}"
    sel = _pick(plan, runtime_check(args, vendor), what)
    last_selection = sel
    if (arch, sel.variant, sel.why) not in _logged:
        _logged.add((arch, sel.variant, sel.why))
        log(f"kernel {sel.kernel.name} ({manifest.variant_name(sel.variant)}, {arch}) for D={head_dim}: {sel.why}")
    return sel


def build(variant: manifest.Variant, cache_dir: Optional[str] = None):
    """The built program of a variant: from this process's map, else through the C++ cache/compilers."""
    key = (variant, cache_dir)
    hit = _programs.get(key)
    if hit is not None:
        return hit
    req = manifest.load().request(variant, package_version())
    result = lib().build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                         compiler=",".join(req.compilers), package_version=req.package_version,
                         cache_dir=cache_dir)
    with _lock:
        _programs.setdefault(key, result)
    return result


def _strides(t: torch.Tensor, layout: str):
    """Element strides in (batch, seq, head) order, as AttnParams wants them."""
    s = t.stride()
    return (s[0], s[1], s[2]) if layout == "bshd" else (s[0], s[2], s[1])


def _num_cus(device: torch.device, arch: str) -> int:
    if device.type == "cpu":
        return EMULATED_CUS.get(arch, 1)
    return torch.cuda.get_device_properties(device).multi_processor_count


def _device_facts(device: torch.device) -> tuple:
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


def attention_args(q, k, v, out, lse, layout: str, problem: validate.Problem, num_cus: int):
    """The C ABI's argument block of a call (pointers and element strides; nothing is read through them)."""
    return lib().attention_args(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
        strides=[_strides(t, layout) for t in (q, k, v, out)], batch=problem.batch, heads=problem.heads,
        seq_q=problem.seq_q, seq_k=problem.seq_k, head_dim=problem.head_dim, softmax_scale=problem.scale,
        lse=lse.data_ptr() if lse is not None else 0, tail_split=-1, num_cus=num_cus)


def run(q, k, v, out, lse, layout: str, round_mode: str, problem: validate.Problem) -> None:
    """Selects, builds and launches; out (and lse when not None) are written in place."""
    device = q.device
    arch, num_cus = _device_facts(device)
    vendor = vendor_of(device)
    args = attention_args(q, k, v, out, lse, layout, problem, num_cus)
    sel = choose(arch, problem.head_dim, layout, round_mode, args, vendor)
    program = build(sel.variant).program
    nbytes = lib().attention_workspace_bytes(sel.kernel.kind, args)
    if nbytes > 0:  # through torch's caching allocator, so repeated calls cost no device malloc
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), nbytes
    index = 0 if device.type == "cpu" else (device.index if device.index is not None else torch.cuda.current_device())
    stream = torch.cuda.current_stream(device).cuda_stream if vendor != "host" else 0
    lib().attention_fwd(program, sel.kernel.kind, args, vendor, index, stream)
