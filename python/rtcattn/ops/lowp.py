"""Low-precision element formats, in Python: OCP FP8 E4M3 / E5M2, OCP MX FP6 E2M3 / E3M2, FP4 E2M1 and the E8M0 scale.

The reference of csrc_common/fp8_fp4.h, written from the formats' definitions rather than from its bit arithmetic:
values from the format's parameters, encoding as a search for the nearest value (ties to the even code). The rules
(NaN, Inf, overflow, saturation) are the header's; docs/NOTES.md, "gfx950 ISA on the emulator (issue 23)", gives
their sources.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Format:
    name: str
    code: int          # the scaled MFMA's cbsz / blgp value, and fp8_fp4.h's RTC_LP_* constant
    ebits: int
    mbits: int
    bias: int
    max_code: int      # the code of the largest finite magnitude

    @property
    def width(self) -> int:
        return 1 + self.ebits + self.mbits


FORMATS = {f.name: f for f in (Format("e4m3", 0, 4, 3, 7, 0x7E), Format("e5m2", 1, 5, 2, 15, 0x7B),
                               Format("e2m3", 2, 2, 3, 1, 0x1F), Format("e3m2", 3, 3, 2, 3, 0x1F),
                               Format("e2m1", 4, 2, 1, 1, 0x7))}
# MI300X's FP8 (torch.float8_e4m3fnuz): bias 8, no Inf, no -0, 0x80 its only NaN, largest 240 (0x7F). Not one of the
# scaled MFMA's formats (FORMATS, cbsz / blgp 0..4); fp8_fp4.h's RTC_LP_E4M3FNUZ.
E4M3FNUZ = Format("e4m3fnuz", 5, 4, 3, 8, 0x7F)
BY_CODE = {f.code: f for f in (*FORMATS.values(), E4M3FNUZ)}
_BY_NAME = {f.name: f for f in BY_CODE.values()}


def format_of(fmt) -> Format:
    """A format by name ("e4m3", ..., "e4m3fnuz"), by code, or itself."""
    return fmt if isinstance(fmt, Format) else _BY_NAME[fmt] if isinstance(fmt, str) else BY_CODE[fmt]


def _magnitude(f: Format, mag: int) -> float:
    """The value of a non-negative code by the format's formula, ignoring NaN / Inf codes."""
    e, m = mag >> f.mbits, mag & ((1 << f.mbits) - 1)
    if e == 0:
        return m * 2.0 ** (1 - f.bias - f.mbits)
    return ((1 << f.mbits) + m) * 2.0 ** (e - f.bias - f.mbits)


def values(fmt) -> np.ndarray:
    """The value of every code 0 .. 2^width - 1 (float64; NaN and +-Inf where the format has them)."""
    f = format_of(fmt)
    half = 1 << (f.width - 1)
    out = np.empty(2 * half)
    for code in range(2 * half):
        mag = code & (half - 1)
        v = _magnitude(f, mag)
        if f.name == "e4m3" and mag == 0x7F:
            v = np.nan
        elif f.name == "e4m3fnuz" and code == 0x80:  # the sign-only code: NaN, not -0
            out[code] = np.nan
            continue
        elif f.name == "e5m2" and mag >> 2 == 31:
            v = np.inf if mag & 3 == 0 else np.nan
        out[code] = -v if code & half else v
    return out


def decode(fmt, codes) -> np.ndarray:
    return values(fmt)[np.asarray(codes, dtype=np.int64) & ((1 << format_of(fmt).width) - 1)]


def encode(fmt, x, saturate: bool = False) -> np.ndarray:
    """Round to nearest, ties to the even code. Past the largest value: a virtual next code (largest + 1 step) takes
    part in the rounding; landing on it overflows: NaN (E4M3) or Inf (E5M2), or the largest value when saturating
    (FP6 / FP4 always). NaN: E4M3 0x7F, E5M2 0x7E, FP6 / FP4 the largest value; signs kept. E4M3 FNUZ: NaN and a
    non-saturated overflow give 0x80 (its NaN), a zero result 0x00 (it has no -0)."""
    f = format_of(fmt)
    x = np.asarray(x, dtype=np.float64)
    mags = np.array([_magnitude(f, m) for m in range(f.max_code + 2)])  # the last: the virtual overflow code
    a = np.abs(x)
    hi = np.clip(np.searchsorted(mags, np.where(np.isnan(a), 0.0, a)), 1, len(mags) - 1)
    lo = hi - 1
    dl, dh = a - mags[lo], mags[hi] - a
    pick = np.where((dh < dl) | ((dh == dl) & (hi % 2 == 0)), hi, lo)
    pick = np.where(a >= mags[-1], len(mags) - 1, pick)
    fp8 = f.name in ("e4m3", "e5m2", "e4m3fnuz")
    over = f.max_code if saturate or not fp8 else {"e4m3": 0x7F, "e5m2": 0x7C, "e4m3fnuz": 0x80}[f.name]
    code = np.where(pick > f.max_code, over, pick)
    if fp8:
        code = np.where(np.isnan(a), {"e4m3": 0x7F, "e5m2": 0x7E, "e4m3fnuz": 0x80}[f.name], code)
    else:
        code = np.where(np.isnan(a), f.max_code, code)
    sign = np.signbit(x).astype(np.int64) << (f.width - 1)
    if f.name == "e4m3fnuz":  # 0x80 is NaN: a zero drops its sign, and NaN / overflow carry none
        sign = np.where((code == 0) | (code == 0x80), 0, sign)
    return (code | sign).astype(np.int64)


def e8m0_value(codes) -> np.ndarray:
    """2^(e - 127); 0xFF is NaN, 0x00 is 2^-127."""
    e = np.asarray(codes, dtype=np.int64) & 0xFF
    return np.where(e == 0xFF, np.nan, np.ldexp(1.0, e - 127))


def e8m0_encode(x) -> np.ndarray:
    """|x| rounded down to a power of two, clamped to [2^-127, 2^127]; NaN / Inf: 0xFF."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    _, e = np.frexp(np.where(np.isfinite(a), a, 1.0))  # a = m 2^e, 0.5 <= m < 1: floor(log2 a) = e - 1
    code = np.clip(np.where(a > 0, e - 1 + 127, 0), 0, 254)
    return np.where(np.isfinite(a), code, 0xFF).astype(np.int64)
