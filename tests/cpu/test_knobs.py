"""Every knob has a test of its effect: the ones here, and the ones named in EFFECT_TESTS for knobs tested elsewhere."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rtcattn.runtime import _lib

ROOT = Path(__file__).resolve().parents[2]
P = "RTCATTN_"
B, H, S = 1, 100, 8192   # 100 (b, h) x 22 q blocks = 2200 items on 304 CUs: a tail of 72 items the planner splits

# knob -> the test that shows its effect ("module::function", under tests/).
EFFECT_TESTS = {
    P + "CACHE_DIR": "cpu.test_knobs::test_cache_dir_is_where_entries_go",
    P + "SYSTEM_CACHE": "cpu.test_cache::test_system_cache_is_searched_after_user_dir",
    P + "REBUILD": "cpu.test_cache::test_rebuild_ignores_cached_entries",
    P + "LOG": "cpu.test_knobs::test_log_reports_lookups_and_the_kernel_chosen",
    P + "NO_COMPILE": "cpu.test_cache::test_no_compile_fails_cold_and_passes_warm",
    P + "CLANG": "cpu.test_knobs::test_clang_names_the_compiler_used_for_amd",
    P + "CLANG22": "cpu.test_knobs::test_clang22_names_the_compiler_used_for_gfx950",
    P + "HOST_CXX": "cpu.test_knobs::test_host_cxx_names_the_emulator_compiler",
    P + "EMU_SANITIZE": "cpu.test_sanitize::test_emu_sanitize_builds_kernels_under_asan_and_ubsan",
    P + "EMULATE": "cpu.test_knobs::test_emulate_selects_the_emulated_arch",
    P + "LIBRARY_PATH": "cpu.test_knobs::test_library_path_dirs_are_searched_first",
    P + "NO_TAIL": "cpu.test_knobs::test_no_tail_turns_off_the_planned_split",
    P + "CHECK": "cpu.test_varlen_api::test_check_knob_reads_metadata_back_and_refuses_bad_values",
    P + "KERNEL": "emu.test_dispatch_emu::test_rtcattn_kernel_forces_one_kernel_without_fallback",
    P + "COMPILE_TIMEOUT": "cpu.test_cache_hardening::test_compile_timeout_stops_a_hanging_compiler",
    P + "LOCK_TIMEOUT": "cpu.test_cache_hardening::test_lock_wait_names_the_holder_and_times_out",
    P + "RECORD": "cpu.test_knobs::test_record_appends_each_variant_launched_once",
}


def test_every_declared_knob_has_an_effect_test():
    declared = set(_lib.info()["knobs"])
    assert declared == set(EFFECT_TESTS), f"knobs without an effect test: {declared - set(EFFECT_TESTS)}"
    sys.path.insert(0, str(ROOT / "tests"))
    for knob, ref in EFFECT_TESTS.items():
        module, fn = ref.split("::")
        assert callable(getattr(importlib.import_module(module), fn, None)), f"{knob}: {ref} does not exist"


def _child(code, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    full.update(PYTHONPATH=str(ROOT / "python"), **{k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)


def _plan(monkeypatch, no_tail, tail_split=-1):
    if no_tail is None:
        monkeypatch.delenv(P + "NO_TAIL", raising=False)
    else:
        monkeypatch.setenv(P + "NO_TAIL", no_tail)
    st = (S * H * 128, H * 128, 128)
    args = _lib.op_args("attention_fwd", q=1, k=1, v=1, o=1, q_strides=st, k_strides=st, v_strides=st, o_strides=st,
                        batch=B, heads=H, seq_q=S, seq_k=S, head_dim=128, heads_k=H, window_left=-1, window_right=-1,
                        softmax_scale=0.1, tail_split=tail_split,
                        num_cus=304)
    return _lib.op_plan("attention_fwd", "gfx942", args), _lib.op_workspace_bytes("attention_fwd", "gfx942", args)


def test_no_tail_turns_off_the_planned_split(monkeypatch):
    planned, ws_planned = _plan(monkeypatch, None)
    assert planned["split_g"] > 1 and planned["tail"] == 72 and planned["grid_merge"] > 0
    off, ws_off = _plan(monkeypatch, "1")
    assert off["split_g"] == 1 and off["tail"] == 0 and "grid_merge" not in off
    assert ws_off == off["vt_bytes"] < ws_planned == planned["workspace_bytes"]
    forced, _ = _plan(monkeypatch, "1", tail_split=4)  # an explicit request still wins over the knob
    assert forced["split_g"] == 4
    assert _plan(monkeypatch, "0")[0] == planned


def test_cache_dir_is_where_entries_go(tmp_path):
    code = ("from rtcattn.runtime import dispatch, manifest\n"
            "v = manifest.load().variant_for('attention_fwd', 'baseline', 'sm_90a', "
            "{'round_mode': 'rtz', 'mask': 'none', 'kv': 'dense', 'head_dim': 64, 'dtype': 'bf16', "
            "'kv_dtype': 'same', 'score_mod': 'plain', 'dropout': 'nodrop'})\n"
            "print(dispatch.build(v).path)")
    r = _child(code, RTCATTN_CACHE_DIR=tmp_path / "here")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.parent == tmp_path / "here" and path.is_file() and path.name.startswith("attention_fwd-baseline-")


def test_log_reports_lookups_and_the_kernel_chosen(tmp_path):
    code = ("import torch, rtcattn\n"
            "q = torch.randn(1, 20, 1, 64).to(torch.bfloat16)\n"  # 20 query rows: a prefill call
            "rtcattn.forward(q, q, q)")
    quiet = _child(code, RTCATTN_EMULATE="gfx942", RTCATTN_CACHE_DIR=tmp_path)
    loud = _child(code, RTCATTN_EMULATE="gfx942", RTCATTN_CACHE_DIR=tmp_path, RTCATTN_LOG=1)
    assert quiet.returncode == 0 and loud.returncode == 0, (quiet.stderr, loud.stderr)
    lookup = "[rtcattn] lookup attention_fwd-gfx942-rtne-none-dense-d64-bf16-same-plain-nodrop-gfx942-emu"
    assert lookup not in quiet.stderr and lookup in loud.stderr
    assert "attention_fwd: kernel gfx942 (gfx942-rtne-none-dense-d64-bf16-same-plain-nodrop, gfx942-emu)" in loud.stderr


def test_record_appends_each_variant_launched_once(tmp_path):
    code = ("import torch, rtcattn\n"
            "q = torch.randn(1, 20, 1, 40).to(torch.bfloat16)\n"  # 20 query rows: a prefill call
            "rtcattn.forward(q, q, q)\n"
            "rtcattn.forward(q, q, q)")
    record = tmp_path / "model.jsonl"
    r = _child(code, RTCATTN_EMULATE="gfx942", RTCATTN_CACHE_DIR=tmp_path / "cache", RTCATTN_RECORD=record)
    assert r.returncode == 0, r.stderr
    [line] = record.read_text().splitlines()
    assert json.loads(line) == {"op": "attention_fwd", "arch": "gfx942-emu", "kernel": "gfx942",
                                "variant": "gfx942-rtne-none-dense-d64-bf16-same-plain-nodrop",
                                "call": {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 40,
                                         "dtype": "bf16", "kv_dtype": "same", "score_mod": "plain",
                                         "dropout": "nodrop"}}


def test_clang_names_the_compiler_used_for_amd(tmp_path):
    code = ("from rtcattn.runtime import _lib\n"
            "src = '#include \"platform.h\"\\nRTC_KERNEL(64) k(int) {}\\n'\n"
            "plat = open('csrc_common/platform.h').read()\n"
            "try:\n"
            "    r = _lib.build('t', 'v', 'gfx942', 'k', ('k.hip', src), [('platform.h', plat)], compiler='clang', "
            f"cache_dir={str(tmp_path)!r})\n"
            "    print('ID', r.compiler_id)\n"
            "except Exception as e:\n"
            "    print('ERR', type(e).__name__, e)\n")
    missing = _child(code, RTCATTN_CLANG=tmp_path / "no-clang")
    assert "ERR UnavailableError" in missing.stdout and "RTCATTN_CLANG=" in missing.stdout, missing.stdout
    clang = next((c for c in ("clang++-19", "clang++") if __import__("shutil").which(c)), None)
    if clang:
        found = _child(code, RTCATTN_CLANG=clang)
        assert "ID clang" in found.stdout, found.stdout + found.stderr


def test_clang22_names_the_compiler_used_for_gfx950(tmp_path):
    code = ("from rtcattn.runtime import _lib\n"
            "src = '#include \"platform.h\"\\nRTC_KERNEL(64) k(int) {}\\n'\n"
            "plat = open('csrc_common/platform.h').read()\n"
            "try:\n"
            "    r = _lib.build('t', 'v', 'gfx950', 'k', ('k.hip', src), [('platform.h', plat)], compiler='clang22', "
            f"cache_dir={str(tmp_path)!r})\n"
            "    print('ID', r.compiler_id)\n"
            "except Exception as e:\n"
            "    print('ERR', type(e).__name__, e)\n")
    missing = _child(code, RTCATTN_CLANG22=tmp_path / "no-clang")
    assert "ERR UnavailableError" in missing.stdout and "RTCATTN_CLANG22=" in missing.stdout, missing.stdout
    which = __import__("shutil").which
    if which("clang++-19"):  # a clang without gfx950 is refused before any compile, naming the knob
        old = _child(code, RTCATTN_CLANG22=which("clang++-19"))
        assert "ERR UnavailableError" in old.stdout and "cannot target gfx950" in old.stdout, old.stdout
        assert "set RTCATTN_CLANG22" in old.stdout, old.stdout
    if which("clang++-22"):
        found = _child(code, RTCATTN_CLANG22=which("clang++-22"))
        assert "ID clang22" in found.stdout, found.stdout + found.stderr


def test_host_cxx_names_the_emulator_compiler(tmp_path):
    code = ("import torch, rtcattn\n"
            "q = torch.randn(1, 20, 1, 64).to(torch.bfloat16)\n"  # 20 query rows: a prefill call
            "try:\n"
            "    rtcattn.forward(q, q, q)\n"
            "    print('RAN')\n"
            "except Exception as e:\n"
            "    print('ERR', type(e).__name__, e)\n")
    r = _child(code, RTCATTN_EMULATE="gfx942", RTCATTN_CACHE_DIR=tmp_path, RTCATTN_HOST_CXX=tmp_path / "no-cxx")
    assert "ERR UnavailableError" in r.stdout and "no host C++ compiler" in r.stdout, r.stdout + r.stderr
    assert f"RTCATTN_HOST_CXX='{tmp_path / 'no-cxx'}' is not an executable" in r.stdout, r.stdout + r.stderr


def test_emulate_selects_the_emulated_arch(monkeypatch):
    import torch

    from rtcattn.runtime import dispatch
    monkeypatch.setenv(P + "EMULATE", "gfx90a")
    assert dispatch.arch_of(torch.device("cpu")) == "gfx90a-emu"
    monkeypatch.setenv(P + "EMULATE", "gfx942")
    assert dispatch.arch_of(torch.device("cpu")) == "gfx942-emu"
    monkeypatch.delenv(P + "EMULATE")
    with pytest.raises(ValueError, match="RTCATTN_EMULATE is unset"):
        dispatch.arch_of(torch.device("cpu"))


def test_library_path_dirs_are_searched_first(tmp_path):
    """A stand-in libamdhip64 (one device) in a LIBRARY_PATH dir wins over the system's; hipRTC, which the
    stand-in lacks, is still found past it."""
    gcc = __import__("shutil").which("gcc") or __import__("shutil").which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "libamdhip64.so"),
                    str(ROOT / "tests" / "cpu" / "hip_standin" / "libamdhip64.c")], check=True)
    code = ("from rtcattn.runtime import _lib\n"
            "hiprtc = next(c for c in _lib.info()['compilers'] if c['name'] == 'hiprtc')\n"
            "print(_lib.device_count('hip'), hiprtc['available'])")
    without = _child(code)
    with_dir = _child(code, RTCATTN_LIBRARY_PATH=tmp_path, STANDIN_HIP_LOG=tmp_path / "log")
    assert without.returncode == 0 and with_dir.returncode == 0, (without.stderr, with_dir.stderr)
    devices, hiprtc = without.stdout.split()
    assert devices == "0"                                   # no GPU: the system's HIP finds none
    assert with_dir.stdout.split() == ["1", hiprtc]         # the stand-in's one device; hipRTC unchanged


FAKE_HIPRTC = """
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char* path = getenv("PLANTED_MARKER");
    FILE* f = path ? fopen(path, "a") : NULL;
    if (f) { fputs("constructor ran\\n", f); fclose(f); }
}
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root (CI runs as root)")
@pytest.mark.parametrize("kind,why", [("dir-0777", "writable by other users"),
                                      ("dir-other-owner", "owned by uid 65534"), ("file-symlink", "symbolic link"),
                                      ("file-other-owner", "owned by uid 65534"),
                                      ("file-group-writable", "writable by its group")])
