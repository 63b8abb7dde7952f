"""Causal and sliding-window masks and GQA/MQA through rtcattn.forward on the emulator, against the fp64
reference with the mask (docs/numerics.md: bottom-right alignment, rows that see no key give 0 / -Inf).

Design: every window x (Sq, Sk) pair runs once, with the GQA ratio, layout and round mode taken in
turn, so each value of each appears with several windows and sizes; the kernels that do not take a
window yet (the fast ones) fall back to one that does, which the selection test shows.
"""
import itertools

import pytest
import torch

import numerics_suite as suite
import rtcattn
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref

pytestmark = pytest.mark.emu

# (left, right): causal; windows 0, 1, 17, 256 both sides; asymmetric; one side unbounded.
WINDOWS = [(-1, 0), (0, 0), (1, 1), (17, 17), (256, 256), (17, 3), (-1, 5), (7, -1)]
HEADS = [(4, 4), (8, 2), (8, 1), (3, 1)]          # (Hq, Hk): ratio 1, 4, 8 (Hk = 1), MQA
SIZES = [(45, 130), (96, 96), (130, 45)]          # Sq < Sk, Sq = Sk, Sq > Sk (rows that see nothing)
CASES = [(w, s, HEADS[i % 4], suite.LAYOUTS[i % 2], suite.MODES[(i // 2) % 3])
         for i, (w, s) in enumerate(itertools.product(WINDOWS, SIZES))]


def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                           window_size=window)


@pytest.fixture(params=["gfx942", "gfx90a"])
def arch(request, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", request.param)
    return request.param


def test_design_covers_every_value():
    for i, values in enumerate((WINDOWS, SIZES, HEADS, suite.LAYOUTS, suite.MODES)):
        assert {c[i] for c in CASES} == set(values)


@pytest.mark.parametrize("window,sizes,heads,layout,mode", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_window_gqa_against_fp64(monkeypatch, window, sizes, heads, layout, mode):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    (sq, sk), (hq, hk) = sizes, heads
    q, k, v = suite.make_qkv(layout, 1, hq, sq, sk, 64, "cpu", seed=sq + hk, hk=hk)
    suite.check_accuracy(run, q, k, v, layout, mode, what="mask", window=window)


def test_gfx90a_and_gfx942_emulation_agree(arch):
    q, k, v = suite.make_qkv("bhsd", 2, 8, 70, 150, 64, "cpu", seed=11, hk=2)
    out, lse = run(q, k, v, "bhsd", "rtne", None, True, (-1, 0))
    o64, lse64 = ref.reference_fp64(q, k, v, "bhsd", None, (-1, 0))
    assert bool(ref.lse_close(lse, lse64).all())
    suite.check_accuracy(run, q, k, v, "bhsd", "rtna", what=arch, window=(17, 3))


@pytest.mark.parametrize("layout", suite.LAYOUTS)
@pytest.mark.parametrize("window", [(-1, 0), (3, 2)])
def test_special_values_under_a_window(monkeypatch, layout, window):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    for mode in suite.MODES:
        suite.check_window_special_values(run, "cpu", layout, mode, window, sq=30, sk=20, hk=1)


def test_causal_gqa_is_deterministic(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, k, v = suite.make_qkv("bshd", 1, 8, 77, 200, 128, "cpu", seed=4, hk=2)
    outs = [run(q, k, v, "bshd", "rtz", None, True, (-1, 0)) for _ in range(3)]
    for o, lse in outs[1:]:
        assert torch.equal(ref.bf16_bits(o), ref.bf16_bits(outs[0][0]))
        assert torch.equal(lse.view(torch.int32), outs[0][1].view(torch.int32))


def test_alignment_examples_of_the_contract(monkeypatch):
    """Sq = 2, Sk = 5 causal sees 11110 / 11111; Sq = 5, Sk = 2 sees 00 / 00 / 00 / 10 / 11."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    assert ref.visible(2, 5, (-1, 0)).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert ref.visible(5, 2, (-1, 0)).int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    # One-hot V rows make each output the softmax weight of each key: zero exactly where masked.
    for sq, sk in ((2, 5), (5, 2)):
        q = torch.zeros(1, sq, 1, 64, dtype=torch.bfloat16)
        k = torch.zeros(1, sk, 1, 64, dtype=torch.bfloat16)
        v = torch.zeros(1, sk, 1, 64, dtype=torch.bfloat16)
        for j in range(sk):
            v[0, j, 0, j] = 1.0
        out, lse = run(q, k, v, "bshd", "rtne", None, True, (-1, 0))
        seen = (out[0, :, 0, :sk].float() > 0).int()
        assert torch.equal(seen, ref.visible(sq, sk, (-1, 0)).int()), (sq, sk, seen)
        assert torch.isinf(lse[0, 0]).tolist() == (~ref.visible(sq, sk, (-1, 0)).any(1)).tolist()


def test_masked_and_gqa_calls_take_the_fast_kernel(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, k, v = suite.make_qkv("bshd", 1, 4, 40, 40, 128, "cpu", seed=1)
    assert attention_fwd.selection(q, k, v).variant.name == "gfx942-rtne-none-dense-d128-bf16-same-plain-nodrop"
    assert (attention_fwd.selection(q, k, v, window=(-1, 0)).variant.name
            == "gfx942-rtne-window-dense-d128-bf16-same-plain-nodrop")
    q8 = suite.make_qkv("bshd", 1, 8, 40, 40, 128, "cpu", seed=1, hk=2)
    assert attention_fwd.selection(*q8).kernel.name == "gfx942"
    q64 = suite.make_qkv("bshd", 1, 8, 40, 40, 64, "cpu", seed=1, hk=2)
    assert (attention_fwd.selection(*q64, window=(-1, 0)).variant.name
            == "gfx942-rtne-window-dense-d64-bf16-same-plain-nodrop")


# ---- the gfx942 kernel (D = 128): windows x GQA with the tail split forced off and on ----------------

GFX942_CASES = [((-1, 0), (700, 700), (4, 1)), ((-1, 0), (500, 1300), (8, 2)), ((-1, 0), (1300, 500), (2, 2)),
                ((100, 30), (900, 900), (4, 2)), ((0, 0), (400, 450), (3, 1)), ((-1, 70), (800, 300), (4, 4)),
                ((300, -1), (385, 1000), (2, 1)), ((1, 1), (500, 520), (8, 1)), ((17, 17), (600, 600), (4, 2)),
                ((256, 256), (1000, 700), (2, 1))]


def gfx942_run(tail_split, arch="gfx942"):
    import gfx942_driver as drv

    def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
        return drv.forward(q, k, v, layout, mode, scale, lse, arch=arch, tail_split=tail_split, window=window)
    return run


@pytest.mark.parametrize("tail_split", [0, 3])
@pytest.mark.parametrize("window,sizes,heads", GFX942_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in GFX942_CASES])
def test_gfx942_window_gqa_against_fp64(window, sizes, heads, tail_split):
    (sq, sk), (hq, hk) = sizes, heads
    i = GFX942_CASES.index((window, sizes, heads))
    layout, mode = suite.LAYOUTS[i % 2], suite.MODES[(i + tail_split) % 3]
    q, k, v = suite.make_qkv(layout, 1, hq, sq, sk, 128, "cpu", seed=sq + hk, hk=hk)
    suite.check_accuracy(gfx942_run(tail_split), q, k, v, layout, mode, what=f"gfx942 split={tail_split}",
                         window=window)


@pytest.mark.parametrize("tail_split", [0, 3])
def test_gfx942_window_special_values_and_gfx90a_agrees(tail_split):
    suite.check_window_special_values(gfx942_run(tail_split), "cpu", "bshd", "rtz", (-1, 0), sq=400, sk=300, d=128,
                                      hk=1)
    q, k, v = suite.make_qkv("bhsd", 1, 4, 450, 700, 128, "cpu", seed=8, hk=2)
    a = gfx942_run(tail_split)(q, k, v, "bhsd", "rtne", None, True, (-1, 0))
    b = gfx942_run(tail_split, "gfx90a")(q, k, v, "bhsd", "rtne", None, True, (-1, 0))
    assert torch.equal(ref.bf16_bits(a[0]), ref.bf16_bits(b[0])) and torch.equal(a[1].view(torch.int32),
                                                                                  b[1].view(torch.int32))


def test_gfx942_masked_split_is_deterministic():
    q, k, v = suite.make_qkv("bshd", 1, 4, 800, 900, 128, "cpu", seed=12, hk=1)
    run = gfx942_run(4)
    outs = [run(q, k, v, "bshd", "rtna", None, True, (-1, 0)) for _ in range(2)]
    assert torch.equal(ref.bf16_bits(outs[0][0]), ref.bf16_bits(outs[1][0]))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))
