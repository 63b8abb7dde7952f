"""The baseline kernel on the wave emulator (gfx942 and gfx90a) meets the numerics contract on CPU tensors."""
import pytest
import torch

import numerics_suite as suite
import rtcattn

pytestmark = pytest.mark.emu

ARCHS = ("gfx942", "gfx90a")
SIZES = (1, 17, 128, 300)


@pytest.fixture(autouse=True)
def baseline_only(monkeypatch):
    """These tests are the baseline's: D = 128 would otherwise go to the fast kernel of the arch."""
    monkeypatch.setenv("RTCATTN_KERNEL", "baseline")


def run(q, k, v, layout, mode, scale, lse):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse)


@pytest.fixture(params=ARCHS)
def emulate(request, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", request.param)
    return request.param


@pytest.mark.parametrize("layout", suite.LAYOUTS)
@pytest.mark.parametrize("mode", suite.MODES)
def test_sizes_cross_attention_and_lse(emulate, layout, mode):
    suite.check_sizes(run, "cpu", layout, mode, SIZES)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_special_values(emulate, layout):
    for mode in suite.MODES:
        suite.check_special_values(run, "cpu", layout, mode)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_strided_views_and_determinism(emulate, layout):
    suite.check_strided(run, "cpu", layout, "rtne")
    suite.check_determinism(run, "cpu", layout, "rtna")


def test_archs_agree_bit_for_bit(monkeypatch):
    q, k, v = suite.make_qkv("bshd", 1, 2, 40, 77, 128, "cpu", seed=3)
    outs = []
    for arch in ARCHS:
        monkeypatch.setenv("RTCATTN_EMULATE", arch)
        outs.append(run(q, k, v, "bshd", "rtne", None, False))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
