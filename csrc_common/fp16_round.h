// fp32 <-> fp16 (IEEE binary16) bit conversions for host and device code: fp32 -> fp16 rounds to nearest, ties
// to even (the only mode: fp16 has no rounding-mode axis, as in AITER / CK's fp16 paths, whose hardware cvt rounds
// to nearest even), fp16 -> fp32 is exact; one value or a pair packed in a 32-bit word.
//
// fp32 -> fp16, in integer arithmetic on the bits (no float operation, so -ffast-math and flush-to-zero change
// nothing):
//   - |x| < 2^-14 becomes an fp16 subnormal (a multiple of 2^-24) or ±0, rounded to nearest even; nothing is
//     flushed: 2^-25 (the tie) becomes ±0, anything above it at least the smallest subnormal 0x0001;
//   - |x| >= 65520 (the halfway point between the largest finite fp16, 65504 = 0x7BFF, and 2^16) becomes ±Inf
//     (0x7C00 / 0xFC00), as IEEE rounding does; ±Inf stays ±Inf; ±0 keeps its sign;
//   - every NaN (any sign, any payload) becomes the canonical quiet NaN 0x7E00.
// The same function as the host references (numpy's float16 cast, torch's .to(torch.float16)) on every non-NaN
// input: tests/cpu/test_rounding.py checks it bit for bit.
#pragma once

#include "bf16_round.h"  // rtc_f32_bits, rtc_bits_f32, rtc_bits_is_nan (and RTC_HD without the prelude)

#define RTC_FP16_NAN 0x7E00u  // the canonical NaN every fp32 NaN becomes

RTC_HD unsigned short rtc_f32_to_fp16_rtne(float f) {
  const unsigned int x = rtc_f32_bits(f);
  const unsigned int sign = (x >> 16) & 0x8000u;
  const unsigned int a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (unsigned short)RTC_FP16_NAN;
  if (a >= 0x47800000u) return (unsigned short)(sign | 0x7C00u);  // |x| >= 2^16, Inf included
  if (a >= 0x38800000u) {
    // A normal fp16 (2^-14 <= |x| < 2^16): rebias the exponent (127 -> 15) and drop 13 mantissa bits, to nearest
    // even. The carry out of the mantissa steps into the next binade, and from 0x7BFF (at 65520 and above) into
    // 0x7C00, +Inf.
    const unsigned int r = a - 0x38000000u;
    return (unsigned short)(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return (unsigned short)sign;  // |x| < 2^-25: below half the smallest subnormal
  // A subnormal fp16 (2^-25 <= |x| < 2^-14): |x| / 2^-24 = m / 2^s with the full 24-bit significand m and
  // 14 <= s <= 24, rounded to nearest even; 0x0400 (the smallest normal) when it rounds up to it.
  const unsigned int m = (a & 0x007FFFFFu) | 0x00800000u;
  const unsigned int s = 126u - (a >> 23);
  const unsigned int half = 1u << (s - 1u), rest = m & ((1u << s) - 1u);
  unsigned int q = m >> s;
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return (unsigned short)(sign | q);
}

// Exact: every fp16 is an fp32. A subnormal m·2^-24 is formed in float (m < 2^10, exact; a product by a power of
// two that stays a normal fp32, so flush-to-zero cannot touch it). Inf stays Inf; a NaN stays a NaN (its payload
// shifted as the exponent widens).
RTC_HD float rtc_fp16_to_f32(unsigned short h) {
  const unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
  const unsigned int e = ((unsigned int)h >> 10) & 0x1Fu, m = (unsigned int)h & 0x3FFu;
  if (e == 0x1Fu) return rtc_bits_f32(sign | 0x7F800000u | (m << 13));
  if (e != 0u) return rtc_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  return rtc_bits_f32(sign | rtc_f32_bits((float)m * rtc_bits_f32(0x33800000u)));  // m * 2^-24
}

// f32 value of the fp16 held in the low (lo) or high (hi) half of a packed 32-bit word.
RTC_HD float rtc_fp16_lo_f32(unsigned int w) { return rtc_fp16_to_f32((unsigned short)(w & 0xFFFFu)); }
RTC_HD float rtc_fp16_hi_f32(unsigned int w) { return rtc_fp16_to_f32((unsigned short)(w >> 16)); }

// A pair: two fp32 -> one 32-bit word, lo in bits 0..15 and hi in bits 16..31 (two adjacent fp16 in little-endian
// memory), each half the bits of rtc_f32_to_fp16_rtne, NaN included.
RTC_HD unsigned int rtc_f32x2_to_fp16x2_rtne(float lo, float hi) {
  return (unsigned int)rtc_f32_to_fp16_rtne(lo) | ((unsigned int)rtc_f32_to_fp16_rtne(hi) << 16);
}

// The raw pair (a NaN half left as the conversion gives it): for values whose NaN is carried elsewhere (sm90's
// P, where a NaN p also makes its row sum NaN). On NVIDIA (sm_80 and later) one cvt.rn.f16x2.f32, which rounds to
// nearest even and overflows to Inf as above; elsewhere the exact pair form.
RTC_HD unsigned int rtc_f32x2_to_fp16x2_raw_rtne(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return rtc_f32x2_to_fp16x2_rtne(lo, hi);
#endif
}

// The pair with every NaN half made the canonical RTC_FP16_NAN: the bits of rtc_f32x2_to_fp16x2_rtne.
RTC_HD unsigned int rtc_f32x2_to_fp16x2_fast(float lo, float hi) {
  unsigned int r = rtc_f32x2_to_fp16x2_raw_rtne(lo, hi);
  if (rtc_f32_is_nan(lo)) r = (r & 0xFFFF0000u) | RTC_FP16_NAN;
  if (rtc_f32_is_nan(hi)) r = (r & 0x0000FFFFu) | (RTC_FP16_NAN << 16);
  return r;
}
