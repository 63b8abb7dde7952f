// Low-precision element formats: OCP FP8 (E4M3, E5M2), OCP MX FP6 (E2M3, E3M2), FP4 (E2M1) and the E8M0 scale.
// Exact decode, round-to-nearest-even encode, and the table-driven FP4 -> FP8 / bf16 decode. One definition for
// kernels, the emulator's instructions and (mirrored in python/rtcattn/ops/lowp.py) the Python references.
//
// Rules (docs/NOTES.md, "gfx950 ISA on the emulator (issue 23)"):
//   * value = (-1)^s * 2^(e - bias) * 1.m, subnormal (e = 0) 2^(1 - bias) * 0.m; ties of the encode go to the even
//     code (mantissa LSB 0); f32 subnormals are far below every format's smallest step and encode as +-0.
//   * E4M3 has no Inf: S.1111.111 (0x7F, 0xFF) is its only NaN, 448 (0x7E) its largest value. Non-saturating
//     encode: NaN, Inf and anything that rounds past 448 (above 464) give NaN (0x7F | sign).
//   * E5M2 is IEEE-like: exponent 31 is Inf (mantissa 0) or NaN; largest 57344 (0x7B). Non-saturating encode:
//     past 57344 (from 61440 up) and Inf give Inf; NaN gives 0x7E | sign.
//   * Saturating encode (E4M3, E5M2): overflow and Inf give the largest value with the sign; NaN stays NaN.
//   * FP6 / FP4 have no Inf or NaN: their encode always saturates, a NaN included (to the largest value, sign kept).
//   * E4M3 FNUZ (torch.float8_e4m3fnuz, MI300X's FP8): bias 8, no Inf, no -0: 0x80 is its only NaN, 240 (0x7F) its
//     largest value, so a finite code's value is half its OCP E4M3 code's (0x7F included: 240 here, NaN there).
//     Encode: -0 and anything that rounds to zero give 0x00; NaN gives 0x80; non-saturating, Inf and anything that
//     rounds past 240 (from 248 up) give 0x80; saturating, +-240.
//   * E8M0: 2^(e - 127), 0xFF = NaN, 0x00 = 2^-127 (not zero). Its encode rounds |x| down to a power of two
//     (the f32 exponent field; below 2^-126 -> 0x00), NaN and Inf -> 0xFF.
#pragma once
#include "platform.h"

// The format codes 0..4 are the scaled MFMA's cbsz / blgp values; E4M3 FNUZ (5) is none of its formats.
enum { RTC_LP_E4M3 = 0, RTC_LP_E5M2 = 1, RTC_LP_E2M3 = 2, RTC_LP_E3M2 = 3, RTC_LP_E2M1 = 4, RTC_LP_E4M3FNUZ = 5 };

struct rtc_lp_spec {
  int ebits, mbits, bias;
  rtc_u32 max_code;  // the largest finite magnitude's code
};

RTC_HD rtc_lp_spec rtc_lp_spec_of(int fmt) {
  switch (fmt) {
    case RTC_LP_E4M3: return {4, 3, 7, 0x7Eu};
    case RTC_LP_E5M2: return {5, 2, 15, 0x7Bu};
    case RTC_LP_E2M3: return {2, 3, 1, 0x1Fu};
    case RTC_LP_E3M2: return {3, 2, 3, 0x1Fu};
    case RTC_LP_E4M3FNUZ: return {4, 3, 8, 0x7Fu};
    default: return {2, 1, 1, 0x7u};  // RTC_LP_E2M1
  }
}
// Bits per element: 8, 6 or 4.
RTC_HD int rtc_lp_width(int fmt) {
  const rtc_lp_spec s = rtc_lp_spec_of(fmt);
  return 1 + s.ebits + s.mbits;
}

// NVRTC has no __builtin_memcpy: its own bit casts there.
RTC_HD float rtc_lp_f32(rtc_u32 bits) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}
RTC_HD rtc_u32 rtc_lp_bits(float f) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  rtc_u32 u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

