"""Argument validation before launch, Sq = 0, and flash_attn_func's AITER mapping (CPU, no kernel runs)."""
import math

import pytest
import torch

import rtcattn
from rtc_testing import need_lib
from rtcattn.ops.attention_fwd import stub

BF = torch.bfloat16


def qkv(b=1, s=4, h=2, d=64, sk=None, device="cpu"):
    sk = s if sk is None else sk
    return (torch.randn(b, s, h, d, dtype=BF, device=device), torch.randn(b, sk, h, d, dtype=BF, device=device),
            torch.randn(b, sk, h, d, dtype=BF, device=device))


@pytest.fixture
def fake_launch(monkeypatch):
    """Replaces the launch with a recorder that writes a known value, so nothing needs a GPU."""
    calls = []

    def run(q, k, v, out, return_lse, layout, round_mode, problem):
        calls.append(dict(layout=layout, round_mode=round_mode, problem=problem, lse=return_lse))
        out = torch.empty_like(q) if out is None else out
        out.fill_(0.5)
        lse = torch.full((problem.batch, problem.heads, problem.seq_q) if return_lse else (0,), -1.0)
        return out, lse
    monkeypatch.setattr(stub, "launch", run)
    return calls


def raises(exc, call, *words):
    with pytest.raises(exc) as info:
        call()
    for w in words:
        assert w in str(info.value), f"{w!r} not in message: {info.value}"
    return info.value


def test_dtype():
    q, k, v = qkv()
    raises(TypeError, lambda: rtcattn.forward(q.half(), k, v), "mismatched dtypes", "q.dtype=torch.float16",
           "k.dtype=torch.bfloat16", "v.dtype=torch.bfloat16", "one dtype for all of q, k, v")
    raises(TypeError, lambda: rtcattn.forward(q, k.float(), v), "k.dtype=torch.float32", "torch.bfloat16",
           "torch.float16")
    raises(TypeError, lambda: rtcattn.forward(q, k, "v"), "v must be a torch.Tensor", "str")


FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz") if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *FP8], ids=str)
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_dtypes_other_than_bf16_and_fp16_are_refused(dtype, which):
    """fp8 and fp32 (any of q, k, v, all three alike too) are refused, naming the argument and both accepted dtypes."""
    q, k, v = (t.half() for t in qkv())
    args = {"q": q, "k": k, "v": v, which: torch.zeros((1, 4, 2, 64), dtype=dtype)}
    raises(TypeError, lambda: rtcattn.forward(**args), f"{which}.dtype={dtype}", "torch.bfloat16, torch.float16")
    raises(TypeError, lambda: rtcattn.forward(*(t.to(dtype) for t in (q, k, v))), f"q.dtype={dtype}",
           "torch.bfloat16, torch.float16")


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_fp16_and_bf16_is_refused_naming_both(which):
    q, k, v = (t.half() for t in qkv())
    args = {"q": q, "k": k, "v": v, which: {"k": k, "v": v}[which].bfloat16()}
    err = raises(TypeError, lambda: rtcattn.forward(**args), "mismatched dtypes", "q.dtype=torch.float16",
                 f"{which}.dtype=torch.bfloat16", "accepted: one dtype for all of q, k, v")
    assert "torch.bfloat16 or torch.float16" in str(err)


def test_out_must_have_the_inputs_dtype():
    q, k, v = (t.half() for t in qkv())
    raises(TypeError, lambda: rtcattn.forward(q, k, v, out=torch.empty_like(q, dtype=BF)), "mismatched dtypes",
           "q.dtype=torch.float16", "out.dtype=torch.bfloat16")
    q, k, v = qkv()
    raises(TypeError, lambda: rtcattn.forward(q, k, v, out=torch.empty_like(q, dtype=torch.float16)),
           "q.dtype=torch.bfloat16", "out.dtype=torch.float16")


