"""Finite inputs at and past float32's range (docs/numerics.md §4) on the wave emulator: the baseline and
the gfx942 kernel (tail split off and forced on, so its merge stage meets the same inputs), pinned."""
import pytest

import overflow_suite as ovf
import rtcattn
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

KERNELS = {  # name -> pins: the gfx942 kernel with the emulated CU count of tests/emu/gfx942_driver.py
    "baseline": {"kernel": "baseline"},
    "gfx942": {"kernel": "gfx942", "tail_split": 0, "num_cus": dispatch.emulated_cus("gfx942-emu")},
    "gfx942-split": {"kernel": "gfx942", "tail_split": 3, "num_cus": dispatch.emulated_cus("gfx942-emu")},
}


@pytest.fixture(params=sorted(KERNELS))
def pins(request, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    return KERNELS[request.param]


def runner(pins):
    def run(q, k, v, scale, window):
        with dispatch.pinned(**pins):
            return rtcattn.forward(q, k, v, softmax_scale=scale, return_lse=True, window_size=window)
    return run


def varlen_runner(pins):
    packed = {"kernel": pins["kernel"]}  # packed calls run no tail split

    def run(q, k, v, cu_q, cu_k, max_q, max_k):
        with dispatch.pinned(**packed):
            return rtcattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True)
    return run


def test_at_the_bounds_finite_and_right(pins):
    ovf.check_at_the_bounds(runner(pins), "cpu")


def test_score_past_flt_max_is_a_nan_row(pins):
    ovf.check_score_past_flt_max_is_nan(runner(pins), "cpu")


def test_every_score_below_flt_max(pins):
    ovf.check_every_score_below_flt_max(runner(pins), "cpu")


def test_every_score_below_flt_max_beside_rows_without_keys(pins):
    ovf.check_every_score_below_flt_max_masked(runner(pins), varlen_runner(pins), "cpu")


def test_minus_inf_among_finite_scores_weighs_0(pins):
    # The emulated MFMA sums its 16 products in order after the accumulator, as the baseline's loop does.
    ovf.check_minus_inf_among_finite_scores(runner(pins), "cpu", sums_in_d_order=True)


def test_pv_sum_past_flt_max(pins):
    ovf.check_pv_sum_past_flt_max(runner(pins), "cpu")
