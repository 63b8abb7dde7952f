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
#include "dropout.h"
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

// A plain variant's softmax_tile argument in place of TileKeep: P is the probability.
struct NoDropout {};

#if RTC_DROPOUT
// This lane's dropout (dropout.h; numerics §13) in one q tile of one KV block: row i, and keys 4 quad .. 4 quad + 3 of
// each 16-key sub-tile. Keys 4 quad, 4 quad + 1 lie in one Philox block (counter offset + 4 (j / 16) + 2 (quad % 2)),
// keys 4 quad + 2, 4 quad + 3 in the next counter's; the row takes word 2 (quad / 2) + (i / 8) % 2 of each, the even
// key its low half (dropout_half). So two Philox calls per lane and sub-tile, of whose eight halves the lane uses two:
// the other six are those of lanes l ^ 8, l ^ 32 and l ^ 40, which draw the same two blocks themselves.
// The tile's first row is a multiple of 16, so i / 16 is uniform and i % 16 = lane % 16.
struct TileDropout {
  rtc_u32 seed_lo, seed_hi;  // the Philox key
  rtc_u64 block_ctr;         // offset + 16 kb: the block's first counter
  rtc_u32 row_hi;            // 8 (i / 16): the counter's row word less i % 8
  rtc_u32 bh;                // the counter's last word: b * heads + h
  rtc_u32 threshold;         // p.drop_threshold
  int lane;

  // Bit 4 sub + i: whether key 4 quad + i of sub-tile sub is kept.
  RTC_DEVICE rtc_u32 keep_bits() const {
    rtc_u32 bits = 0;
#pragma unroll
    for (int sub = 0; sub < kSub; ++sub) bits |= sub_keep_bits(sub) << (4 * sub);
    return bits;
  }
  // Bit i: whether key 4 quad + i of sub-tile sub is kept.
  RTC_DEVICE rtc_u32 sub_keep_bits(int sub) const {
    rtc_u32 bits = 0;
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      // The call's lane-dependent inputs derived from a lane id fenced after the previous call's bits: one call at a
      // time, a few VGPRs on top of the softmax's (interleaved, or with their inputs held, the calls spilled the 128 and
      // 192 variants).
      int l = lane;
      reg_fence(l);
      const rtc_u64 c = block_ctr + (rtc_u64)(4 * sub + pair + 2 * ((l >> 4) & 1));
      const rtc_u32 sel = (rtc_u32)(2 * ((l >> 5) & 1) + ((l >> 3) & 1));  // the lane's word of the call
      const Philox4 d = philox4x32_10((rtc_u32)c, (rtc_u32)(c >> 32), row_hi + (rtc_u32)(l & 7), bh, seed_lo, seed_hi);
      const rtc_u32 w = sel & 2u ? (sel & 1u ? d.v[3] : d.v[2]) : (sel & 1u ? d.v[1] : d.v[0]);
      bits |= (rtc_u32)((w & 0xFFFFu) >= threshold) << (2 * pair);
      bits |= (rtc_u32)((w >> 16) >= threshold) << (2 * pair + 1);
      reg_fence(bits);
    }
    return bits;
  }
};
// What softmax_tile takes of a tile's dropout: the kept elements' factor and, per sub-tile, the keep bits
// (TileDropout), drawn before the tile's softmax (kFirst: the 16 bits held through it, the draws done where fewer of
// the softmax's values are live) or inside it, per sub-tile (holding the draw's inputs instead). Which one fits the
// registers depends on the bucket (mainloop.h, kDrawTileFirst).
template <bool kFirst>
struct TileKeep;
template <>
struct TileKeep<true> {
  rtc_u32 bits;
  float scale;
  RTC_DEVICE static TileKeep of(const TileDropout& d, float scale) { return TileKeep{d.keep_bits(), scale}; }
  RTC_DEVICE rtc_u32 sub_bits(int sub) const { return bits >> (4 * sub); }
};
template <>
struct TileKeep<false> {
  TileDropout d;
  float scale;
  RTC_DEVICE static TileKeep of(const TileDropout& d, float scale) { return TileKeep{d, scale}; }
  RTC_DEVICE rtc_u32 sub_bits(int sub) const { return d.sub_keep_bits(sub); }
};
#endif

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
// drop (RTC_DROPOUT: a TileKeep): l sums every p, and P takes p * scale where kept, 0 where dropped, in fp32 before
// its rounding; the plain variants pass NoDropout and P is p.
template <bool kLast, bool kWindow = false, class ScoreScale, class Drop = NoDropout>
RTC_DEVICE void softmax_tile(rtc_f32x4 (&s)[kSub], rtc_f32x4 (&o)[kHdTiles], Frag (&p)[kSub], float& m, float& l,
                             ScoreScale c, int quad, int valid_kv, int xor32_addr, int lo = 0, int hi = 0,
                             const Drop& drop = Drop{}) {
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
#if RTC_DROPOUT
    const rtc_u32 keep = drop.sub_bits(sub);
#else
    (void)drop;
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float e = exp2_f32(d[i]);
      sum += e;
#if RTC_DROPOUT
      b[i] = p_biased((keep >> i) & 1u ? e * drop.scale : 0.0f);  // l keeps e: the undropped softmax's sum
#else
      b[i] = p_biased(e);
#endif
    }
    p[sub] = as_frag(pack_hi(b[0], b[1]), pack_hi(b[2], b[3]));
  }
  l += sum;
}

}  // namespace g942
