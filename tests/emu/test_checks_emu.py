"""The emulator's checks can fail: out-of-bounds read, LDS race, divergent collective, skipped barrier,
a global access outside the launch's ranges or in a launch that gave none.

Each case runs in a child process with a timeout, so a check that hangs instead of reporting fails
the test rather than the suite.
"""
import textwrap

import pytest

import emu_harness as h

pytestmark = pytest.mark.emu

CHILD = textwrap.dedent("""
    import struct, sys
    import numpy as np
    import emu_harness as h
    from rtcattn.runtime import _lib
    kernel, arch, cache, block, grid, params_kind = sys.argv[1:7]
    prog = h.build(kernel + ".hip", kernel, arch, cache)
    out = np.zeros(4096, dtype=np.float32)
    if params_kind in ("ranges", "no-ranges", "short-out"):  # a buffer of 3 x 64 bf16 and the output
        x = np.zeros(3 * 64, dtype=np.uint16)
        n = 0 if params_kind == "short-out" else x.size  # oob_read's lane 5 reads x[n]
        params = struct.pack("QQi4x", x.ctypes.data, out.ctypes.data, n)
        ranges = {"ranges": [(x.ctypes.data, x.nbytes), (out.ctypes.data, out.nbytes)],
                  "no-ranges": [],
                  "short-out": [(x.ctypes.data, x.nbytes), (out.ctypes.data, 32 * 2)]}[params_kind]
    elif params_kind == "short-probe":  # isa_probe's v_perm reads 3 x 64 words of a 64-word input
        x = np.zeros(64, dtype=np.uint32)
        params = struct.pack("QQii", x.ctypes.data, out.ctypes.data, 8, 0)  # op 8: kPerm
        ranges = [(x.ctypes.data, x.nbytes), (out.ctypes.data, out.nbytes)]
    else:
        params = struct.pack("Q", out.ctypes.data)
        ranges = [(out.ctypes.data, out.nbytes)]
    try:
        h.launch(prog, (int(grid), 1, 1), (int(block), 1, 1), params, ranges)
    except Exception as e:
        print("ERROR:", type(e).__name__, e)
        sys.exit(3)
    print("NO ERROR")
""")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def run_case(kernel, cache, block, grid=1, params="out", arch="gfx942-emu"):
    code = (f"import sys; sys.argv = ['x', {kernel!r}, {arch!r}, {cache!r}, {str(block)!r}, {str(grid)!r}, "
            f"{params!r}]\n")
    res = h.run_isolated(code + CHILD, timeout=180)
    assert res.returncode == 3, f"expected a reported error, got rc={res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout


def test_out_of_bounds_read_is_reported(cache):
    out = run_case("oob_read", cache, 64, params="ranges")
    assert "kernel oob_read" in out and "lane 5" in out and "global load" in out
    assert "outside every tensor" in out and "0x" in out   # the address


def test_store_outside_the_given_ranges_is_reported(cache):
    # the output's range covers 32 of the 64 bf16 the kernel stores: lane 32 stores past it
    out = run_case("oob_read", cache, 64, params="short-out")
    assert "kernel oob_read" in out and "lane 32" in out and "global store" in out
    assert "outside every tensor" in out


def test_read_past_a_short_input_is_reported(cache):
    # what test_exp2 once did unnoticed: a 64-word input, and the kernel reads words 64..191 of it
    out = run_case("isa_probe", cache, 64, params="short-probe")
    assert "kernel isa_probe" in out and "lane 0" in out and "global load" in out
    assert "outside every tensor" in out


def test_global_access_of_a_launch_without_ranges_is_reported(cache):
    out = run_case("oob_read", cache, 64, params="no-ranges")
    assert "kernel oob_read" in out and "lane 0" in out and "global load" in out
    assert "gave no global ranges" in out


def test_missing_barrier_race_is_reported(cache):
    out = run_case("race", cache, 128)
    assert "kernel race" in out and "LDS race" in out and "wave" in out


@pytest.mark.parametrize("arch", ["gfx942-emu", "gfx90a-emu"])
def test_divergent_collective_is_reported(cache, arch):
    out = run_case("divergent", cache, 128, grid=2, arch=arch)
    assert "kernel divergent" in out and "workgroup (1,0,0)" in out and "wave 1" in out
    assert "ds_swizzle_b32" in out and "divergent collective" in out


def test_barrier_never_reached_is_reported(cache):
    out = run_case("barrier_skip", cache, 256)
    assert "kernel barrier_skip" in out and "barrier" in out and "wave" in out