def test_library_path_loads_nothing_from_an_untrusted_place(tmp_path, kind, why):
    """A library's constructor runs at dlopen, before any check of what it exports: a LIBRARY_PATH file is
    checked under the cache's trust rules first, and a refused one is reported, never loaded."""
    gcc = __import__("shutil").which("gcc") or __import__("shutil").which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    (tmp_path / "planted.c").write_text(FAKE_HIPRTC)
    built = tmp_path / "real" / "libhiprtc.so"
    built.parent.mkdir(mode=0o755)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(built), str(tmp_path / "planted.c")], check=True)
    built.chmod(0o755)
    lib_dir = tmp_path / "libs"
    lib_dir.mkdir(mode=0o755)
    lib = lib_dir / "libhiprtc.so"
    if kind == "file-symlink":
        lib.symlink_to(built)
    else:
        __import__("shutil").copyfile(built, lib)
        lib.chmod(0o775 if kind == "file-group-writable" else 0o755)
    if kind == "file-other-owner":
        os.chown(lib, 65534, 65534)
    if kind == "dir-0777":
        lib_dir.chmod(0o777)
    if kind == "dir-other-owner":
        os.chown(lib_dir, 65534, 65534)
    marker = tmp_path / "marker"
    env = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    env.update(PYTHONPATH=str(ROOT / "python"), RTCATTN_LIBRARY_PATH=str(lib_dir), PLANTED_MARKER=str(marker))
    r = subprocess.run([sys.executable, "-m", "rtcattn", "info", "--json"], capture_output=True, text=True,
                       env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), "the planted library's constructor ran"
    info = json.loads(r.stdout)
    [d] = info["library_path"]
    assert d["path"] == str(lib_dir) and d["usable"] == kind.startswith("file")
    assert kind.startswith("file") or why in d["reason"]
    refused = {x["path"]: x["reason"] for x in info["refused_libraries"]}
    assert why in refused.get(str(lib), ""), refused
    assert f"library {lib} (from RTCATTN_LIBRARY_PATH) is not loaded because" in r.stderr and why in r.stderr
    hiprtc = next(c for c in info["compilers"] if c["name"] == "hiprtc")
    assert str(lib) not in (hiprtc["version"] or "")

