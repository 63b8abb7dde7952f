"""Quantized KV caches' quantizers (rtcattn.quantize_kv, ops/attention_fwd/kvquant.py) bit for bit against the formats'
reference (rtcattn.ops.lowp: values from the formats' definitions, nearest value with ties to the even code), on
random rows and on the edges: ties, saturation, zero rows, NaN / Inf rows, the E8M0 clamp, -0; and no host read."""
import numpy as np
import pytest
import torch
from test_kvcache_api import SyncDetector

import rtcattn
from rtcattn.ops import lowp
from rtcattn.ops.attention_fwd import kvquant


def _fp8_reference(x: torch.Tensor, descale) -> np.ndarray:
    y = x.float().numpy() / np.float32(descale)  # fp32 division, as the quantizer
    return lowp.encode("e4m3", y.astype(np.float64), saturate=True)


def _mx_reference(x: torch.Tensor, fmt: str, emax: int):
    """(codes [..., D], scales [...]) from the formats' definitions: OCP MX's scale floor(log2 amax) - emax + 127
    (clamped; 127 for zeros, 255 for NaN / Inf rows, whose elements are coded unscaled), elements to nearest even,
    saturated."""
    xf = x.float().numpy().astype(np.float64)
    amax = np.abs(xf).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(np.where(np.isfinite(amax) & (amax > 0), amax, 1.0))
    scale = np.clip(e - 1 - emax + 127, 0, 254)
    scale = np.where(amax == 0, 127, scale)
    scale = np.where(np.isfinite(amax), scale, 255)
    y = xf / np.ldexp(1.0, (np.where(scale == 255, 127, scale) - 127))[..., None]
    return lowp.encode(fmt, y, saturate=True), scale


def _fp4_reference(x: torch.Tensor):
    """(codes [..., D], scales [...]) from the formats' definitions."""
    return _mx_reference(x, "e2m1", 2)