def test_fp16_call_reaches_launch_and_round_mode_is_still_checked(fake_launch):
    q, k, v = (t.half() for t in qkv())
    out = rtcattn.forward(q, k, v, round_mode="rtz")
    assert out.dtype == torch.float16 and fake_launch[-1]["round_mode"] == "rtz"  # the stub maps it (selection)
    raises(ValueError, lambda: rtcattn.forward(q, k, v, round_mode="rne"), "round_mode='rne'", "'rtne', 'rtna', 'rtz'")
    raises(ValueError, lambda: rtcattn.flash_attn_func(q, k, v, how_v3_bf16_cvt=3), "how_v3_bf16_cvt=3")


def test_varlen_dtypes():
    q, k, v = (t[0].half() for t in qkv(s=6))
    cu = torch.tensor([0, 6], dtype=torch.int32)
    raises(TypeError, lambda: rtcattn.forward_varlen(q, k.bfloat16(), v, cu, cu, 6, 6), "mismatched dtypes",
           "q.dtype=torch.float16", "k.dtype=torch.bfloat16")
    raises(TypeError, lambda: rtcattn.forward_varlen(q, k, v, cu, cu, 6, 6, out=torch.empty_like(q, dtype=BF)),
           "q.dtype=torch.float16", "out.dtype=torch.bfloat16")
    raises(TypeError, lambda: rtcattn.forward_varlen(q.float(), k.float(), v.float(), cu, cu, 6, 6),
           "q.dtype=torch.float32", "torch.bfloat16, torch.float16")


def test_ndim():
    q, k, v = qkv()
    raises(ValueError, lambda: rtcattn.forward(q[0], k, v), "q.ndim=3", "4 dims")


@pytest.mark.parametrize("arg,value", [("layout", "bsdh"), ("round_mode", "rne"), ("layout", None)])
def test_layout_and_mode_strings(arg, value):
    q, k, v = qkv()
    err = raises(ValueError, lambda: rtcattn.forward(q, k, v, **{arg: value}), f"{arg}={value!r}")
    accepted = ("'bshd', 'bhsd'") if arg == "layout" else "'rtne', 'rtna', 'rtz'"
    assert accepted in str(err)


def test_mismatched_batch_heads_dim_and_seq():
    q, k, v = qkv(b=2)
    raises(ValueError, lambda: rtcattn.forward(q, k[:1], v), "batch size", "q=2", "k=1", "v=2")
    q, k, v = qkv(h=4)
    raises(ValueError, lambda: rtcattn.forward(q, k, v[:, :, :3]), "number of heads", "v=3")
    q, k, v = qkv(d=128)
    raises(ValueError, lambda: rtcattn.forward(q, k[..., :64], v), "head dim", "q=128", "k=64")
    q, k, v = qkv(sk=6)
    raises(ValueError, lambda: rtcattn.forward(q, k, v[:, :5]), "key/value sequence length", "k=6", "v=5")


def test_mismatch_follows_layout():
    # [B, H, S, D]: dim 1 is heads in bhsd; the same tensors are consistent as bshd only if S matches.
    q = torch.randn(1, 2, 4, 64, dtype=BF)
    k = torch.randn(1, 3, 4, 64, dtype=BF)
    raises(ValueError, lambda: rtcattn.forward(q, k, k, layout="bhsd"), "number of heads", "layout 'bhsd'")


def test_sk_zero():
    q, k, v = qkv(sk=0)
    raises(ValueError, lambda: rtcattn.forward(q, k, v), "Sk=0", "Sk >= 1")


HEAD_DIM_RULE = "a head dim in 8..256; one that is not a multiple of 8 is padded to the next multiple of 8"


@pytest.mark.parametrize("d", [0, 1, 4, 7, 257, 264, 512])
def test_head_dim_unsupported(d):
    q, k, v = qkv(d=d)
    raises(ValueError, lambda: rtcattn.forward(q, k, v), f"D={d} (q.shape={tuple(q.shape)})", HEAD_DIM_RULE)
    raises(ValueError, lambda: rtcattn.flash_attn_func(q, k, v), f"D={d}", HEAD_DIM_RULE)
    raises(ValueError, lambda: rtcattn.forward(q, k, v, out=torch.empty_like(q)), f"D={d}", HEAD_DIM_RULE)


