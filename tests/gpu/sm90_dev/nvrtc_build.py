"""Compiles the sm_90a attention source with NVRTC (ctypes), the same way the JIT does: text in, cubin out."""
import ctypes
import glob
import os
import site
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SOURCE = os.path.join(ROOT, "op_sources", "attention_fwd_sm90.cu")
HEADERS = ["platform.h", "attn_params.h", "sm90/attn_sm90_params.h", "sm90/ptx.h",
           "sm90/wgmma.h", "sm90/softmax.h"]


def find_nvrtc():
    names = ["libnvrtc.so.13", "libnvrtc.so"]
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
    for r in roots:
        for pat in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.13"):
            for path in glob.glob(os.path.join(r, pat)):
                # NVRTC dlopens its builtins by name: load them first from the same folder.
                for b in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                return ctypes.CDLL(path)
    raise OSError(f"libnvrtc.so.13 not found (tried {names} and site-packages/nvidia)")


def compile_sm90(defines=(), extra=(), src=None, name=b"attention_fwd_sm90.cu"):
    """Returns (cubin bytes, log text). Raises RuntimeError with the log on failure.
    src: other source text (bytes) to build with the same headers, e.g. a probe kernel."""
    lib = find_nvrtc()
    src = open(SOURCE, "rb").read() if src is None else src
    hdr_names = (ctypes.c_char_p * len(HEADERS))(*[h.encode() for h in HEADERS])
    hdr_text = (ctypes.c_char_p * len(HEADERS))(
        *[open(os.path.join(ROOT, "csrc_common", h), "rb").read() for h in HEADERS])
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, name,
                                len(HEADERS), hdr_text, hdr_names)
    assert rc == 0, rc
    opts = [b"--gpu-architecture=sm_90a", b"-std=c++17", b"--ptxas-options=-v"]
    opts += [f"-D{d}".encode() for d in defines] + [e.encode() for e in extra]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    if rc != 0:
        raise RuntimeError(f"NVRTC failed ({rc}) for defines {defines}:\n{text}")
    if os.environ.get("SM90_PTX_OUT"):
        lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetPTX(prog, ptx)
        open(os.environ["SM90_PTX_OUT"], "wb").write(ptx.value)
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw, text


if __name__ == "__main__":
    import time
    for mode in (0, 1, 2):
        t0 = time.time()
        cubin, log = compile_sm90([f"RTC_ROUND={mode}"])
        print(f"RTC_ROUND={mode}: {len(cubin)} bytes, {time.time() - t0:.2f} s")
        print(log)
        if len(sys.argv) > 1:
            open(f"{sys.argv[1]}/attn_sm90_r{mode}.cubin", "wb").write(cubin)
