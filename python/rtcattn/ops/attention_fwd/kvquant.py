"""Quantized KV caches: the formats, their layouts and the quantizers (torch ops on the tensors' device, no host
read), one definition used by `rtcattn.quantize_kv` and, as the kernels learn these caches, by
flash_attn_with_kvcache's append. docs/numerics.md, "Quantized KV caches", is the contract.

- FP8 E4M3 (OCP, torch.float8_e4m3fn), FA3's descale convention: a stored value q stands for q * descale, descale
  fp32 per (sequence, K/V head) [B, Hk] or one value for the tensor. Quantizing divides by descale in fp32 and
  rounds to nearest even, saturating at +-448 (the format's largest; E4M3 has no Inf). NaN stays NaN.
- FP4 E2M1 with an E8M0 scale per (position, K/V head), the layout of AITER's FP4 paged attention: a row of D values
  packs two a byte, element 2i in the low nibble of byte i and 2i + 1 in the high one (uint8 [..., D / 2]), and its
  scale byte e stands for 2^(e - 127). The scale follows the OCP MX rule: X = 2^(floor(log2 amax) - 2) (2 is E2M1's
  largest exponent), so amax / X lies in [4, 8) and the elements are x / X rounded to nearest even on
  {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating at 6 (amax's own element may clip by up to 25%, as MX allows). A row of
  zeros takes e = 127 (1.0), a row holding NaN or Inf e = 0xFF (NaN: the row dequantizes to NaN; its elements are
  coded unscaled); the exponent is clamped to [-127, 127] (codes 0 .. 254).
- q for an FP4 cache's native path (kv_cache_dtype "fp4_e2m1_native", gfx950's scaled MFMA): FP8 E4M3 with an E8M0
  scale per (row, head) by the same MX rule with E4M3's largest exponent (8): X = 2^(floor(log2 amax) - 8), elements
  x / X in fp32 to nearest even, saturated at +-448; a row of zeros 1.0, a row holding NaN or Inf 0xFF
  (quantize_q_fp8: what the kernel computes, and the reference's q).
"""
from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
FP8_MAX = {torch.float8_e4m3fn: FP8_E4M3_MAX, torch.float8_e4m3fnuz: 240.0}  # MI300X's FNUZ: bias 8, largest 240
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)   # codes 0 .. 7; bit 3 is the sign
E2M1_EMAX = 2            # E2M1's largest exponent: 6 = 1.5 * 2^2
E4M3_EMAX = 8            # E4M3's largest exponent: 448 = 1.75 * 2^8
E8M0_BIAS, E8M0_NAN = 127, 0xFF
FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz}  # name -> the cache's dtype
KV_CACHE_DTYPES = (*FP8_DTYPES, "fp4_e2m1")


