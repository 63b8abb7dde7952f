// fp32 <-> bf16 bit conversions with the three rounding modes of docs/numerics.md, one value or a pair packed in a
// 32-bit word, for host and device code.
#pragma once

// Usable without the prelude (host tests compile this header alone with g++).
#ifndef RTC_HD
#define RTC_HD inline
#endif

// 0 = round to nearest even, 1 = nearest with ties away from zero, 2 = toward zero.
#ifndef RTC_ROUND
#define RTC_ROUND 0
#endif
#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast)
#define RTC_HAS_BIT_CAST 1
#endif
#endif

#if RTC_ROUND < 0 || RTC_ROUND > 2
#error "RTC_ROUND must be 0 (rtne), 1 (rtna) or 2 (rtz)"
#endif

RTC_HD unsigned int rtc_f32_bits(float f) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#elif defined(RTC_HAS_BIT_CAST)
  return __builtin_bit_cast(unsigned int, f);
#else
  union {
    float f;
    unsigned int u;
  } c;
  c.f = f;
  return c.u;
#endif
}

RTC_HD float rtc_bits_f32(unsigned int u) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#elif defined(RTC_HAS_BIT_CAST)
  return __builtin_bit_cast(float, u);
#else
  union {
    unsigned int u;
    float f;
  } c;
  c.u = u;
  return c.f;
#endif
}

// NaN is detected on the bits: -ffast-math folds isnan() to false, and truncating a NaN such as
// 0x7F800001 would otherwise give an Inf. Every NaN becomes the canonical 0x7FFF.
RTC_HD bool rtc_bits_is_nan(unsigned int x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }

// The carry out of the mantissa turns the largest finite values into Inf, as IEEE rounding does;
// Inf itself has a zero low half and stays Inf.
RTC_HD unsigned short rtc_f32_to_bf16_rtne(float f) {
  unsigned int x = rtc_f32_bits(f);
  if (rtc_bits_is_nan(x)) return 0x7FFF;
  return (unsigned short)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

RTC_HD unsigned short rtc_f32_to_bf16_rtna(float f) {
  unsigned int x = rtc_f32_bits(f);
  if (rtc_bits_is_nan(x)) return 0x7FFF;
  return (unsigned short)((x + 0x8000u) >> 16);
}

RTC_HD unsigned short rtc_f32_to_bf16_rtz(float f) {
  unsigned int x = rtc_f32_bits(f);
  if (rtc_bits_is_nan(x)) return 0x7FFF;
  return (unsigned short)(x >> 16);
}

// The mode the kernel variant was compiled for.
RTC_HD unsigned short rtc_f32_to_bf16(float f) {
#if RTC_ROUND == 0
  return rtc_f32_to_bf16_rtne(f);
#elif RTC_ROUND == 1
  return rtc_f32_to_bf16_rtna(f);
#else
  return rtc_f32_to_bf16_rtz(f);
#endif
}

RTC_HD float rtc_bf16_to_f32(unsigned short b) { return rtc_bits_f32((unsigned int)b << 16); }

// f32 value of the bf16 held in the low (lo) or high (hi) half of a packed 32-bit word.
RTC_HD float rtc_bf16_lo_f32(unsigned int w) { return rtc_bits_f32(w << 16); }
RTC_HD float rtc_bf16_hi_f32(unsigned int w) { return rtc_bits_f32(w & 0xFFFF0000u); }

// ---- pairs: two fp32 -> one 32-bit word, lo in bits 0..15 and hi in bits 16..31 (bf16x2: two adjacent bf16
// in little-endian memory, and the register A fragment of sm90's P V wgmma).
//
// rtc_f32x2_to_bf16x2_raw_<mode>(lo, hi): each half has the bits of rtc_f32_to_bf16_<mode> for every non-NaN input;
// a NaN input gives an unspecified half (rtna's bias can carry a NaN payload into the exponent or the sign: Inf,
// -0). For values whose NaN is carried elsewhere: sm90's P, where a NaN p also makes its row sum l NaN.
// On NVIDIA (sm_80 and later) rtne and rtz are one cvt.rn / cvt.rz.bf16x2.f32 each, which the host cannot run:
// their host form below is the single conversion of each half, and tests/cpu/test_rounding.py checks that form.
// Round to nearest away has no cvt to bf16, so rtna is the +0x8000 bias on each half and one byte permute (PRMT);
// its host form is the same arithmetic with a shift and a mask.
RTC_HD unsigned int rtc_f32x2_to_bf16x2_raw_rtne(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned int)rtc_f32_to_bf16_rtne(lo) | ((unsigned int)rtc_f32_to_bf16_rtne(hi) << 16);
#endif
}

