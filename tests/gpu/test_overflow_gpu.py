"""Finite inputs at and past float32's range (docs/numerics.md §4) on a GPU: the sm90 kernel (Hopper) and
the baseline, each pinned, with the emulator's checks (tests/overflow_suite.py)."""
import pytest

torch = pytest.importorskip("torch")

import overflow_suite as ovf  # noqa: E402

pytestmark = pytest.mark.gpu


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.fixture(params=["sm90", "baseline"])
def kernel(request):
    if request.param == "sm90" and not _hopper():
        pytest.skip("the sm_90a kernel needs a Hopper GPU (compute capability 9.x)")
    return request.param


def runner(kernel):
    def run(q, k, v, scale, window):
        import rtcattn
        from rtcattn.runtime import dispatch
        out = torch.empty_like(q)
        out.view(torch.int16).fill_(-1)   # poisoned: a NaN nobody writes on purpose
        with dispatch.pinned(kernel=kernel):
            return rtcattn.forward(q, k, v, softmax_scale=scale, return_lse=True, window_size=window, out=out)
    return run


def varlen_runner(kernel):
    def run(q, k, v, cu_q, cu_k, max_q, max_k):
        import rtcattn
        from rtcattn.runtime import dispatch
        with dispatch.pinned(kernel=kernel):
            return rtcattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True)
    return run


def test_at_the_bounds_finite_and_right(kernel):
    ovf.check_at_the_bounds(runner(kernel), "cuda")


def test_score_past_flt_max_is_a_nan_row(kernel):
    ovf.check_score_past_flt_max_is_nan(runner(kernel), "cuda")


def test_every_score_below_flt_max(kernel):
    ovf.check_every_score_below_flt_max(runner(kernel), "cuda")


def test_every_score_below_flt_max_beside_rows_without_keys(kernel):
    ovf.check_every_score_below_flt_max_masked(runner(kernel), varlen_runner(kernel), "cuda")


def test_minus_inf_among_finite_scores_weighs_0(kernel):
    # The baseline's loop sums q·k in d order; wgmma's order and internal width are the hardware's.
    ovf.check_minus_inf_among_finite_scores(runner(kernel), "cuda", sums_in_d_order=kernel == "baseline")


def test_pv_sum_past_flt_max(kernel):
    ovf.check_pv_sum_past_flt_max(runner(kernel), "cuda")