@pytest.fixture
def echo_launch(monkeypatch):
    """The launch replaced by one that writes q into the output (what the padded call gives is then known) and
    records what it was called with; CPU tensors need the emulated arch (the call is sized in the runtime)."""
    need_lib()
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    calls = []

    def run(q, k, v, out, return_lse, layout, round_mode, problem):
        calls.append(dict(q=q, k=k, v=v, out=out, problem=problem))
        out = torch.empty(q.shape, dtype=q.dtype) if out is None else out   # contiguous, as launch allocates it
        out.copy_(q)
        b, s, h, _ = q.shape if layout == "bshd" else (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
        return out, torch.full((b, h, s) if return_lse else (0,), -1.0)
    monkeypatch.setattr(stub, "launch", run)
    return calls


@pytest.mark.parametrize("d,padded", [(8, 8), (32, 32), (40, 40), (60, 64), (100, 104), (111, 112), (255, 256)])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_head_dims_from_8_reach_the_kernels_padded_to_a_multiple_of_8(echo_launch, d, padded, layout):
    """D = 32 and 40 (refused before head dims went down to 8) run as they are; D = 60, 100 (refused: not
    multiples of 8) run padded with zero columns; the scale stays 1/sqrt(D) of the call's own head dim."""
    q, k, v = qkv(d=d, sk=6)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))   # views: padding copies them in their own dim order
    out, lse = rtcattn.forward(q, k, v, layout=layout, return_lse=True)
    call = echo_launch[-1]
    assert call["problem"].head_dim == padded and call["q"].shape == (*q.shape[:3], padded)
    assert math.isclose(call["problem"].scale, 1 / math.sqrt(d), rel_tol=1e-6)
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert torch.equal(call[name][..., :d], t), name
        assert not bool(call[name][..., d:].any()), f"{name}'s padding columns are not zero"
    assert out.shape == q.shape and out.is_contiguous() and torch.equal(out, q)
    assert lse.shape == (1, 2, 4)
    given = torch.full_like(q, 7.0)
    res, _ = rtcattn.forward(q, k, v, layout=layout, out=given, return_lse=True)
    assert res is given and torch.equal(given, q)


def test_padded_call_keeps_an_explicit_scale(echo_launch):
    q, k, v = qkv(d=59)
    rtcattn.forward(q, k, v, softmax_scale=0.3)
    assert echo_launch[-1]["problem"].scale == 0.3 and echo_launch[-1]["problem"].head_dim == 64


def test_last_dim_not_contiguous():
    q, k, v = qkv(d=128)
    q2 = q[..., ::2]
    raises(ValueError, lambda: rtcattn.forward(q2, k[..., :64], v[..., :64]), "q.stride(-1)=2", "stride 1")


def test_different_devices():
    q, k, v = qkv()
    raises(ValueError, lambda: rtcattn.forward(q, k.to("meta"), v), "devices", "k.device=meta", "equal")


def test_out_wrong_shape_dtype_device():
    q, k, v = qkv()
    raises(ValueError, lambda: rtcattn.forward(q, k, v, out=torch.empty(1, 4, 2, 72, dtype=BF)),
           "out.shape=(1, 4, 2, 72)", "(1, 4, 2, 64)")
    raises(TypeError, lambda: rtcattn.forward(q, k, v, out=torch.empty_like(q, dtype=torch.float32)),
           "out.dtype=torch.float32", "torch.bfloat16")
    raises(ValueError, lambda: rtcattn.forward(q, k, v, out=torch.empty_like(q, device="meta")),
           "out.device=meta", "cpu")


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -1.0, 0.0])
def test_softmax_scale_bad_value(scale):
    q, k, v = qkv()
    raises(ValueError, lambda: rtcattn.forward(q, k, v, softmax_scale=scale), "softmax_scale=", "finite float > 0")


