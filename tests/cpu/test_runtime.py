"""JIT runtime through its C ABI: knobs, info, device counts, errors as exceptions, compile errors, SHA-256."""
import ctypes
import hashlib
import os
import random
import shutil
from pathlib import Path

import pytest

from rtcattn.runtime import _lib

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_H = (ROOT / "csrc_common" / "platform.h").read_text()
HAVE_CLANG = shutil.which("clang++-19") is not None or shutil.which("clang++") is not None


@pytest.fixture
def env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("RTCATTN_"):
            monkeypatch.delenv(k)
    return monkeypatch


def test_knob_values_are_typed_and_normalized(env):
    assert _lib.knob("RTCATTN_LOG") == ""
    for raw, expected in [("1", "1"), ("TRUE", "1"), ("yes", "1"), ("0", "0"), ("off", "0")]:
        env.setenv("RTCATTN_LOG", raw)
        assert _lib.knob("RTCATTN_LOG") == expected
    env.setenv("RTCATTN_EMULATE", "GFX942")
    assert _lib.knob("RTCATTN_EMULATE") == "gfx942"
    env.setenv("RTCATTN_CACHE_DIR", "/some/dir")
    assert _lib.knob("RTCATTN_CACHE_DIR") == "/some/dir"


@pytest.mark.parametrize("name,value", [("RTCATTN_LOG", "loud"), ("RTCATTN_EMULATE", "gfx1100"),
                                        ("RTCATTN_REBUILD", "2")])
def test_bad_knob_value_raises_naming_variable_value_and_accepted(env, name, value):
    env.setenv(name, value)
    with pytest.raises(ValueError) as e:
        _lib.knob(name)
    assert name in str(e.value) and repr(value) in str(e.value) and "accepted" in str(e.value)


def test_unknown_knob_lists_declared_knobs():
    with pytest.raises(ValueError, match="RTCATTN_CACHE_DIR") as e:
        _lib.knob("RTCATTN_NOPE")
    assert "RTCATTN_NOPE" in str(e.value)


def test_info_lists_compilers_with_versions_loaders_and_cache(env, tmp_path):
    env.setenv("RTCATTN_CACHE_DIR", str(tmp_path))
    info = _lib.info()
    compilers = {c["name"]: c for c in info["compilers"]}
    assert set(compilers) == {"clang", "clang22", "hiprtc", "nvrtc", "host"}
    from rtcattn.runtime import manifest
    assert set(manifest.COMPILERS) - {"auto"} == set(compilers)  # the manifest's names are the registry's
    for c in compilers.values():
        assert c["available"] == bool(c["archs"])
        assert (c["version"] != "") == c["available"]
        assert c["available"] or c["reason"]
    if HAVE_CLANG:
        assert compilers["clang"]["available"] and "clang version" in compilers["clang"]["version"]
        assert {"gfx942", "gfx90a"} <= set(compilers["clang"]["archs"])
    if compilers["clang"]["available"] and int(compilers["clang"]["id"][len("clang"):]) < 20:
        assert "gfx950" not in compilers["clang"]["archs"]  # clang-19 has no gfx950: clang22 builds it
    if shutil.which("clang++-22"):
        assert compilers["clang22"]["id"] == "clang22" and {"gfx950", "gfx942"} <= set(compilers["clang22"]["archs"])
    if compilers["hiprtc"]["available"] and compilers["hiprtc"]["id"] < "hiprtc6":
        assert "gfx942" not in compilers["hiprtc"]["archs"]  # ROCm 5 hipRTC aborts on gfx94x
    assert {loader["vendor"] for loader in info["loaders"]} == {"hip", "cuda", "host"}
    assert info["user_cache"]["path"] == str(tmp_path)
    assert set(info["knobs"]) >= {"RTCATTN_CACHE_DIR", "RTCATTN_NO_COMPILE", "RTCATTN_EMULATE"}
    assert info["version"] == _lib.version()


