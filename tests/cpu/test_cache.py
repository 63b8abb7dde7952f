"""Code-object cache of the JIT runtime: hits and misses, key contents, races, damaged entries, unsafe dirs, knobs."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB_PY = ROOT / "python" / "rtcattn" / "runtime" / "_lib.py"
PLATFORM_H = (ROOT / "csrc_common" / "platform.h").read_text()

pytestmark = pytest.mark.skipif(shutil.which("clang++-19") is None and shutil.which("clang++") is None,
                                reason="needs clang++ (the CI installs clang-19)")

# A child process loads _lib.py by path: importing the rtcattn package would pull in torch, which
# costs seconds per process in the 8-process race.
CHILD = textwrap.dedent("""
    import hashlib, importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("rtc_lib_child", sys.argv[1])
    L = importlib.util.module_from_spec(spec); sys.modules["rtc_lib_child"] = L; spec.loader.exec_module(L)
    req = json.loads(sys.argv[2])
    try:
        r = L.build(req["op"], req["variant"], req["arch"], req["symbol"], tuple(req["main"]),
                    [tuple(h) for h in req["headers"]], req["options"], compiler=req["compiler"],
                    cache_dir=req.get("cache_dir"))
        out = {"origin": r.origin, "path": r.path, "name": r.cache_name, "sha": hashlib.sha256(r.code()).hexdigest()}
    except Exception as e:
        out = {"error": type(e).__name__, "message": str(e)}
    print("RESULT " + json.dumps(out))
