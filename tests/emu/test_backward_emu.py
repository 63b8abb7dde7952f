"""The backward's AMD kernels on the wave emulator (gfx942; gfx90a gives the same bits: test_archs_agree_bit_for_bit):
what dispatch picks (the gfx942 kernel on the matrix cores up to head dim 192, the baseline above), and the baseline
pinned on a sample: dq, dk, dv within FlashAttention's accuracy rule of the fp64 reference, dense (both layouts) and
packed, causal and windows, GQA 1/4/8, Sq != Sk, head dims 8..256 (padded ones too), bf16 and fp16, the rounding
modes; zeros where nothing is seen; run to run the same bits; a training step's loss as with SDPA."""
import pytest
import torch

import backward_suite as suite
import rtcattn

pytestmark = pytest.mark.emu

ARCHS = ("gfx942", "gfx90a")


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (7, 3)])
def test_dense_windows_and_layouts(layout, window, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_dense("cpu", layout, 2, 4, 2, 37, 53, 64, window=window, what=f"{layout} {window}")


@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 1), (8, 1), (8, 2)])
def test_gqa_and_mqa(hq, hk, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_dense("cpu", "bshd", 1, hq, hk, 20, 33, 32, window=(-1, 0), what=f"GQA {hq}/{hk}")


@pytest.mark.parametrize("d", [8, 40, 59, 72, 111, 128, 200, 256])
def test_head_dims(d, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_dense("cpu", "bshd", 1, 2, 1, 18, 21, d, window=(-1, 0), what=f"D {d}")


@pytest.mark.parametrize("dtype,mode", [(torch.float16, "rtne"), (torch.bfloat16, "rtz"), (torch.bfloat16, "rtna")])
def test_dtypes_and_modes(dtype, mode, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_dense("cpu", "bshd", 1, 2, 2, 25, 40, 64, mode=mode, window=(-1, 0), dtype=dtype, what=f"{mode}")


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_packed_lengths_0_1_17_300(window, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_packed("cpu", [17, 0, 1, 300, 5], [40, 3, 1, 300, 0], 2, 1, 64, window=window)


def test_empty_rows_and_unseen_keys(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_empty_rows_and_unseen_keys("cpu")


def test_determinism(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_determinism("cpu")


@pytest.mark.parametrize("name", ["gfx942", "baseline"])
def test_archs_agree_bit_for_bit(monkeypatch, name):
    monkeypatch.setenv("RTCATTN_KERNEL", name)
    q, k, v, dout = suite.dense_inputs("bshd", 1, 4, 2, 29, 45, 96, "cpu", seed=3)
    runs = []
    for arch in ARCHS:
        monkeypatch.setenv("RTCATTN_EMULATE", arch)
        runs.append(suite.dense_grads(q, k, v, dout, "bshd", "rtne", (5, 2))[2:])
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(*runs))


def test_bad_gradient_inputs_are_refused_naming_them(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, k, v, dout = suite.dense_inputs("bshd", 1, 2, 2, 8, 8, 32, "cpu")
    out, lse = rtcattn.forward(q, k, v, return_lse=True)
    bwd = torch.ops.rtcattn.bwd
    with pytest.raises(ValueError, match=r"dout has shape \(1, 8, 2, 16\).*accepted: q's shape"):
        bwd(dout[..., :16], q, k, v, out, lse, "bshd", "rtne", None)
    with pytest.raises(ValueError, match=r"dout has shape .* dtype torch.float16.*accepted"):
        bwd(dout.half(), q, k, v, out, lse, "bshd", "rtne", None)
    with pytest.raises(ValueError, match=r"lse has shape \(1, 2, 7\).*accepted: .*float32 \(1, 2, 8\)"):
        bwd(dout, q, k, v, out, lse[..., :7], "bshd", "rtne", None)
    with pytest.raises(ValueError, match=r"dlse has shape .*float64"):
        bwd(dout, q, k, v, out, lse, "bshd", "rtne", None, -1, -1, True, lse.double())
    strided = torch.zeros(1, 8, 2, 64, dtype=dout.dtype)[..., ::2]
    with pytest.raises(ValueError, match=r"dout.stride\(-1\)=2: the head dim must be contiguous"):
        bwd(strided, q, k, v, out, lse, "bshd", "rtne", None)


def test_training_step_loss_goes_down_as_with_sdpa(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    suite.check_training("cpu")


@pytest.mark.parametrize("d,kernel", [(8, "gfx942"), (64, "gfx942"), (192, "gfx942"), (200, "baseline"),
                                      (256, "baseline")])
def test_dispatch_picks_the_gfx942_kernel_up_to_192(d, kernel, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    from rtcattn.ops.attention_bwd import selection
    q, k, v, dout = suite.dense_inputs("bshd", 1, 2, 1, 8, 8, d, "cpu")
    out, lse = rtcattn.forward(q, k, v, return_lse=True)
    assert selection(dout, q, k, v, out, lse).kernel.name == kernel


# The baseline (the reference on every arch) pinned on the emulator: a sample of the cases above.
@pytest.mark.parametrize("case", ["causal bshd", "window bhsd", "packed", "D 59", "fp16 rtne", "rtz"])
def test_baseline(case, monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_KERNEL", "baseline")
    if case == "packed":
        suite.check_packed("cpu", [17, 0, 1, 300, 5], [40, 3, 1, 300, 0], 2, 1, 64, window=(-1, 0))
        return
    layout, d, window, dtype, mode = "bshd", 64, (-1, 0), torch.bfloat16, "rtne"
    layout, window = ("bhsd", (7, 3)) if case == "window bhsd" else (layout, window)
    d = 59 if case == "D 59" else d
    dtype = torch.float16 if case == "fp16 rtne" else dtype
    mode = "rtz" if case == "rtz" else mode
    suite.check_dense("cpu", layout, 1, 4, 1, 25, 37, d, mode=mode, window=window, dtype=dtype, what=case)