def test_device_count_is_zero_without_a_driver():
    torch = pytest.importorskip("torch")
    for vendor in ("hip", "cuda"):
        n = _lib.device_count(vendor)
        assert n >= 0
        if not torch.cuda.is_available():
            assert n == 0
    with pytest.raises(ValueError, match="'metal'.*hip, cuda, host"):
        _lib.device_count("metal")


def test_errors_become_python_exceptions(tmp_path):
    main = ("k.hip", '#include "platform.h"\nRTC_KERNEL(64) k(int) {}\n')
    with pytest.raises(ValueError, match="arch 'mi300' is not known; accepted: gfx942"):
        _lib.build("op", "v", "mi300", "k", main, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="compiler 'icc'"):
        _lib.build("op", "v", "gfx942", "k", main, compiler="icc", cache_dir=str(tmp_path))
    with pytest.raises(_lib.UnavailableError, match="no compiler available for arch 'sm_90a'"):
        _lib.build("op", "v", "sm_90a", "k", main, compiler="clang", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="program handle 123456"):
        _lib.program_bytes(123456)
    args = _args(batch=1, heads=1, seq_q=1, seq_k=1)
    with pytest.raises(ValueError, match="kernel='fancy' is not a kernel of op 'attention_fwd'.*baseline"):
        _lib.op_workspace_bytes("attention_fwd", "fancy", args)
    with pytest.raises(ValueError, match="op='nope' is not registered"):
        _lib.op_args("nope")
    with pytest.raises(ValueError, match="'q_stride' is not a field of attention_fwd"):
        _lib.op_args("attention_fwd", q_stride=1)


def _args(**sizes):
    return _lib.op_args("attention_fwd", q=1, k=1, v=1, o=1, q_strides=(1, 1, 1), k_strides=(1, 1, 1),
                        v_strides=(1, 1, 1), o_strides=(1, 1, 1), head_dim=64, softmax_scale=0.125,
                        heads_k=sizes.get("heads", 1), window_left=-1, window_right=-1, **sizes)


def test_op_args_checked_and_baseline_needs_no_workspace():
    args = _args(batch=2, heads=3, seq_q=5, seq_k=7)
    assert _lib.op_workspace_bytes("attention_fwd", "baseline", args) == 0
    assert _lib.op_plan("attention_fwd", "baseline", args) == {"grid_x": 1, "grid_y": 3, "grid_z": 2, "block": 128,
                                                               "workspace_bytes": 0}
    with pytest.raises(ValueError, match="seq_k=0"):
        _lib.op_workspace_bytes("attention_fwd", "baseline", _args(batch=2, heads=3, seq_q=5, seq_k=0))


def test_argument_block_layout_comes_from_the_runtime():
    """Python declares no field of the block: names, offsets and size are the C++ struct's, checked in ctypes."""
    desc = _lib.ops_description()["attention_fwd"]
    cls = type(_lib.op_args("attention_fwd"))
    assert [n for n, _ in cls._fields_] == [f["name"] for f in desc["fields"]]
    assert all(getattr(cls, f["name"]).offset == f["offset"] for f in desc["fields"])
    assert ctypes.sizeof(cls) == desc["args_size"]
    assert desc["kernels"] == ["sm90_decode", "sm90", "gfx950_decode", "gfx942_decode", "gfx942", "baseline"]
    with pytest.raises(ValueError, match="args_size=8 does not match the argument block of attention_fwd"):
        _lib._check(_lib._lib.rtc_op_workspace_bytes(b"attention_fwd", b"baseline", ctypes.byref(ctypes.c_int64()),
                                                     8, ctypes.byref(ctypes.c_int64())))


def test_runtime_and_package_versions_are_one_fact():
    import rtcattn
    assert _lib.version() == rtcattn.__version__ == _lib.info()["version"]