RTC_HD unsigned int rtc_f32x2_to_bf16x2_raw_rtna(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(__float_as_uint(lo) + 0x8000u, __float_as_uint(hi) + 0x8000u, 0x7632);
#else
  return ((rtc_f32_bits(lo) + 0x8000u) >> 16) | ((rtc_f32_bits(hi) + 0x8000u) & 0xFFFF0000u);
#endif
}

RTC_HD unsigned int rtc_f32x2_to_bf16x2_raw_rtz(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r;
  asm("cvt.rz.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned int)rtc_f32_to_bf16_rtz(lo) | ((unsigned int)rtc_f32_to_bf16_rtz(hi) << 16);
#endif
}

// NaN test on a float. NVIDIA device code: the self-compare, one FSETP (NVRTC does not assume finite math);
// elsewhere the bit test, which -ffast-math cannot fold away.
RTC_HD bool rtc_f32_is_nan(float f) {
#if defined(__CUDA_ARCH__)
  return f != f;
#else
  return rtc_bits_is_nan(rtc_f32_bits(f));
#endif
}

// A raw pair with the half of each NaN input made the canonical 0x7FFF: the bits of two single conversions
// (whatever cvt or the bias gave for the NaN).
RTC_HD unsigned int rtc_bf16x2_canonical_nan(unsigned int r, float lo, float hi) {
  if (rtc_f32_is_nan(lo)) r = (r & 0xFFFF0000u) | 0x7FFFu;
  if (rtc_f32_is_nan(hi)) r = (r & 0x0000FFFFu) | 0x7FFF0000u;
  return r;
}

// rtc_f32x2_to_bf16x2_<mode>(lo, hi): rtc_f32_to_bf16_<mode>(lo) | rtc_f32_to_bf16_<mode>(hi) << 16, NaN included.
RTC_HD unsigned int rtc_f32x2_to_bf16x2_rtne(float lo, float hi) {
  return rtc_bf16x2_canonical_nan(rtc_f32x2_to_bf16x2_raw_rtne(lo, hi), lo, hi);
}
RTC_HD unsigned int rtc_f32x2_to_bf16x2_rtna(float lo, float hi) {
  return rtc_bf16x2_canonical_nan(rtc_f32x2_to_bf16x2_raw_rtna(lo, hi), lo, hi);
}
RTC_HD unsigned int rtc_f32x2_to_bf16x2_rtz(float lo, float hi) {
  return rtc_bf16x2_canonical_nan(rtc_f32x2_to_bf16x2_raw_rtz(lo, hi), lo, hi);
}

// The pair forms in the mode the kernel variant was compiled for.
RTC_HD unsigned int rtc_f32x2_to_bf16x2_raw(float lo, float hi) {
#if RTC_ROUND == 0
  return rtc_f32x2_to_bf16x2_raw_rtne(lo, hi);
#elif RTC_ROUND == 1
  return rtc_f32x2_to_bf16x2_raw_rtna(lo, hi);
#else
  return rtc_f32x2_to_bf16x2_raw_rtz(lo, hi);
#endif
}

RTC_HD unsigned int rtc_f32x2_to_bf16x2(float lo, float hi) {
  return rtc_bf16x2_canonical_nan(rtc_f32x2_to_bf16x2_raw(lo, hi), lo, hi);
}
