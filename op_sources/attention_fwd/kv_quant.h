// Quantized K / V caches (the kv_dtype axis, RTC_KV_DTYPE): a stored value's exact element (RTC_DTYPE) and the fp32
// factors that scale a key's score and a value row (docs/numerics.md §10). Every kernel that reads such a cache.
//
// The cache's values are taken exactly into the element type (every E4M3, E4M3 FNUZ and E2M1 value is a bf16 and
// an fp16 value), so the MMA / dot products see them unchanged; the scales are applied in fp32 outside them:
//   FP8 (descales per sequence and K/V head): score = (q . k) * k_descale; O = (sum p v) * v_descale.
//   FP4 (an E8M0 scale per key row and head, a power of two): score = (q . k) * 2^(e_k - 127); p's share of the row
//   of V is p * 2^(e_v - 127). Both multiplies are exact (barring fp32 under / overflow), so FP4 computes exactly
//   what the same kernel computes on the dequantized cache, where its dot products take the columns in the same
//   order (the gfx942 decode kernel's tables interleave them: docs/numerics.md §10). 0xFF (NaN) makes the score or
//   the row NaN.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bf16_round.h"
#include "fp16_round.h"
#include "fp8_fp4.h"

#define RTC_KV_FP8 (RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3 || RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ)
#define RTC_KV_FP4 (RTC_KV_DTYPE == RTC_KV_DTYPE_FP4_E2M1 || RTC_KV_DTYPE == RTC_KV_DTYPE_FP4_E2M1_NATIVE)
#define RTC_KV_FP4_NATIVE (RTC_KV_DTYPE == RTC_KV_DTYPE_FP4_E2M1_NATIVE)

#if RTC_KV_DTYPE < RTC_KV_DTYPE_SAME || RTC_KV_DTYPE > RTC_KV_DTYPE_FP4_E2M1_NATIVE
#error "RTC_KV_DTYPE must be 0 (same), 1 (fp8_e4m3), 2 (fp8_e4m3fnuz), 3 (fp4_e2m1) or 4 (fp4_e2m1_native)"
#endif

// The element (RTC_DTYPE) bits of a stored value's fp32 x: bf16 its top half; fp16 its exponent rebiased (x is zero,
// NaN, or an fp16 normal: every E4M3 / FNUZ / E2M1 value is, the smallest being 2^-10), no rounding needed.
RTC_HD rtc_u32 kv_elem_bits(float x) {
  const rtc_u32 u = rtc_f32_bits(x);
#if RTC_DTYPE == RTC_DTYPE_FP16
  const rtc_u32 sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return RTC_FP16_NAN;
  return a == 0u ? sign : sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3FFu);
#else
  return u >> 16;
#endif
}

// One FP8 byte as the element: E4M3 (OCP) or E4M3 FNUZ, NaN codes to a NaN.
RTC_HD rtc_u32 kv_fp8_elem(rtc_u32 code) {
  return kv_elem_bits(rtc_lp_decode(RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ ? RTC_LP_E4M3FNUZ : RTC_LP_E4M3, code));
}

// One byte of an FP4 row as two elements, the low nibble (the even element) in the low half, through the bf16 table.
RTC_HD rtc_u32 kv_fp4x2_elems(rtc_u32 byte) {
  const rtc_u32 bf = rtc_fp4x2_to_bf16x2(byte);
#if RTC_DTYPE == RTC_DTYPE_FP16
  return kv_elem_bits(rtc_bf16_lo_f32(bf)) | (kv_elem_bits(rtc_bf16_hi_f32(bf)) << 16);
#else
  return bf;
#endif
}

// FP8: the descale of sequence b and K/V head h (1 without a descale tensor).
RTC_HD float kv_descale(const float* d, rtc_i64 sb, rtc_i64 sh, int b, int h) {
  return d ? rtc_gld(d + (rtc_i64)b * sb + (rtc_i64)h * sh) : 1.0f;
}

// FP4: the scales 2^(e - 127) of K and V at key row j of sequence b (its row `k_row + j` when varlen, its
// block-table page when paged), ks / vs being the K/V head's first scale bytes; 1 for a paged row outside the pool
// (it reads as zeros).
RTC_HD void kv_row_scales(const AttnParams& p, const unsigned char* ks, const unsigned char* vs, int b, int k_row,
                          int j, float& k_scale, float& v_scale) {
  rtc_i64 page = 0, row = k_row + j;
  if (RTC_KV == RTC_KV_PAGED) {
    page = page_of(p, b, j);
    row = j % p.page_size;
  }
  const bool in_pool = page >= 0;
  k_scale = in_pool ? rtc_e8m0_decode(rtc_gld(ks + page * p.ks_sb + row * p.ks_ss)) : 1.0f;
  v_scale = in_pool ? rtc_e8m0_decode(rtc_gld(vs + page * p.vs_sb + row * p.vs_ss)) : 1.0f;
}
