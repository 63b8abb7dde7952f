"""Real compiles of the baseline kernel through the runtime (clang-19, hipRTC 5.2, NVRTC), checking the code objects."""
import ctypes
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import pytest

from rtcattn import _lib, dispatch, manifest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = json.load(open(os.path.join(ROOT, "configs", "ops.json")))
KERNEL = next(k for k in MANIFEST["ops"]["attention_fwd"]["kernels"] if k["kind"] == "baseline")
SYMBOL = KERNEL["symbol"]
BUCKETS = KERNEL["head_dim_buckets"]
EM_AMDGPU, EM_CUDA = 224, 190
AMD_MACH = {"gfx90a": 0x3F, "gfx942": 0x4C}  # EF_AMDGPU_MACH values (low byte of e_flags)

# Every layout x mode at head-dim bucket 128; every bucket for bshd/rtne.
VARIANTS = sorted({(lay, mode, 128) for lay in (0, 1) for mode in (0, 1, 2)} |
                  {(0, 0, d) for d in BUCKETS})


def _sources():
    src = open(os.path.join(ROOT, "op_sources", KERNEL["source"])).read()
    hdrs = {h: open(os.path.join(ROOT, "csrc_common", h)).read() for h in KERNEL["headers"]}
    return src, hdrs


def _defines(variant):
    lay, mode, d = variant
    return [f"-DRTC_LAYOUT={lay}", f"-DRTC_ROUND={mode}", f"-DRTC_HEAD_DIM_MAX={d}"]


def _tool(*names):
    for n in names:
        if shutil.which(n):
            return shutil.which(n)
    return None


CLANG = os.environ.get("RTCATTN_CLANG") or _tool("clang++-19", "clang++")
READELF = _tool("llvm-readelf-19", "llvm-readelf")
OBJDUMP = _tool("llvm-objdump-19", "llvm-objdump")


LAYOUT_NAMES, MODE_NAMES = ("bshd", "bhsd"), ("rtne", "rtna", "rtz")


def _product_build(arch, compiler, variant, cache_dir):
    """The product path: manifest -> build request -> C++ runtime -> compiler, into a fresh cache dir."""
    lay, mode, d = variant
    v = manifest.Variant("attention_fwd", KERNEL["name"], arch, LAYOUT_NAMES[lay], MODE_NAMES[mode], d)
    req = manifest.load().request(v, dispatch.package_version())
    try:
        res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers,
                         req.options, compiler=compiler, package_version=req.package_version,
                         cache_dir=str(cache_dir))
    except _lib.UnavailableError as e:
        pytest.skip(f"{compiler} unavailable for {arch}: {e}")
    assert res.origin == "compile", f"fresh cache dir, yet origin {res.origin}"
    return res.code()


