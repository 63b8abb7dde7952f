"""RTCATTN_EMU_SANITIZE: emulated kernels built with ASan + UBSan (the kernel half of `bash .ci/sanitize`)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIR = os.path.abspath(os.environ.get("RTC_TESTS_PYTHON_DIR") or ROOT / "python")
OK, OOB_READ, BAD_SHIFT = 0, 1, 2  # tests/emu/kernels/sanitize_probe.hip

# Builds sanitize_probe.hip into the cache dir argv[1] and runs it in mode argv[2] on a 300-int x.
CHILD = """
import sys
import numpy as np
import emu_harness as h
try:
    prog = h.build("sanitize_probe.hip", "sanitize_probe", "gfx942-emu", sys.argv[1])
except Exception as e:
    print("ERR", type(e).__name__, e)
    sys.exit(3)
x, out = np.arange(300, dtype=np.int32), np.zeros(64, dtype=np.int32)
params = h.pack("QQii", x.ctypes.data, out.ctypes.data, x.size, int(sys.argv[2]))
h.launch(prog, (1, 1, 1), (64, 1, 1), params, h.ranges_of(x, out))
print("RAN", int(out[5]))
"""


def sanitizer_preload():
    cxx = os.environ.get("CXX", "g++")
    try:
        paths = [subprocess.run([cxx, "-print-file-name=" + lib], capture_output=True, text=True).stdout.strip()
                 for lib in ("libasan.so", "libubsan.so")]
    except OSError:
        return None
    return " ".join(paths) if all(os.path.isfile(p) for p in paths) else None


def child(cache, mode, *, python_dir=PYTHON_DIR, preload=None, sanitize="1"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_") and k != "LD_PRELOAD"}
    env.update(RTCATTN_EMU_SANITIZE=sanitize, PYTHONPATH=os.pathsep.join([python_dir, str(ROOT / "tests" / "emu")]))
    # the planted bugs' reports are expected: on stderr, out of .ci/sanitize's report dir
    env.update(ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    if preload:
        env["LD_PRELOAD"] = preload
    return subprocess.run([sys.executable, "-c", CHILD, str(cache), str(mode)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_emu_sanitize_builds_kernels_under_asan_and_ubsan(tmp_path):
    # Without the sanitizer runtimes in the process the sanitized build is refused, by name (with the plain
    # runtime library: the sanitized one cannot even be loaded without them).
    r = child(tmp_path, OK, python_dir=str(ROOT / "python"))
    assert "ERR UnavailableError" in r.stdout and "RTCATTN_EMU_SANITIZE=1" in r.stdout, r.stdout + r.stderr
    assert "LD_PRELOAD" in r.stdout and "libasan.so" in r.stdout
    preload = sanitizer_preload()
    if preload is None:
        pytest.skip("the host compiler has no ASan/UBSan runtimes")
    # A plain build runs the planted overread unnoticed: a raw dereference, which no range check sees.
    plain = child(tmp_path, OOB_READ, preload=preload, sanitize="0")
    assert plain.returncode == 0 and "RAN" in plain.stdout, plain.stdout + plain.stderr
    ok = child(tmp_path, OK, preload=preload)
    assert ok.returncode == 0 and "RAN 5" in ok.stdout, ok.stdout + ok.stderr
    where = "from kernel sanitize_probe, workgroup (0,0,0), wave 0, lane 5"
    oob = child(tmp_path, OOB_READ, preload=preload)
    assert oob.returncode != 0 and "RAN" not in oob.stdout, oob.stdout + oob.stderr
    assert "AddressSanitizer: heap-buffer-overflow" in oob.stderr and where in oob.stderr, oob.stderr
    shift = child(tmp_path, BAD_SHIFT, preload=preload)
    assert shift.returncode != 0 and "RAN" not in shift.stdout, shift.stdout + shift.stderr
    assert "runtime error: shift exponent 40" in shift.stderr and where in shift.stderr, shift.stderr
    # Sanitized and plain objects have different cache keys: both are in the cache, side by side.
    objs = sorted(tmp_path.glob("emu_test-sanitize_probe-*.co"))
    assert len(objs) == 2, objs
    assert sorted(b"__asan_report" in p.read_bytes() and b"__ubsan_handle" in p.read_bytes() for p in objs) == [
        False, True]