def test_softmax_scale_bad_type():
    q, k, v = qkv()
    raises(TypeError, lambda: rtcattn.forward(q, k, v, softmax_scale="0.1"), "softmax_scale='0.1'", "finite float")


def test_cpu_tensors_without_emulator(monkeypatch):
    need_lib()
    monkeypatch.delenv("RTCATTN_EMULATE", raising=False)
    q, k, v = qkv()
    raises(ValueError, lambda: rtcattn.forward(q, k, v), "q.device=cpu", "RTCATTN_EMULATE")


def test_seq_q_zero_launches_nothing(monkeypatch):
    def no_launch(*a, **kw):
        raise AssertionError("Sq = 0 must not launch")
    monkeypatch.setattr(stub, "launch", no_launch)
    q, k, v = qkv(s=0, sk=5)
    out, lse = rtcattn.forward(q, k, v, return_lse=True)
    assert out.shape == (1, 0, 2, 64) and out.dtype == BF
    assert lse.shape == (1, 2, 0) and lse.dtype == torch.float32
    q = torch.randn(1, 2, 0, 64, dtype=BF)
    kb = torch.randn(1, 2, 5, 64, dtype=BF)
    assert rtcattn.forward(q, kb, kb, layout="bhsd").shape == (1, 2, 0, 64)


def test_default_scale_and_out(fake_launch):
    q, k, v = qkv(d=96)
    out = torch.zeros_like(q)
    res, lse = rtcattn.forward(q, k, v, out=out, return_lse=True, layout="bshd", round_mode="rtz")
    assert res is out and bool((out == 0.5).all())
    assert lse.shape == (1, 2, 4) and bool((lse == -1.0).all())
    call = fake_launch[-1]
    assert math.isclose(call["problem"].scale, 1 / math.sqrt(96), rel_tol=1e-6)
    assert (call["round_mode"], call["layout"], call["lse"]) == ("rtz", "bshd", True)
    assert (call["problem"].batch, call["problem"].heads, call["problem"].seq_q) == (1, 2, 4)


@pytest.mark.parametrize("cvt,mode", [(0, "rtne"), (1, "rtna"), (2, "rtz")])
def test_flash_attn_func_rounding(fake_launch, cvt, mode):
    q, k, v = qkv()
    out = rtcattn.flash_attn_func(q, k, v, how_v3_bf16_cvt=cvt)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    assert (fake_launch[-1]["round_mode"], fake_launch[-1]["layout"]) == (mode, "bshd")


def test_flash_attn_func_defaults_and_lse(fake_launch):
    q, k, v = qkv()
    out, lse = rtcattn.flash_attn_func(q, k, v, softmax_scale=0.25, return_lse=True)
    assert fake_launch[-1]["round_mode"] == "rtna"   # AITER's default how_v3_bf16_cvt=1
    assert fake_launch[-1]["problem"].scale == 0.25
    assert out.shape == q.shape and lse.shape == (1, 2, 4)


@pytest.mark.parametrize("cvt", [3, -1, True, "1", None])
def test_flash_attn_func_bad_cvt(cvt):
    q, k, v = qkv()
    raises(ValueError, lambda: rtcattn.flash_attn_func(q, k, v, how_v3_bf16_cvt=cvt),
           f"how_v3_bf16_cvt={cvt!r}", "0 (RTNE), 1 (RTNA), 2 (RTZ)")


def test_flash_attn_func_not_implemented():
    q, k, v = qkv()
    raises(NotImplementedError, lambda: rtcattn.flash_attn_func(q, k, v, bias=q), "bias=", "None")
    raises(NotImplementedError, lambda: rtcattn.flash_attn_func(q, k, v, cu_seqlens_q=q), "cu_seqlens_q=",
           "flash_attn_varlen_func")