@pytest.mark.parametrize("name", [P + "COMPILE_TIMEOUT", P + "LOCK_TIMEOUT"])
@pytest.mark.parametrize("value,why", [("0", "out of range"), ("-5", "out of range"), ("604801", "out of range"),
                                       ("99999999999999999999", "out of range"), (" 5", "not an integer"),
                                       ("5 ", "not an integer"), ("+5", "not an integer"), ("5s", "not an integer"),
                                       ("1e3", "not an integer")])
def test_timeout_knobs_accept_only_a_positive_bounded_number_of_seconds(monkeypatch, name, value, why):
    """No value means "no limit" (a hung compiler or lock holder would block forever); an overflowing value is
    refused, not clamped; white space is refused on either side."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as e:
        _lib.knob(name)
    msg = str(e.value)
    assert f"{name}={value!r}" in msg and why in msg and "accepted: an integer from 1 to 604800" in msg
    for good in ("1", "604800", "17"):
        monkeypatch.setenv(name, good)
        assert _lib.knob(name) == good


def test_bad_timeout_knob_fails_the_build_before_any_compile(tmp_path):
    code = ("from rtcattn.runtime import _lib\n"
            "src = '#include \"platform.h\"\\nRTC_KERNEL(64) k(int) {}\\n'\n"
            "plat = open('csrc_common/platform.h').read()\n"
            "try:\n"
            "    _lib.build('t', 'v', 'gfx942', 'k', ('k.hip', src), [('platform.h', plat)], compiler='clang', "
            f"cache_dir={str(tmp_path)!r})\n"
            "    print('BUILT')\n"
            "except Exception as e:\n"
            "    print('ERR', type(e).__name__, e)\n")
    for knob in ("COMPILE_TIMEOUT", "LOCK_TIMEOUT"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**{k: v for k, v in os.environ.items() if not k.startswith(P)},
                                "PYTHONPATH": str(ROOT / "python"), P + knob: "0"})
        assert f"ERR ValueError {P}{knob}='0' is out of range" in r.stdout, r.stdout + r.stderr
        assert not list(tmp_path.glob("*.co"))
