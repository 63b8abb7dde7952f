// fp32 <-> bf16 bit conversions with the three rounding modes of docs/numerics.md, for host and device code.
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
  union { float f; unsigned int u; } c;
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
  union { unsigned int u; float f; } c;
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