def _clang_compile(arch, variant):
    """The headers are copied into a scratch dir, as the runtime hands them over from memory."""
    src, hdrs = _sources()
    with tempfile.TemporaryDirectory() as d:
        for name, text in list(hdrs.items()) + [("k.hip", src)]:
            open(os.path.join(d, name), "w").write(text)
        out = os.path.join(d, "k.co")
        cmd = [CLANG, "-x", "hip", f"--offload-arch={arch}", "-nogpulib", "-nogpuinc", "-O3",
               "--cuda-device-only", "--no-gpu-bundle-output", "-I", d, *_defines(variant),
               "-c", os.path.join(d, "k.hip"), "-o", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"clang {arch} {variant} failed:\n{r.stderr}"
        return open(out, "rb").read(), r.stderr


def _cstrs(items):
    return (ctypes.c_char_p * max(1, len(items)))(*[s.encode() for s in items])


def _rtc_compile(lib, prefix, options, get_code):
    """Drives hipRTC or NVRTC (same API shape): create with in-memory headers, compile, log, code."""
    src, hdrs = _sources()
    names = list(hdrs)
    prog = ctypes.c_void_p()
    rc = getattr(lib, prefix + "CreateProgram")(ctypes.byref(prog), src.encode(), b"k.hip", len(names),
                                               _cstrs([hdrs[n] for n in names]), _cstrs(names))
    assert rc == 0, f"{prefix}CreateProgram returned {rc}"
    try:
        rc = getattr(lib, prefix + "CompileProgram")(prog, len(options), _cstrs(options))
        n = ctypes.c_size_t()
        getattr(lib, prefix + "GetProgramLogSize")(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value + 1)
        getattr(lib, prefix + "GetProgramLog")(prog, log)
        log = log.value.decode(errors="replace")
        assert rc == 0, f"{prefix} compile {options} failed ({rc}):\n{log}"
        getattr(lib, prefix + get_code + "Size")(prog, ctypes.byref(n))
        code = ctypes.create_string_buffer(n.value)
        getattr(lib, prefix + get_code)(prog, code)
        return code.raw, log
    finally:
        getattr(lib, prefix + "DestroyProgram")(ctypes.byref(prog))


def _nvrtc_candidates():
    dirs = [os.path.join(p, "nvidia") for p in sys.path if os.path.isdir(os.path.join(p, "nvidia"))]
    found = []
    for d in dirs:
        found += sorted(glob.glob(os.path.join(d, "*", "lib", "libnvrtc.so.1[0-9]")))
    return found + ["libnvrtc.so.13", "libnvrtc.so.12"]


def _load_nvrtc():
    for path in _nvrtc_candidates():
        try:
            # The builtins library sits next to NVRTC and is found only if already loaded.
            for b in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _elf_header(code):
    assert code[:4] == b"\x7fELF", "code object is not an ELF file"
    machine = struct.unpack_from("<H", code, 18)[0]
    flags = struct.unpack_from("<I", code, 48)[0]
    return machine, flags


def _check_amd(code, arch):
    machine, flags = _elf_header(code)
    assert machine == EM_AMDGPU, f"ELF machine {machine}, want EM_AMDGPU ({EM_AMDGPU})"
    assert flags & 0xFF == AMD_MACH[arch], f"e_flags {flags:#x} is not {arch}"
    if READELF is None:
        pytest.skip("llvm-readelf not found: ELF notes not checked")
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code)
        f.flush()
        hdr = subprocess.run([READELF, "-h", f.name], capture_output=True, text=True, check=True).stdout
        notes = subprocess.run([READELF, "--notes", "--dyn-syms", f.name], capture_output=True, text=True,
                               check=True).stdout
    assert re.search(r"Machine:\s+EM_AMDGPU", hdr) and re.search(rf"Flags:.*\b{arch}\b", hdr), hdr
    assert re.search(rf"\.name:\s+{SYMBOL}\b", notes), f"kernel {SYMBOL} missing from the notes"
    assert re.search(rf"\b{SYMBOL}\.kd\b", notes), f"kernel descriptor {SYMBOL}.kd missing"
    for key in (".private_segment_fixed_size", ".vgpr_spill_count", ".sgpr_spill_count"):
        vals = re.findall(rf"{re.escape(key)}:\s+(\d+)", notes)
        assert vals == ["0"], f"{key} = {vals} (want 0: no scratch, no spills)"
    lds = int(re.search(r"\.group_segment_fixed_size:\s+(\d+)", notes).group(1))
    assert 0 < lds <= 65536, f"LDS {lds} bytes"


def _check_cuda(code, sm):
    machine, flags = _elf_header(code)
    assert machine == EM_CUDA, f"ELF machine {machine}, want EM_CUDA ({EM_CUDA})"
    assert (flags >> 8) & 0xFF == sm, f"e_flags {flags:#x} is not sm_{sm}"
    assert SYMBOL.encode() + b"\0" in code, f"kernel {SYMBOL} missing from the cubin"


@pytest.mark.parametrize("arch,compiler", [("gfx942", "clang"), ("gfx90a", "clang"), ("gfx90a", "hiprtc")])
@pytest.mark.parametrize("variant", VARIANTS)
def test_amd(arch, compiler, variant, tmp_path):
    _check_amd(_product_build(arch, compiler, variant, tmp_path), arch)


@pytest.mark.parametrize("sm,variant", [("sm_90a", v) for v in VARIANTS] + [("sm_80", (1, 1, 256))])
def test_nvrtc(sm, variant, tmp_path):
    if _load_nvrtc() is None:
        pytest.skip("no NVRTC library (libnvrtc.so.*) found")
    _check_cuda(_product_build(sm, "nvrtc", variant, tmp_path), int(re.sub(r"\D", "", sm)))


@pytest.mark.parametrize("sm,variant", [("sm_90a", (0, 0, 256)), ("sm_90a", (1, 2, 192)), ("sm_80", (0, 1, 256))])
def test_nvrtc_no_spills(sm, variant):
    """ptxas's own report (the runtime keeps no log of a good compile), with the manifest's options."""
    lib = _load_nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library (libnvrtc.so.*) found")
    opts = [f"--gpu-architecture={sm}", "-std=c++17", "--ptxas-options=-v", *_defines(variant)]
    _, log = _rtc_compile(lib, "nvrtc", opts, "GetCUBIN")
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), log
    smem = int(re.search(r"(\d+) bytes smem", log).group(1))
    assert smem <= 48 * 1024, f"static shared memory {smem} bytes exceeds 48 KiB"


def test_plain_simt():
    """The baseline uses no matrix instructions (it is the fallback where those are not wanted)."""
    if CLANG is None or OBJDUMP is None:
        pytest.skip("clang++ / llvm-objdump not found")
    code, _ = _clang_compile("gfx942", (0, 0, 256))
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code)
        f.flush()
        asm = subprocess.run([OBJDUMP, "-d", "--mcpu=gfx942", f.name], capture_output=True, text=True,
                             check=True).stdout
    assert "s_endpgm" in asm, "disassembly is empty"
    assert "v_mfma" not in asm and "v_dot" not in asm, "matrix/dot instructions in the baseline"