def _unpack(packed: torch.Tensor) -> np.ndarray:
    p = packed.numpy().astype(np.int64)
    return np.stack((p & 0xF, p >> 4), axis=-1).reshape(*p.shape[:-1], -1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_matches_the_reference_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(3)
    k = (torch.randn(2, 33, 4, 64, generator=g) * torch.logspace(-6, 3, 64)).to(dtype)
    v = torch.randn(2, 33, 4, 64, generator=g).to(dtype) * 100
    kd, vd = torch.tensor([0.37], dtype=torch.float32), torch.rand(2, 4, generator=g) + 0.01
    k8, v8 = rtcattn.quantize_kv(k, v, "fp8_e4m3", k_descale=kd, v_descale=vd)
    assert k8.dtype == torch.float8_e4m3fn and k8.shape == k.shape
    assert np.array_equal(k8.view(torch.uint8).numpy(), _fp8_reference(k, kd.item()))
    want = np.stack([np.stack([_fp8_reference(v[b, :, h], vd[b, h].item()) for h in range(4)], axis=1)
                     for b in range(2)])
    assert np.array_equal(v8.view(torch.uint8).numpy(), want)


def test_fp8_fnuz_matches_the_reference_bit_for_bit():
    """MI300X's FNUZ format (an append into a torch.float8_e4m3fnuz cache): x / descale to nearest even, saturated at
    +-240, NaN to 0x80 (its NaN), -0 and underflow to 0x00 (it has no -0)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(1, 40, 2, 64, generator=g) * torch.logspace(-7, 3, 64)).to(torch.bfloat16)
    x[0, 0, 0, :6] = torch.tensor([float("nan"), float("inf"), -0.0, -1e-30, 248.0, 247.9])
    d = torch.tensor([0.61], dtype=torch.float32)
    got8, _ = rtcattn.quantize_kv(x, x, "fp8_e4m3fnuz", k_descale=d)
    assert got8.dtype == torch.float8_e4m3fnuz
    got = got8.view(torch.uint8).numpy()
    y = x.float().numpy() / np.float32(d.item())
    assert np.array_equal(got, lowp.encode("e4m3fnuz", y.astype(np.float64), saturate=True))
    assert got[0, 0, 0, :6].tolist()[:4] == [0x80, 0x7F, 0x00, 0x00]


def test_fp8_saturates_rounds_ties_even_and_keeps_nan():
    x = torch.tensor([448.0, 460.0, 480.0, 1e4, -1e4, 0.0, -0.0, 17.0, 19.0, 2 ** -9, 2 ** -10, 3 * 2 ** -11,
                      float("inf"), -float("inf")], dtype=torch.float32).to(torch.bfloat16).view(1, -1, 1, 1)
    q8, _ = rtcattn.quantize_kv(x, x)
    assert np.array_equal(q8.view(torch.uint8).numpy(), _fp8_reference(x, 1.0))
    assert q8.float().flatten()[:5].tolist() == [448.0, 448.0, 448.0, 448.0, -448.0]  # 17 and 19: ties to even
    nan, _ = rtcattn.quantize_kv(torch.full((1, 1, 1, 2), float("nan"), dtype=torch.bfloat16),
                                 torch.zeros(1, 1, 1, 2, dtype=torch.bfloat16))
    assert torch.isnan(nan.float()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp4_matches_the_reference_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(5)
    k = (torch.randn(3, 17, 2, 128, generator=g) * torch.logspace(-3, 2, 17).view(1, 17, 1, 1)).to(dtype)
    v = torch.randn(40, 8, 64, generator=g).to(dtype)  # packed rows [S, Hk, D]
    k4, _, ks, _ = rtcattn.quantize_kv(k, k, "fp4_e2m1")
    _, v4, _, vs = rtcattn.quantize_kv(v, v, "fp4_e2m1")
    assert k4.shape == (3, 17, 2, 64) and ks.shape == (3, 17, 2) and v4.shape == (40, 8, 32) and vs.shape == (40, 8)
    for x, q, s in ((k, k4, ks), (v, v4, vs)):
        codes, scale = _fp4_reference(x)
        assert np.array_equal(s.numpy().astype(np.int64), scale)
        assert np.array_equal(_unpack(q), codes)


def test_fp4_edges_ties_saturation_zero_nan_and_the_scale_clamp():
    # amax 6: scale 2^0 (code 127); the row walks every midpoint (ties to the even code) and both signs
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    row = torch.tensor(mids + [-m for m in mids], dtype=torch.float32)
    rows = torch.stack([
        row,
        torch.tensor([7.5] + [0.0] * 15),                         # amax 7.5: scale 2^0, 7.5 saturates to 6
        torch.zeros(16),                                          # a row of zeros: scale 127
        torch.tensor([float("nan")] + [1.0] * 15),                # NaN row: scale 0xFF
        torch.tensor([float("inf")] + [1.0] * 15),                # Inf row: scale 0xFF
        torch.tensor([-0.0] * 15 + [1.0]),                        # -0 keeps its sign bit
        torch.tensor([2.0 ** -130] * 16),                         # the exponent clamps at code 0
        torch.tensor([3.0e38] * 16),                              # the largest bf16 scale: code 252
    ]).to(torch.bfloat16).view(8, 1, 16)
    q, _, s, _ = rtcattn.quantize_kv(rows, rows, "fp4_e2m1")
    codes, scale = _fp4_reference(rows)
    assert np.array_equal(s.numpy().astype(np.int64), scale) and np.array_equal(_unpack(q), codes)
    got = _unpack(q)
    assert got[0, 0, :8].tolist() == [0, 2, 2, 4, 4, 6, 6, 7] and s[0, 0] == 127  # 0.25->0, 0.75->1.0, 1.25->1.0, ...
    assert got[1, 0, 0] == 7 and s[1, 0] == 127
    assert s[2, 0] == 127 and s[3, 0] == 255 and s[4, 0] == 255 and s[6, 0] == 0 and s[7, 0] == 252
    assert got[5, 0, 0] == 8  # -0: sign bit, magnitude 0
    deq = kvquant.dequantize_fp4(q, s)
    assert torch.isnan(deq[3]).all() and torch.equal(deq[0, 0, :8], torch.tensor([0, 1, 1, 2, 2, 4, 4, 6.0]))


def test_quantizers_read_nothing_back():
    k = torch.randn(2, 5, 2, 32, dtype=torch.bfloat16)
    mode = SyncDetector()
    with mode:
        rtcattn.quantize_kv(k, k, "fp4_e2m1")
        rtcattn.quantize_kv(k, k, "fp8_e4m3", k_descale=torch.rand(2, 2), v_descale=torch.tensor([2.0]))
    assert mode.ops and mode.syncs() == [], mode.syncs()


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(kv_cache_dtype="fp8"), r"kv_cache_dtype='fp8'.*fp8_e4m3.*fp4_e2m1"),
    (lambda a: a.update(k=a["k"].float()), r"k\.dtype=torch\.float32 is not supported by quantize_kv"),
    (lambda a: a.update(v=a["v"][..., :16]), r"v \(shape \(2, 5, 2, 16\).*accepted: the same shape"),
    (lambda a: a.update(k=a["k"][0, 0]), r"k\.shape=\(2, 32\) is not supported.*\[B, S, Hk, D\]"),
    (lambda a: a.update(k_descale=torch.ones(3)), r"k_descale \(shape \(3,\).*one element or \[B, Hk\] = \[2, 2\]"),
    (lambda a: a.update(v_descale=torch.ones(2, 2, dtype=torch.float64)), r"v_descale .*float64.*accepted: float32"),
    (lambda a: a.update(kv_cache_dtype="fp4_e2m1", k_descale=torch.ones(1)),
     r"k_descale is not supported with kv_cache_dtype='fp4_e2m1'.*accepted: None"),
    (lambda a: a.update(kv_cache_dtype="fp4_e2m1", k=a["k"][..., :31], v=a["v"][..., :31]),
     r"k\.shape\[-1\]=31 is not supported.*even head dim"),
])
def test_bad_input_is_named(change, message):
    args = {"k": torch.zeros(2, 5, 2, 32, dtype=torch.bfloat16), "v": torch.zeros(2, 5, 2, 32, dtype=torch.bfloat16),
            "kv_cache_dtype": "fp8_e4m3"}
    change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        rtcattn.quantize_kv(**args)


def _q_fp8_reference(x: torch.Tensor):
    """(E4M3 codes [..., D], E8M0 scales [...]) of q for the FP4 cache's native path, from the formats' definitions:
    the MX rule with E4M3's largest exponent (8), saturated at 448."""
    return _mx_reference(x, "e4m3", 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_q_fp8_for_the_native_fp4_path_matches_the_reference(dtype):
    """kvquant.quantize_q_fp8 (the gfx950 decode kernel's q quantization, and the reference's) bit for bit against the
    formats' definitions: random rows over five decades, ties, saturation (amax's own element may clip), zero, NaN and
    Inf rows, -0, the exponent clamp; dequantize_q_fp8 gives codes x 2^(e - 127)."""
    g = torch.Generator().manual_seed(9)
    q = (torch.randn(5, 7, 64, generator=g) * torch.logspace(-3, 2, 7).view(1, 7, 1)).to(dtype)
    edge = torch.zeros(6, 1, 64)
    edge[0, 0, :8] = torch.tensor([480.0, 1.0 + 2 ** -4, 1.0 + 3 * 2 ** -4, 464.0, -0.0, 0.5, 2.0 ** -9, 3.0])
    edge[2, 0, 3] = float("nan")
    edge[3, 0, 5] = float("inf")
    edge[4, 0, :] = 2.0 ** -14 if dtype == torch.float16 else 2.0 ** -130
    edge[5, 0, 0] = -0.0
    for x in (q, edge.to(dtype)):
        codes, scale = kvquant.quantize_q_fp8(x)
        want_codes, want_scale = _q_fp8_reference(x)
        assert codes.dtype == torch.float8_e4m3fn and scale.dtype == torch.uint8
        assert np.array_equal(scale.numpy().astype(np.int64), want_scale)
        got = codes.view(torch.uint8).numpy().astype(np.int64)
        finite = want_scale != 255
        assert np.array_equal(got[finite], want_codes[finite])
    codes, scale = kvquant.quantize_q_fp8(edge.to(dtype))
    assert scale[0, 0] == 127 and scale[1, 0] == 127 and scale[2, 0] == 255 and scale[3, 0] == 255
    assert scale[4, 0] == (127 - 14 - 8 if dtype == torch.float16 else 0)
    deq = kvquant.dequantize_q_fp8(codes, scale)
    assert torch.isnan(deq[2]).all() and torch.isnan(deq[3]).all()
    assert deq[0, 0, 0] == 448.0 and deq[0, 0, 3] == 448.0  # 480 and 464 saturate (amax 480: scale 2^0)
    assert deq[0, 0, 1] == 1.0 and deq[0, 0, 2] == 1.25  # ties to even: 1 + 2^-4 -> 1, 1 + 3 2^-4 -> 1.25
