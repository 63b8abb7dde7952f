// gfx942 kernel online softmax on S^T fragments: row max/sum across the 4 lanes of a row, P rounding and packing,
// and the conversions of O.
//
// A lane holds S^T[kv = 16s + 4*quad + i][q = lane%16] for sub-tiles s = 0..3, i = 0..3: 16 scores
// of one q row; the row's other 48 scores sit in lanes lane^16, lane^32, lane^48.
#pragma once
#include "platform.h"
#include "bf16_round.h"
#include "fp16_round.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"  // sreg_fence_gfx90a
#include "gfx942/tiles.h"

namespace g942 {

// Max / sum over lanes {l, l^16, l^32, l^48}: ds_swizzle xor 16 inside each half, then
// ds_bpermute across halves. Both operations are commutative in IEEE, so the four lanes of a
// row end with identical bits.
RTC_DEVICE float row_max4(float x, int xor32_addr) {
  x = __builtin_fmaxf(x, rtc_bits_f32(ds_swizzle<0x401F>(rtc_f32_bits(x))));
  return __builtin_fmaxf(x, rtc_bits_f32(ds_bpermute(xor32_addr, rtc_f32_bits(x))));
}
RTC_DEVICE float row_sum4(float x, int xor32_addr) {
  x = x + rtc_bits_f32(ds_swizzle<0x401F>(rtc_f32_bits(x)));
  return x + rtc_bits_f32(ds_bpermute(xor32_addr, rtc_f32_bits(x)));
}

// P's bits before packing. bf16: fp32 -> bf16 in the high half, low half garbage: the mode's bias only (no NaN
// guard). P is exp2 of a quiet NaN at worst, whose low 16 bits are 0 (bf16 inputs) so no bias carries out
// of it: it stays NaN. fp16: v_cvt_f16_f32 (nearest even) in the low half, high half zero; a NaN stays a NaN.
// The output O uses the guarded o_pair.
RTC_DEVICE rtc_u32 p_biased(float p) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return cvt_f16_f32(p);
#else
  const rtc_u32 x = rtc_f32_bits(p);
#if RTC_ROUND == 0
  return x + 0x7FFFu + ((x >> 16) & 1u);
#elif RTC_ROUND == 1
  return x + 0x8000u;
#else
  return x;
#endif
#endif
}
// Two p_biased values -> one dword of two elements (lo in the low half). bf16: v_perm_b32 picks the high halves.
RTC_DEVICE rtc_u32 pack_hi(rtc_u32 lo, rtc_u32 hi) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return lo | (hi << 16);
#else
  return perm_b32(hi, lo, 0x07060302u);
#endif
}

// Two O values -> one dword of two output elements (lo in the low half), NaN made canonical: bf16 in the
// variant's rounding mode (0x7FFF), fp16 to nearest even (0x7E00; a value past 65520 becomes Inf).
RTC_DEVICE rtc_u32 o_pair(float lo, float hi) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  const rtc_u32 a = rtc_bits_is_nan(rtc_f32_bits(lo)) ? RTC_FP16_NAN : cvt_f16_f32(lo);
  const rtc_u32 b = rtc_bits_is_nan(rtc_f32_bits(hi)) ? RTC_FP16_NAN : cvt_f16_f32(hi);
  return a | (b << 16);
#else
  return (rtc_u32)rtc_f32_to_bf16(lo) | ((rtc_u32)rtc_f32_to_bf16(hi) << 16);
#endif
}

// What the epilogue and the merge write for a row whose sum l is 0, i.e. every score it saw was -Inf.
// A row that sees no key (a window, a sequence without keys) is the empty row: O = +0, LSE -Inf
// (numerics §8). A row that sees keys got there through scores past -FLT_MAX (or Inf inputs), and a 0
// row would pass for a right answer: it is NaN, O the canonical NaN and LSE NaN (numerics §4). A select per row
// after the KV loop, none in it: the loop cannot tell the two -Inf apart (masking writes -Inf).
struct ZeroSumRow {
  rtc_u32 o;  // two output elements
  float lse;
  RTC_DEVICE static ZeroSumRow of(bool sees_key) {
#if RTC_DTYPE == RTC_DTYPE_FP16
    const rtc_u32 nan2 = RTC_FP16_NAN | (RTC_FP16_NAN << 16);
#else
    const rtc_u32 nan2 = 0x7FFF7FFFu;
#endif
    return sees_key ? ZeroSumRow{nan2, rtc_bits_f32(0x7FC00000u)} : ZeroSumRow{0u, rtc_bits_f32(0xFF800000u)};
  }
};