// A code's exact value (the code's bits above the format's width are ignored). NaN: a quiet f32 NaN with the sign.
RTC_HD float rtc_lp_decode(int fmt, rtc_u32 code) {
  const rtc_lp_spec s = rtc_lp_spec_of(fmt);
  const int width = 1 + s.ebits + s.mbits;
  code &= (1u << width) - 1u;
  const rtc_u32 sign = (code >> (width - 1)) << 31, mag = code & ((1u << (width - 1)) - 1u);
  const rtc_u32 e = mag >> s.mbits, m = mag & ((1u << s.mbits) - 1u);
  if ((fmt == RTC_LP_E4M3 && mag == 0x7Fu) || (fmt == RTC_LP_E5M2 && e == 31u && m != 0u))
    return rtc_lp_f32(sign | 0x7FC00000u);
  if (fmt == RTC_LP_E4M3FNUZ && code == 0x80u) return rtc_lp_f32(0x7FC00000u);
  if (fmt == RTC_LP_E5M2 && e == 31u) return rtc_lp_f32(sign | 0x7F800000u);
  if (e == 0u) {  // m * 2^(1 - bias - mbits): the power of two is a normal f32, the product exact
    const float step = rtc_lp_f32((rtc_u32)(127 + 1 - s.bias - s.mbits) << 23);
    return rtc_lp_f32(sign | rtc_lp_bits((float)m * step));
  }
  return rtc_lp_f32(sign | ((e - (rtc_u32)s.bias + 127u) << 23) | (m << (23 - s.mbits)));
}

// f32 -> code, round to nearest even; saturate: see the rules above (FP6 / FP4 always saturate).
RTC_HD rtc_u32 rtc_lp_encode(int fmt, float x, bool saturate) {
  const rtc_lp_spec s = rtc_lp_spec_of(fmt);
  const int width = 1 + s.ebits + s.mbits;
  const rtc_u32 u = rtc_lp_bits(x), a = u & 0x7FFFFFFFu, sign = (u >> 31) << (width - 1);
  const bool fnuz = fmt == RTC_LP_E4M3FNUZ, fp8 = fmt == RTC_LP_E4M3 || fmt == RTC_LP_E5M2 || fnuz;
  if (a > 0x7F800000u)
    return fnuz ? 0x80u : sign | (fmt == RTC_LP_E4M3 ? 0x7Fu : fmt == RTC_LP_E5M2 ? 0x7Eu : s.max_code);
  rtc_u32 mag = s.max_code + 1u;  // Inf: overflows below
  if (a < 0x7F800000u) {
    if ((a >> 23) == 0u) return fnuz ? 0u : sign;  // f32 zero or subnormal (FNUZ has no -0)
    const int e = (int)(a >> 23) - 127, emin = 1 - s.bias, et = e < emin ? emin : e;
    const int shift = 23 - s.mbits + (et - e);  // low bits of the 24-bit significand below the target's step
    const rtc_u32 sig = (a & 0x7FFFFFu) | 0x800000u;
    rtc_u32 n = 0u;
    if (shift < 26) {
      n = sig >> shift;
      const rtc_u32 rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
      if (rem > half || (rem == half && (n & 1u))) ++n;
    }
    // n counts steps of 2^(et - mbits): a carry into the next binade lands on the right code by itself.
    mag = (rtc_u32)(((et + s.bias) << s.mbits) + (int)n - (1 << s.mbits));
  }
  if (mag <= s.max_code) return fnuz && mag == 0u ? 0u : sign | mag;
  if (saturate || !fp8) return sign | s.max_code;
  if (fnuz) return 0x80u;                              // NaN: FNUZ's overflow
  return sign | (fmt == RTC_LP_E4M3 ? 0x7Fu : 0x7Cu);  // NaN / Inf
}

RTC_HD float rtc_e8m0_decode(rtc_u32 code) {
  code &= 0xFFu;
  if (code == 0xFFu) return rtc_lp_f32(0x7FC00000u);
  return rtc_lp_f32(code == 0u ? 0x00400000u : code << 23);  // 0x00: 2^-127, an f32 subnormal
}
RTC_HD rtc_u32 rtc_e8m0_encode(float x) { return (rtc_lp_bits(x) >> 23) & 0xFFu; }

