"""A block table expanded from one row (stride 0: every sequence reads one page list, as a shared prefix
does) on the emulator, each kernel pinned: the same result as the table copied into memory, bit for
bit, and within the contract against the fp64 reference."""
import pytest

import varlen_suite as vs
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

CASES = [  # (kernel, lens_q, lens_k, window, mode)
    ("gfx942", [33, 7, 0, 50], [40, 70, 5, 64], (-1, 0), "rtne"),
    ("gfx942", [1, 1, 1], [90, 17, 64], (-1, -1), "rtz"),
    ("baseline", [33, 7, 0, 50], [40, 70, 5, 64], (10, 0), "rtna"),
]


@pytest.fixture(autouse=True)
def emulated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("kernel,lens_q,lens_k,window,mode", CASES, ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_expanded_block_table_equals_the_materialised_one(kernel, lens_q, lens_k, window, mode):
    b = vs.shared_pages(lens_q, lens_k, 4, 2, 128, 16, "cpu", seed=len(lens_q))
    with dispatch.pinned(kernel=kernel):
        vs.check_expanded_table_equals_materialised(b, mode, window)
        vs.check_accuracy(b, mode, window, what=f"{kernel} expanded table")
