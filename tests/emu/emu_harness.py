"""Builds test kernels for the wave emulator through the product path (host compiler, cache, host loader)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

from rtcattn.runtime import _lib, manifest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KERNELS = HERE / "kernels"
# the rtcattn a child process imports: the one this run tests (tests/conftest.py, RTC_TESTS_PYTHON_DIR)
PYTHON_DIR = os.path.abspath(os.environ.get("RTC_TESTS_PYTHON_DIR") or ROOT / "python")


def build(kernel_file: str, symbol: str, arch: str, cache_dir: str, options=()) -> int:
    """The program handle of tests/emu/kernels/<kernel_file> compiled for arch (gfx942-emu, ...)."""
    headers = manifest.read_headers(ROOT / "csrc_common", True)
    src = (KERNELS / kernel_file).read_text()
    res = _lib.build("emu_test", symbol, arch, symbol, (kernel_file, src), headers, list(options),
                     compiler="host", cache_dir=cache_dir)
    return res.program


def launch(program: int, grid, block, params: bytes, ranges=()) -> None:
    """ranges: (address, bytes) of the buffers the kernel may touch (ranges_of); the emulator checks every
    global access against them, and a launch with none has no valid global memory."""
    _lib.launch(program, "host", 0, tuple(grid), tuple(block), params, ranges=ranges)


def ranges_of(*arrays) -> list:
    """The (address, bytes) range of each numpy array, for launch()."""
    return [(a.ctypes.data, a.nbytes) for a in arrays]


def run_isolated(code: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Runs python code in a child process, so a hang fails the test by timeout instead of
    stopping the suite."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, str(HERE), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


def pack(fmt: str, *values) -> bytes:
    return struct.pack(fmt, *values)