// The softmax scale of sub-tile sub's scores.
RTC_DEVICE float score_scale(float c, int) { return c; }

struct RowState {
  float m[kTilesPerWave];  // running max, log2 units (scale folded in)
  float l[kTilesPerWave];  // this lane's partial sum of unrounded p (reduced across lanes at the end)
};

// One tile's softmax step on its 16 scores: new max, optional O rescale, P (4 elements per sub-tile).
// kLast: the last kv block of the workgroup, the only one where valid_kv < 64 can hold. Its kv rows
// past Sk get -Inf (a select, so whatever the zero-filled K row gave cannot leak in). Not -FLT_MAX:
// the running max starts at -FLT_MAX, so a row whose real scores are all -Inf would see
// exp2(-FLT_MAX - -FLT_MAX) = 1 for masked rows. With -Inf, p = exp2(-Inf - m) = 0 for every
// m >= -FLT_MAX, and m never becomes -Inf. A template flag, not a runtime test: clang 19 turns
// the uniform branch into selects, which cost every iteration 16 compares and 96 v_cndmask.
// kWindow: the block is cut by this row's key window (RTC_MASK): keys of the block outside
// [lo, hi] (indices relative to the block's first key; hi <= Sk - 1 covers the partial last
// block too) get -Inf, as past-Sk keys do.
// c: the softmax scale, one value (score_scale above), or a quantized FP4 cache's per key (gfx942/kv_cache.h).
template <bool kLast, bool kWindow = false, class ScoreScale>
RTC_DEVICE void softmax_tile(rtc_f32x4 (&s)[kSub], rtc_f32x4 (&o)[kHdTiles], Frag (&p)[kSub], float& m, float& l,
                             ScoreScale c, int quad, int valid_kv, int xor32_addr, int lo = 0, int hi = 0) {
  // Kept as vectors up to the subtraction of the max: clang then issues v_pk_mul_f32 / v_pk_add_f32,
  // half the instructions (it scalarises vector math whose only uses are element reads).
  rtc_f32x4 t[kSub];
#pragma unroll
  for (int sub = 0; sub < kSub; ++sub) t[sub] = s[sub] * score_scale(c, sub);
  if (kWindow) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int key = 16 * (j >> 2) + 4 * quad + (j & 3);
      t[j >> 2][j & 3] = key >= lo && key <= hi ? t[j >> 2][j & 3] : kNegInf;
    }
  } else if (kLast && valid_kv < GFX942_KV_ROWS) {
    sreg_fence_gfx90a(valid_kv);  // gfx90a: masks per tile, not 16 SGPR pairs shared by all three
#pragma unroll
    for (int j = 0; j < 16; ++j)
      t[j >> 2][j & 3] = (16 * (j >> 2) + 4 * quad + (j & 3)) < valid_kv ? t[j >> 2][j & 3] : kNegInf;
  }
  float mx = t[0][0];
#pragma unroll
  for (int j = 1; j < 16; ++j) mx = __builtin_fmaxf(mx, t[j >> 2][j & 3]);
  const float m_new = __builtin_fmaxf(m, row_max4(mx, xor32_addr));
  // Skipping is exact: with an unchanged max the factor would be exp2(0) = 1.
  if (!wave_all(m_new == m)) {
    const float alpha = exp2_f32(m - m_new);
    l *= alpha;
#pragma unroll
    for (int t2 = 0; t2 < kHdTiles; ++t2)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[t2][i] *= alpha;
  }
  m = m_new;
  float sum = 0.0f;
#pragma unroll
  for (int sub = 0; sub < kSub; ++sub) {
    rtc_u32 b[4];
    const rtc_f32x4 d = t[sub] - m_new;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float e = exp2_f32(d[i]);
      sum += e;
      b[i] = p_biased(e);
    }
    p[sub] = as_frag(pack_hi(b[0], b[1]), pack_hi(b[2], b[3]));
  }
  l += sum;
}

}  // namespace g942