@pytest.mark.skipif(shutil.which("clang++-19") is None, reason="needs clang-19 (the CI installs it)")
def test_clang19_declines_gfx950_naming_the_knob_and_auto_takes_clang22(env, tmp_path):
    env.setenv("RTCATTN_CACHE_DIR", str(tmp_path))
    env.setenv("RTCATTN_CLANG", shutil.which("clang++-19"))
    src = '#include "platform.h"\nRTC_KERNEL(64) k(int) {}\n'
    with pytest.raises(_lib.UnavailableError) as e:
        _lib.build("tiny", "v", "gfx950", "k", ("k.hip", src), [("platform.h", PLATFORM_H)], compiler="clang")
    assert "cannot target gfx950" in str(e.value) and "RTCATTN_CLANG" in str(e.value), str(e.value)
    if shutil.which("clang++-22"):
        r = _lib.build("tiny", "v", "gfx950", "k", ("k.hip", src), [("platform.h", PLATFORM_H)], compiler="auto")
        assert r.compiler_id == "clang22" and r.code()[:4] == b"\x7fELF"


@pytest.mark.skipif(not HAVE_CLANG, reason="needs clang++ (the CI installs clang-19)")
def test_compile_error_names_key_arch_log_and_saved_source(env, tmp_path):
    env.setenv("RTCATTN_CACHE_DIR", str(tmp_path))
    bad = '#include "platform.h"\nRTC_KERNEL(64) broken(int n) { undeclared_name += n; }\n'
    with pytest.raises(_lib.CompileError) as e:
        _lib.build("tiny", "bad", "gfx942", "broken", ("broken.hip", bad), [("platform.h", PLATFORM_H)],
                   compiler="clang")
    msg = str(e.value)
    assert "tiny-bad-gfx942-clang" in msg and "arch=gfx942" in msg and "arch gfx942" in msg
    assert "undeclared_name" in msg and "error" in msg  # the compiler log
    saved = Path(msg.split("source saved in ")[1].split()[0].rstrip(";"))
    assert saved.is_dir() and str(saved).startswith(str(tmp_path))
    assert (saved / "broken.hip").read_text() == bad and (saved / "platform.h").is_file()
    assert "undeclared_name" in (saved / "build.txt").read_text()


@pytest.mark.parametrize("n", [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100_003])
def test_sha256_matches_hashlib(n):
    data = random.Random(n).randbytes(n)
    assert _lib.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_cache_dir_defaults_follow_xdg(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _lib.info()["user_cache"]["path"] == str(tmp_path / "xdg" / "rtcattn")
    env.delenv("XDG_CACHE_HOME")
    env.setenv("HOME", str(tmp_path / "home"))
    assert _lib.info()["user_cache"]["path"] == str(tmp_path / "home" / ".cache" / "rtcattn")


def test_parallel_builds_in_threads_do_not_crash(tmp_path):
    """hipRTC 5.2 (comgr) crashes on concurrent compiles; the runtime must serialize them."""
    import threading
    compilers = {c["name"]: c for c in _lib.info()["compilers"]}
    usable = [n for n in ("hiprtc", "clang") if "gfx90a" in compilers[n]["archs"]]
    if not usable:
        pytest.skip("no compiler for gfx90a here")
    results, errors = [], []

    def work(i, compiler):
        src = (f'#include "platform.h"\n// thread {i}\nstruct P {{ float* x; int n; }};\n'
               f"RTC_KERNEL(64) k(P p) {{ for (int j = 0; j < p.n; ++j) p.x[j] = p.x[j] * {i + 2}.0f + 1.0f; }}\n")
        try:
            results.append(_lib.build("thr", f"t{i}", "gfx90a", "k", ("k.hip", src), [("platform.h", PLATFORM_H)],
                                      compiler=compiler, cache_dir=str(tmp_path)))
        except Exception as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, usable[i % len(usable)])) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 6
    assert all(r.origin == "compile" and r.size > 0 for r in results)