def quantize_fp8(x: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """x [..., Hk, D] (bf16 / fp16) -> dtype (float8_e4m3fn, or float8_e4m3fnuz): x / descale in fp32, to nearest
    even, saturated at the format's largest value (448; FNUZ 240). descale: fp32, broadcast against x[..., 0] (one
    value, or per (sequence, head) reshaped by the caller: descale_rows)."""
    y = x.float() / descale.float().unsqueeze(-1)
    top = FP8_MAX[dtype]
    return torch.clamp(y, -top, top).to(dtype)


def descale_rows(descale: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """A descale as quantize_fp8 broadcasts it over x [B, S, Hk, D]: one value (also for None: 1), or [B, Hk] as
    [B, 1, Hk]."""
    if descale is None:
        return torch.ones((), dtype=torch.float32, device=device)
    return descale.reshape(()) if descale.numel() == 1 else descale.view(batch, 1, descale.shape[-1])


def e8m0_scales(x: torch.Tensor, emax: int = E2M1_EMAX) -> torch.Tensor:
    """The E8M0 code of each row of x [..., D] (uint8 [...]): floor(log2 amax) - emax + 127 (emax: the element
    format's largest exponent, E2M1's by default), clamped to 0 .. 254; 127 for a row of zeros, 0xFF for a row with
    NaN or Inf."""
    amax = x.float().abs().amax(dim=-1)
    _, exp = torch.frexp(amax)  # amax = m 2^exp, 0.5 <= m < 1: floor(log2 amax) = exp - 1
    code = torch.clamp(exp.to(torch.int32) - 1 - emax + E8M0_BIAS, 0, 254)
    code = torch.where(amax == 0, torch.full_like(code, E8M0_BIAS), code)
    return torch.where(torch.isfinite(amax), code, torch.full_like(code, E8M0_NAN)).to(torch.uint8)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """y (fp32) -> E2M1 codes (uint8, 0 .. 15): nearest magnitude, ties to the even code, saturated at 6; NaN takes
    the largest magnitude, the sign bit is y's (-0 included)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=y.device)
    mids = (mags[1:] + mags[:-1]) / 2  # 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5: exact in fp32
    a = y.abs()
    below = torch.bucketize(torch.nan_to_num(a, nan=float("inf")), mids)  # midpoints strictly below a: the lower code
    at_mid = torch.cat((mids, mids.new_full((1,), float("inf"))))[below] == a
    code = torch.clamp(below + (at_mid & (below % 2 == 1)).to(below.dtype), max=7)  # a tie goes to the even code
    return (code | (torch.signbit(y).to(code.dtype) << 3)).to(torch.uint8)


def quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (bf16 / fp16, D even) -> (packed uint8 [..., D / 2], E8M0 scales uint8 [...]), one scale per row."""
    scale = e8m0_scales(x)
    # x / 2^exp, exact; a NaN row's elements are coded as they are (exp 0): its scale makes the row NaN anyway
    exp = torch.where(scale == E8M0_NAN, 0, scale.to(torch.int32) - E8M0_BIAS)
    y = torch.ldexp(x.float(), -exp.unsqueeze(-1).to(torch.float32))
    codes = e2m1_codes(y)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scale


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The exact values of an FP4 row (fp32 [..., D]): the inverse of quantize_fp4's layout, for references."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).to(torch.int64)
    v = torch.where((codes & 8) != 0, -mags[codes & 7], mags[codes & 7])
    s = scale.to(torch.int32)
    factor = torch.where(s == E8M0_NAN, torch.full_like(s, float("nan"), dtype=torch.float32),
                         torch.ldexp(torch.ones_like(s, dtype=torch.float32), (s - E8M0_BIAS).to(torch.float32)))
    return v * factor.unsqueeze(-1)


def _e8m0_values(scale: torch.Tensor) -> torch.Tensor:
    """2^(e - 127) of E8M0 codes (fp32; 0xFF NaN)."""
    s = scale.to(torch.int32)
    return torch.where(s == E8M0_NAN, torch.full_like(s, float("nan"), dtype=torch.float32),
                       torch.ldexp(torch.ones_like(s, dtype=torch.float32), (s - E8M0_BIAS).to(torch.float32)))


def quantize_q_fp8(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., H, D] (bf16 / fp16) as the FP4 cache's native path takes it: (E4M3 codes, torch.float8_e4m3fn [..., H,
    D]; their E8M0 scales, uint8 [..., H]), one scale per (row, head) by the MX rule with E4M3's largest exponent.
    A 0xFF row's elements are coded unscaled."""
    scale = e8m0_scales(q, E4M3_EMAX)
    factor = torch.where(scale == E8M0_NAN, torch.ones((), device=q.device), _e8m0_values(scale))
    y = q.float() / factor.unsqueeze(-1)  # a power of two: exact, as the kernel's multiply by its inverse
    return torch.clamp(y, -FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn), scale


def dequantize_q_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The exact values (fp64) of quantize_q_fp8's q: codes x 2^(e - 127), a 0xFF row NaN."""
    return codes.to(torch.float64) * _e8m0_values(scale).to(torch.float64).unsqueeze(-1)