// gfx950's scaled FP4 converts (v_cvt_scalef32_pk_bf16_fp4 / _f16_fp4), one code: its E2M1 value times 2^(e - 127),
// e the exponent field of the f32 scale operand (AMD's convention: the E8M0 code there, sign and mantissa zero, so
// code 0 is the f32 +0 and 0xFF the f32 Inf), rounded to the element type to nearest even; e = 0xFF gives a NaN of
// the code's sign. The product has two significant bits between 2^-128 and 1.5 x 2^129, so its f32 is exact or, past
// f32's largest, Inf (the hardware's overflow): formed here from the bits, no float operation. bf16 holds it exactly
// (its top half); fp16 rounds it (rtc_f32_to_fp16_rtne: subnormals to nearest even, 65520 and up Inf). These are
// AMD's published host model of the instructions (its OCP conversion headers), not checked on a gfx950.
RTC_HD float rtc_fp4_scaled_f32(rtc_u32 code, rtc_u32 scale_bits) {
  const rtc_u32 e = (scale_bits >> 23) & 0xFFu, sign = (code & 8u) << 28, m = code & 7u;
  if (e == 0xFFu) return rtc_lp_f32(sign | 0x7FC00000u);
  if (m == 0u) return rtc_lp_f32(sign);
  // m's value: 2^x (m = 1, 2, 4, 6) or 1.5 x 2^x (m = 3, 5, 7), x = m / 2 - 1; the product's f32 exponent field x + e
  const int be = (int)(m >> 1) - 1 + (int)e;
  const rtc_u32 half = (m & 1u) && m != 1u;
  if (be >= 255) return rtc_lp_f32(sign | 0x7F800000u);
  if (be >= 1) return rtc_lp_f32(sign | ((rtc_u32)be << 23) | (half << 22));
  return rtc_lp_f32(sign | ((2u + half) << (be + 21)));  // be 0 or -1: (2 or 3) x 2^(be - 128), an f32 subnormal
}

// ---- FP4 E2M1 -> FP8 E4M3 / bf16 by table: the 8 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} in one constant, the sign
// (bit 3) moved to the top bit. Exact: every E2M1 value is an E4M3 and a bf16 value.
#define RTC_FP4_E4M3_TABLE 0x4C4844403C383000ull  // byte i: the E4M3 code of magnitude i
#define RTC_FP4_BF16_TABLE_LO 0x3FC03F803F000000ull  // 16-bit entry i: the bf16 of magnitude i (0..3)
#define RTC_FP4_BF16_TABLE_HI 0x40C0408040404000ull  // magnitudes 4..7

RTC_HD rtc_u32 rtc_fp4_to_e4m3(rtc_u32 c) {
  return ((c & 8u) << 4) | (rtc_u32)((RTC_FP4_E4M3_TABLE >> (8u * (c & 7u))) & 0xFFu);
}
RTC_HD rtc_u32 rtc_fp4_to_bf16(rtc_u32 c) {
  const rtc_u64 t = (c & 4u) ? RTC_FP4_BF16_TABLE_HI : RTC_FP4_BF16_TABLE_LO;
  return ((c & 8u) << 12) | (rtc_u32)((t >> (16u * (c & 3u))) & 0xFFFFu);
}
// Packed: element i in nibble i (the low nibble of a byte first), out element i in byte i / half i.
RTC_HD rtc_u32 rtc_fp4x4_to_e4m3x4(rtc_u32 nibbles) {
  rtc_u32 r = 0u;
  for (int i = 0; i < 4; ++i) r |= rtc_fp4_to_e4m3((nibbles >> (4 * i)) & 0xFu) << (8 * i);
  return r;
}
RTC_HD rtc_u32 rtc_fp4x2_to_bf16x2(rtc_u32 byte) {
  return rtc_fp4_to_bf16(byte & 0xFu) | (rtc_fp4_to_bf16((byte >> 4) & 0xFu) << 16);
}