def test_nvrtc_cubin_and_ptxas_report(tmp_path):
    compilers = {c["name"]: c for c in _lib.info()["compilers"]}
    if "sm_90a" not in compilers["nvrtc"]["archs"]:
        pytest.skip("no NVRTC here (pip install nvidia-cuda-nvrtc)")
    src = ('#include "platform.h"\nstruct P { float* x; int n; };\n'
           'RTC_KERNEL(128) k(P p) { if ((int)threadIdx.x < p.n) p.x[threadIdx.x] += 1.0f; }\n')
    r = _lib.build("tiny", "nv", "sm_90a", "k", ("k.cu", src), [("platform.h", PLATFORM_H)], ["-std=c++17"],
                   cache_dir=str(tmp_path))
    code = r.code()
    assert code[:4] == b"\x7fELF" and int.from_bytes(code[18:20], "little") == 190  # EM_CUDA
    log = r.log()
    assert "registers" in log and "0 bytes spill stores" in log
    assert Path(r.path + ".log").read_text() == log  # kept beside the entry for later cache hits


@pytest.mark.skipif(not HAVE_CLANG, reason="needs clang++ (the CI installs clang-19)")
def test_gfx942_code_object_is_amdgpu_elf(tmp_path):
    src = '#include "platform.h"\nstruct P { float* x; };\nRTC_KERNEL(64) k(P p) { p.x[threadIdx.x] = 1.0f; }\n'
    r = _lib.build("tiny", "amd", "gfx942", "k", ("k.hip", src), [("platform.h", PLATFORM_H)],
                   cache_dir=str(tmp_path))
    code = r.code()
    assert r.compiler_id.startswith(("clang", "hiprtc"))
    assert code[:4] == b"\x7fELF" and int.from_bytes(code[18:20], "little") == 224  # EM_AMDGPU
    assert int.from_bytes(code[16:18], "little") == 3  # ET_DYN: what hipModuleLoadData wants
    assert int.from_bytes(code[48:52], "little") & 0xFF == 0x4C  # e_flags mach = gfx942


def test_sanitized_runs_survive_a_library_that_swaps_a_threads_signal_stack(tmp_path):
    """hipRTC 5.2 compiles on a thread of comgr's own, where LLVM puts a malloc'd alternate signal stack in place
    of the one ASan gave the thread; with ASan's default use_sigaltstack=1, ASan unmaps that heap block when the
    thread ends and dies ("unable to unmap"), on CPUs whose signal frame makes LLVM's wish larger than ASan's
    stack. A stand-in hipRTC does the swap on any CPU: a process with the sanitizer options of bash .ci/sanitize
    (inherited here) must survive it. Without ASan loaded there is nothing to check: the test command runs this
    file under bash .ci/sanitize too."""
    import subprocess
    import sys
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("checks the sanitizer options; runs under bash .ci/sanitize (part of the test command)")
    gcc = shutil.which("gcc") or shutil.which("cc")
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir(mode=0o700)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(lib_dir / "libhiprtc.so"),
                    str(ROOT / "tests" / "cpu" / "hip_standin" / "hiprtc_altstack.c"), "-lpthread"], check=True)
    code = ("import sys, threading, time\n"
            "from rtcattn.runtime import _lib\n"
            "def work(i):\n"
            "    try:\n"
            "        _lib.build('alt', f't{i}', 'gfx90a', 'k', ('k.hip', '// ' + str(i)), [], compiler='hiprtc',\n"
            "                   cache_dir=sys.argv[1])\n"
            "    except Exception as e:\n"
            "        assert 'stand-in' in str(e), e\n"
            "ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "time.sleep(0.5)  # the runtime's detached compile workers end after handing over the result\n"
            "print('survived')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    reports = tmp_path / "reports"
    reports.mkdir()
    # the same options, with this child's reports kept apart from the run's (they would fail the whole run)
    env["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + f":log_path={reports}/asan"
    env.update(PYTHONPATH=str(Path(_lib.__file__).resolve().parents[2]), RTCATTN_LIBRARY_PATH=str(lib_dir))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], capture_output=True, text=True,
                       env=env, timeout=120)
    found = [p.read_text() for p in reports.iterdir()]
    assert r.returncode == 0 and r.stdout.strip() == "survived" and found == [], (r.stderr[-2000:], found)