""")


def kernel_source(tag: str, body: str = "p.x[i] *= 2.0f;") -> str:
    return (f'#include "platform.h"\n// {tag}\nstruct P {{ float* x; int n; }};\n'
            f"RTC_KERNEL(64) tiny(P p) {{ unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  if ((int)i < p.n) {{ {body} }} }}\n")


def request(tag=None, **over):
    req = {"op": "tiny", "variant": "v1", "arch": "gfx942", "symbol": "tiny", "compiler": "clang",
           "main": ["tiny.hip", kernel_source(tag or uuid.uuid4().hex)],
           "headers": [["platform.h", PLATFORM_H]], "options": ["-DTINY=1"]}
    req.update(over)
    return req


def child_env(cache_dir, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    env["RTCATTN_CACHE_DIR"] = str(cache_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_child(req, env):
    return subprocess.Popen([sys.executable, "-c", CHILD, str(LIB_PY), json.dumps(req)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"child failed: {err}"
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), err


def build_in_child(req, cache_dir, **extra):
    return finish(start_child(req, child_env(cache_dir, **extra)))


@pytest.fixture
def lib():
    from rtcattn.runtime import _lib
    return _lib


def build_here(lib, req, cache_dir):
    return lib.build(req["op"], req["variant"], req["arch"], req["symbol"], tuple(req["main"]),
                     [tuple(h) for h in req["headers"]], req["options"], compiler=req["compiler"],
                     cache_dir=str(cache_dir))


def test_miss_then_memory_then_user_cache(tmp_path, lib):
    req = request()
    first = build_here(lib, req, tmp_path)
    assert first.origin == "compile" and first.compile_ms > 0
    assert Path(first.path).is_file() and Path(first.path).parent == tmp_path
    assert first.cache_name.startswith("tiny-v1-gfx942-clang") and first.cache_name.endswith(".co")
    again = build_here(lib, req, tmp_path)
    assert again.origin == "memory" and again.program == first.program
    other, _ = build_in_child(req, tmp_path)
    assert other["origin"] == "user_cache"
    assert other["sha"] == hashlib.sha256(first.code()).hexdigest()


def test_key_changes_with_source_header_options_and_compiler(tmp_path, lib):
    base = request("same-tag")
    names = {"base": build_here(lib, base, tmp_path).cache_name}
    source = kernel_source("same-tag", "p.x[i] += 1.0f;")
    names["source"] = build_here(lib, request("same-tag", main=["tiny.hip", source]), tmp_path).cache_name
    header = PLATFORM_H + "\n// changed\n"
    names["header"] = build_here(lib, request("same-tag", headers=[["platform.h", header]]), tmp_path).cache_name
    names["options"] = build_here(lib, request("same-tag", options=["-DTINY=2"]), tmp_path).cache_name
    names["variant"] = build_here(lib, request("same-tag", variant="v2"), tmp_path).cache_name
    assert len(set(names.values())) == len(names), names
    # Same compiler id, different version text: a wrapper that reports another clang version.
    real = shutil.which("clang++-19") or shutil.which("clang++")
    fake = tmp_path / "fake-clang"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "clang version 19.99.0 (test)"; exit 0; fi\n'
                    f'exec "{real}" "$@"\n')
    fake.chmod(0o755)
    result, _ = build_in_child(base, tmp_path, RTCATTN_CLANG=fake)
    assert result["origin"] == "compile" and result["name"] != names["base"]
    assert result["name"].split("-")[3] == names["base"].split("-")[3]  # same id "clang19"


def test_key_changes_with_compiler_identity(tmp_path, lib):
    info = {c["name"]: c for c in lib.info()["compilers"]}
    if "gfx90a" not in info["hiprtc"]["archs"]:
        pytest.skip("no hipRTC for gfx90a here")
    a = build_here(lib, request("ident", arch="gfx90a", compiler="clang"), tmp_path)
    b = build_here(lib, request("ident", arch="gfx90a", compiler="hiprtc"), tmp_path)
    assert a.compiler_id.startswith("clang") and b.compiler_id.startswith("hiprtc")
    assert a.cache_name != b.cache_name


def test_eight_processes_compile_once_and_read_identical_bytes(tmp_path):
    req = request()
    procs = [start_child(req, child_env(tmp_path, RTCATTN_LOG=1)) for _ in range(8)]
    results = [finish(p) for p in procs]
    origins = [r["origin"] for r, _ in results]
    compiles = sum(err.count("[rtcattn] compile ") for _, err in results)
    assert origins.count("compile") == 1 and compiles == 1, origins
    assert set(origins) <= {"compile", "user_cache"}
    assert len({r["sha"] for r, _ in results}) == 1
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp." in p.name]
    assert leftovers == []


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_damaged_entry_is_rebuilt_with_warning(tmp_path, damage):
    req = request()
    first, _ = build_in_child(req, tmp_path)
    path = Path(first["path"])
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-100] ^= 0x10
    path.write_bytes(bytes(data))
    second, err = build_in_child(req, tmp_path)
    assert second["origin"] == "compile"
    assert "invalid" in err and path.name in err
    assert second["sha"] == first["sha"]
    third, err3 = build_in_child(req, tmp_path)
    assert third["origin"] == "user_cache" and "invalid" not in err3


def test_unusable_dir_warns_once_and_works_in_memory(tmp_path, lib):
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a dir")
    cache_dir = blocker / "cache"  # mkdir fails even for root: the parent is a regular file
    result, err = build_in_child(request(), cache_dir)
    assert result["origin"] == "compile" and result["path"] == ""
    warnings = [ln for ln in err.splitlines() if "warning:" in ln]
    assert len(warnings) == 1 and "is unusable" in warnings[0] and str(cache_dir) in warnings[0]
    req = request()
    assert build_here(lib, req, cache_dir).origin == "compile"
    assert build_here(lib, req, cache_dir).origin == "memory"


def test_dir_writable_by_others_is_not_loaded_from(tmp_path):
    cache_dir = tmp_path / "shared"
    req = request()
    first, _ = build_in_child(req, cache_dir)
    assert first["origin"] == "compile"
    cache_dir.chmod(0o777)
    second, err = build_in_child(req, cache_dir)
    assert second["origin"] == "compile" and second["path"] == ""
    assert "writable by other users" in err
    cache_dir.chmod(0o700)
    third, _ = build_in_child(req, cache_dir)
    assert third["origin"] == "user_cache"


def test_system_cache_is_searched_after_user_dir(tmp_path):
    system_dir, user_dir = tmp_path / "system", tmp_path / "user"
    req = request()
    build_in_child(req, system_dir)
    result, _ = build_in_child(req, user_dir, RTCATTN_SYSTEM_CACHE=f"/nonexistent:{system_dir}")
    assert result["origin"] == "system_cache" and result["path"].startswith(str(system_dir))


def test_rebuild_ignores_cached_entries(tmp_path):
    req = request()
    build_in_child(req, tmp_path)
    result, _ = build_in_child(req, tmp_path, RTCATTN_REBUILD=1)
    assert result["origin"] == "compile"
    result, _ = build_in_child(req, tmp_path, RTCATTN_REBUILD=0)
    assert result["origin"] == "user_cache"


def test_no_compile_fails_cold_and_passes_warm(tmp_path):
    req = request()
    cold, _ = build_in_child(req, tmp_path, RTCATTN_NO_COMPILE=1)
    assert cold["error"] == "NoCompileError"
    assert "RTCATTN_NO_COMPILE" in cold["message"] and "tiny-v1-gfx942-clang" in cold["message"]
    build_in_child(req, tmp_path)
    warm, _ = build_in_child(req, tmp_path, RTCATTN_NO_COMPILE=1)
    assert warm["origin"] == "user_cache"


@pytest.mark.parametrize("name,value", [("RTCATTN_REBUILD", "maybe"), ("RTCATTN_NO_COMPILE", "2"),
                                        ("RTCATTN_LOG", "verbose")])
def test_bad_knob_value_names_the_variable(tmp_path, name, value):
    result, _ = build_in_child(request(), tmp_path, **{name: value})
    assert result["error"] == "ValueError"
    assert name in result["message"] and repr(value) in result["message"] and "accepted" in result["message"]


def test_clear_cache_removes_entries(tmp_path, lib):
    build_in_child(request(), tmp_path)
    assert any(p.suffix == ".co" for p in tmp_path.iterdir())
    assert lib.clear_cache(str(tmp_path)) >= 1
    assert not any(p.suffix == ".co" for p in tmp_path.iterdir())


def test_key_lock_blocks_and_is_recovered_from_a_killed_holder(tmp_path, lib):
    req = request()
    name = build_here(lib, req, tmp_path / "probe").cache_name  # the entry name of this key
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        os.makedirs({str(tmp_path)!r}, exist_ok=True)
        fd = os.open({str(tmp_path / (name + '.lock'))!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        waiter = start_child(req, child_env(tmp_path))
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=3)  # blocked on the lock held by `holder`
    finally:
        holder.kill()  # dies without unlocking: the kernel drops its flock
        holder.wait()
    result, _ = finish(waiter)
    assert result["origin"] == "compile" and Path(result["path"]).is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a dir to another uid needs root (CI runs as root)")
def test_dir_owned_by_another_user_is_not_loaded_from(tmp_path):
    cache_dir = tmp_path / "theirs"
    req = request()
    build_in_child(req, cache_dir)
    os.chown(cache_dir, 65534, 65534)
    result, err = build_in_child(req, cache_dir)
    assert result["origin"] == "compile" and "owned by uid 65534" in err
