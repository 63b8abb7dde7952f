// The arithmetic between the sm_90a backward's GEMMs, on wgmma accumulators (thread t of a warpgroup holds
// acc[4j + 2i + c] = D[16 w + l / 4 + 8 i][8 j + 2 (l % 4) + c], w = warp, l = lane): P and dS of each pair, their
// packing as the next GEMM's A operand (a pair of adjacent columns a 32-bit word: word n = columns of acc[2n],
// acc[2n + 1]), and the stores of the gradients. The rules are bwd_common.h's (pair_p_ds): P = exp2(s scale log2(e) -
// LSE log2(e)) rounded to the element type for dV, dS = P (dP - delta) (from P unrounded) rounded for dK and dQ; a pair
// no row sees has P = dS = 0. With score modifications (RTC_SCORE_MOD: the soft cap, ALiBi; score_mod_sm90.h) P is of
// the modified score and dS takes the cap's derivative before its rounding (pair_p_ds_mod_bits). With dropout
// (RTC_DROPOUT) dV's P and dS's dP take the mask (pair_p_ds_drop_bits).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bwd_common.h"
#include "ptx_sm90.h"
#include "score_mod_sm90.h"
#include "sm90/tiles.h"

namespace bwd90 {

RTC_DEVICE int lane() { return threadIdx.x % 32; }
RTC_DEVICE int warp_in_wg() { return (threadIdx.x / 32) % 4; }
// The accumulator row of element (i) and column of (j, c) that this thread holds.
RTC_DEVICE int acc_row(int i) { return 16 * warp_in_wg() + lane() / 4 + 8 * i; }
RTC_DEVICE int acc_col(int j, int c) { return 8 * j + 2 * (lane() % 4) + c; }

// Two fp32 values as two elements (lo in the low half): bf16 in the variant's mode, fp16 to nearest even. raw: NaN
// bits as the instruction gives them (operands of a GEMM, where a NaN gives NaN whatever its bits).
RTC_DEVICE rtc_u32 pack_raw(float lo, float hi) {
  return RTC_DTYPE == RTC_DTYPE_FP16 ? sm90::cvt_f16x2_f32(lo, hi) : rtc_f32x2_to_bf16x2_raw(lo, hi);
}
RTC_DEVICE rtc_u32 pack_elems(float lo, float hi) {
  return RTC_DTYPE == RTC_DTYPE_FP16 ? ((rtc_u32)bwd::to_elem(hi) << 16 | bwd::to_elem(lo))
                                     : rtc_f32x2_to_bf16x2(lo, hi);
}
template <int R> RTC_DEVICE void pack_acc(const float (&x)[R], rtc_u32 (&w)[R / 2]) {
#pragma unroll
  for (int n = 0; n < R / 2; ++n) w[n] = pack_raw(x[2 * n], x[2 * n + 1]);
}

// ---- score modifications (RTC_SCORE_MOD) ----

// What P is formed from (score_mod_sm90.h): t at scale 1 with a soft cap; else the raw score, or s' with ALiBi alone.
enum : bool { kScoreT = sm90::score_mod_t(false) };  // enumerators: no global in the code object

// The modifications of one query head's pairs (empty for a plain variant): the soft cap's constants and the head's
// ALiBi factor.
struct PairMods {
#if RTC_SCORE_MOD
  sm90::Softcap cap;
  float alibi_k;
#endif
  RTC_DEVICE static PairMods of(const AttnParams& a, int b, int h) {
    PairMods m;
#if RTC_SCORE_MOD
    m.cap = sm90::Softcap::of(a);
    m.alibi_k = RTC_ALIBI ? sm90::alibi_factor(sm90::alibi_slope(a, b, h), a.scale, kScoreT) : 0.f;
#endif
    return m;
  }
};
// The backward's soft cap takes the SFU's reciprocal (score_mod_sm90.h), in passes over a fragment with R kept in the
// score's register (cap_r, then cap_t and the derivative from it): the backward's five GEMMs a pair leave the SFU
// room (the forward's two do not), and its registers (all but a few held by accumulators) no room for the FP32 pipe's
// longer chain or for chains of the whole fragment interleaved.
template <int N> RTC_DEVICE void cap_r(float (&s)[N], const PairMods& m) {
#if RTC_SCORE_MOD
#pragma unroll
  for (int e = 0; e < N; ++e) s[e] = m.cap.r_sfu(s[e]);
#endif
}
// What P is formed from: t of the kept R (a soft cap) or the raw score (ALiBi alone), then ALiBi's term at key - diag
// = dist (as a float).
RTC_DEVICE float cap_t(float x, const PairMods& m, float dist) {
#if RTC_SCORE_MOD
  if (RTC_SOFTCAP) x = m.cap.t_of(x);
  if (RTC_ALIBI) x = fmaf(fabsf(dist), m.alibi_k, x);
#endif
  return x;
}

// ---- dropout (RTC_DROPOUT; the mask is dropout.h's, the rules bwd_common.h's pair_p_ds_drop_bits) ----
// dV takes P Z (Z = keep / (1 - p)) as the kept p, 0 when dropped, its sum times 1 / (1 - p) at dV's store
// (FlashAttention's order), and dS = P (dP Z - delta), times the cap's derivative with a soft cap. A step's keep bits are formed once (bit e: element e of the fragment) from the
// mask's Philox blocks (2 rows x 4 keys each).

// The mask's (sequence, query head) word of the counter. The call's (seed, offset) is read from rng_state where the
// bits are formed (an L1 hit), not held across a stage: four registers that ptxas spilled loop invariants for at 128.
struct PairDrop {
#if RTC_DROPOUT
  rtc_u32 bh;
#endif
  RTC_DEVICE static PairDrop of(const AttnParams& a, int b, int h) {
    PairDrop d;
#if RTC_DROPOUT
    d.bh = (rtc_u32)(b * a.heads + h);
#endif
    return d;
  }
};
RTC_DEVICE Philox4 drop_draws(const PairDrop& d, rtc_u64 seed, rtc_u64 ctr, rtc_u32 row_word) {
#if RTC_DROPOUT
  return philox4x32_10((rtc_u32)ctr, (rtc_u32)(ctr >> 32), row_word, d.bh, (rtc_u32)seed, (rtc_u32)(seed >> 32));
#else
  return Philox4{{0u, 0u, 0u, 0u}};
#endif
}
// The keep bits of a call's halves, gathered four at a time: each half's bit is bit 15 or 31 of KeepHalves::kept_bits
// of its word (the sign of byte 1 or 3); PRMT puts four of those bytes side by side and one product moves their signs
// (bits 7, 15, 23, 31) to bits 28-31 in order (pack4) or to bits 25, 27, 29, 31 (spread4); the product's other bits
// land below bit 24.
RTC_DEVICE rtc_u32 signs_pack4(rtc_u32 x) { return (x & 0x80808080u) * 0x00204081u; }
RTC_DEVICE rtc_u32 signs_spread4(rtc_u32 x) { return (x & 0x80808080u) * 0x00041041u; }

// A DKDV step's keep bits (S^T: element 4j + 2i + c is key k0 + acc_row(i), row m0 + acc_col(j, c)); m0 and k0
// multiples of 16. A Philox block is rows {r, r + 8} (j = 2jj, 2jj + 1; c) by the thread's keys {k, k + 8} (i) and the
// two keys of the other parity, which lane ^ 4 holds (the same rows and key pair, the other key parity). So the two
// lanes split a step's eight calls: each draws the four of its own c (= its key parity), keeps its halves' bits and
// hands lane ^ 4 the other halves' bits, one shuffle for the step. Word 2i + jo of a call holds element
// 4 (2jj + jo) + 2i + c in its half c (the thread's) and the partner's in the other.
RTC_DEVICE rtc_u32 kv_keep(const PairDrop& d, const AttnParams& a, int m0, int k0) {
  rtc_u32 bits = 0;
#if RTC_DROPOUT
  const int l = lane(), t = l % 4, high = (l >> 2) & 1, c = high;
  const KeepHalves kh = KeepHalves::of(a.drop_threshold);
  const rtc_u64 seed = (rtc_u64)rtc_gld(a.rng_state), offset = (rtc_u64)rtc_gld(a.rng_state + 1);
  const rtc_u64 ctr = offset + (rtc_u64)(4 * ((k0 >> 4) + warp_in_wg()) + (l >> 3));
  const rtc_u32 pair_sel = high ? 0x5713u : 0x7531u;  // of two words: (own half, other half) of each
  rtc_u32 theirs = 0;
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    const Philox4 r = drop_draws(d, seed, ctr, (rtc_u32)(8 * ((m0 >> 4) + jj) + 2 * t + c));
    const rtc_u32 x01 = sm90::prmt(kh.kept_bits(r.v[0]), kh.kept_bits(r.v[1]), pair_sel);
    const rtc_u32 x23 = sm90::prmt(kh.kept_bits(r.v[2]), kh.kept_bits(r.v[3]), pair_sel);
    // words 0, 2, 1, 3: elements 8 jj + c + 0, 2, 4, 6
    bits |= (signs_spread4(sm90::prmt(x01, x23, 0x6240u)) >> (25 - c)) << (8 * jj);
    theirs |= (signs_spread4(sm90::prmt(x01, x23, 0x7351u)) >> (25 - c)) << (8 * jj);
  }
  bits |= __shfl_xor_sync(0xffffffffu, theirs, 4);
#endif
  return bits;
}

// A DQ step's keep bits (S: element 4j + 2i + c is row row0 + acc_row(i), key n0 + acc_col(j, c); row0 and n0
// multiples of 16): the forward's fragment, the eight elements of each 16-key group one Philox block, element 8 g + e
// half e of the call (word e / 2).
template <int kN>
RTC_DEVICE rtc_u64 dq_keep(const PairDrop& d, const AttnParams& a, int row0, int n0) {
  rtc_u64 bits = 0;
#if RTC_DROPOUT
  const int l = lane();
  const KeepHalves kh = KeepHalves::of(a.drop_threshold);
  const rtc_u32 row_word = (rtc_u32)(8 * ((row0 >> 4) + warp_in_wg()) + l / 4);
  const rtc_u64 seed = (rtc_u64)rtc_gld(a.rng_state), offset = (rtc_u64)rtc_gld(a.rng_state + 1);
  const rtc_u64 ctr = offset + (rtc_u64)(4 * (n0 >> 4) + l % 4);
#pragma unroll 2
  for (int g = 0; g < kN / 16; ++g) {  // two calls side by side (kv_keep)
    const Philox4 r = drop_draws(d, seed, ctr + (rtc_u64)(4 * g), row_word);
    const rtc_u32 x01 = sm90::prmt(kh.kept_bits(r.v[0]), kh.kept_bits(r.v[1]), 0x7531u);  // halves 0-3
    const rtc_u32 x23 = sm90::prmt(kh.kept_bits(r.v[2]), kh.kept_bits(r.v[3]), 0x7531u);  // halves 4-7
    const rtc_u32 byte = (signs_pack4(x01) >> 28) | (signs_pack4(x23) >> 24);
    bits |= (rtc_u64)byte << (8 * g);
  }
#endif
  return bits;
}

// Element e of P for dV under keep bits `keep`: the kept p unscaled, 0 when dropped (dV takes 1 / (1 - p) at its store,
// one product an element of dV, not one a score); p without dropout.
template <class Bits> RTC_DEVICE float drop_keep(float x, Bits keep, int e) {
  return RTC_DROPOUT ? (((keep >> e) & 1) ? x : 0.0f) : x;
}
// dP Z - delta of element e (for dS; z = 1 / (1 - p)); dP - delta without dropout. (As one FMA with z or 0 for its
// factor, ptxas spilled 140 bytes at 128.)
template <class Bits> RTC_DEVICE float drop_dp(float dp, Bits keep, int e, float z, float delta) {
  return (RTC_DROPOUT ? (((keep >> e) & 1) ? dp * z : 0.0f) : dp) - delta;
}

// ---- DKDV: S^T and dP^T, keys x rows (64 x 64): a column is a query row, its LSE and delta in shared memory ----

// The window of a step cut by its edge: row (column) m0 + col sees key k0 + row when inside its key range.
struct KvCut {
  Window w;
  int m0, k0;
  RTC_DEVICE bool seen(int col, int row) const {
    const KeyRange kr = key_range(w, m0 + col);
    return k0 + row >= kr.lo && k0 + row <= kr.hi;
  }
};

// The step's vector of one per-row value (LSE or delta) at this thread's 16 columns, read from shared memory before the
// GEMM it applies to is waited for (the load's latency under the GEMM's, not after it).
RTC_DEVICE void kv_cols(float (&v)[16], rtc_u32 vec) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    rtc_u32 x0, x1;
    sm90::ld_shared_v2_u32(x0, x1, vec + acc_col(j, 0) * 4);
    v[2 * j] = rtc_bits_f32(x0);
    v[2 * j + 1] = rtc_bits_f32(x1);
  }
}

// With score modifications: s (S^T) becomes P^T of the modified scores, times the cap's derivative (the factor dS takes
// from kv_ds); pp P^T's elements packed (pair by pair, so that the derivative needs no register array); lse_vec: the
// step's LSE vector in shared memory. The distance key - diag of element (j, i, c): key k0 + acc_row(i), query row
// m0 + acc_col(j, c).
RTC_DEVICE void kv_p_mod(float (&s)[32], rtc_u32 (&pp)[16], rtc_u32 lse_vec, float scale_log2, bool cut,
                         const KvCut& kc, const PairMods& md, rtc_u32 keep) {
  const float c_p = kScoreT ? 1.f : scale_log2;
  const float base = (float)((rtc_i64)kc.k0 + acc_row(0) - kc.m0 - acc_col(0, 0) - kc.w.seq_k + kc.w.seq_q);
  if (RTC_SOFTCAP) cap_r(s, md);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    rtc_u32 x0, x1;  // the columns' LSE read here, not held from before the wait (kv_cols): 16 registers fewer
    sm90::ld_shared_v2_u32(x0, x1, lse_vec + acc_col(j, 0) * 4);
    const float lse2[2] = {lse_log2(rtc_bits_f32(x0)), lse_log2(rtc_bits_f32(x1))};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float pe[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[4 * j + 2 * i + c];
        pe[c] = sm90::ex2(fmaf(cap_t(x, md, base + (float)(8 * i - 8 * j - c)), c_p, -lse2[c]));
        if (RTC_MASK && cut && !kc.seen(acc_col(j, c), acc_row(i))) pe[c] = 0.0f;
        x = RTC_SOFTCAP ? pe[c] * sm90::Softcap::dt_of(x) : pe[c];
      }
      pp[2 * j + i] = pack_raw(drop_keep(pe[0], keep, 4 * j + 2 * i), drop_keep(pe[1], keep, 4 * j + 2 * i + 1));
    }
  }
}

// s (S^T) becomes P^T, unrounded; pp its elements packed. lse: kv_cols of the step's LSE vector (natural log).
RTC_DEVICE void kv_p(float (&s)[32], rtc_u32 (&pp)[16], const float (&lse)[16], float scale_log2, bool cut,
                     const KvCut& kc, rtc_u32 keep) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float lse2[2] = {lse_log2(lse[2 * j]), lse_log2(lse[2 * j + 1])};
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[4 * j + 2 * i + c];
        x = sm90::ex2(fmaf(x, scale_log2, -lse2[c]));
        if (RTC_MASK && cut && !kc.seen(acc_col(j, c), acc_row(i))) x = 0.0f;
      }
  }
#pragma unroll
  for (int n = 0; n < 16; ++n)
    pp[n] = pack_raw(drop_keep(s[2 * n], keep, 2 * n), drop_keep(s[2 * n + 1], keep, 2 * n + 1));
}

// dp (dP^T) becomes dS^T = P^T (dP^T Z - delta), packed into pd. delta: kv_cols of the step's delta vector.
RTC_DEVICE void kv_ds(const float (&p)[32], float (&dp)[32], rtc_u32 (&pd)[16], const float (&delta)[16], rtc_u32 keep,
                      float z) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * j + 2 * i + c;
        dp[e] = p[e] * drop_dp(dp[e], keep, e, z, delta[2 * j + c]);
      }
  pack_acc(dp, pd);
}

// ---- DQ: S and dP, rows x keys (64 x kN): a thread's two rows hold their LSE, delta and key range in registers ----

struct DqRows {
  float lse2[2], delta[2];  // log2-domain LSE (+inf: a row past the sequence or seeing no key), delta
  int lo[2], hi[2];  // each row's keys (key_range: the sequence's keys, and the window under RTC_MASK)
#if RTC_SCORE_MOD
  float d0;  // key - diag of the first row at the fragment's first column of key 0 (the second row's diag: 8 more)
#endif
};

// s (S) becomes P (unrounded, 0 outside each row's keys when the block is cut), dp (dP) dS, packed into pd.
template <int kN>
RTC_DEVICE void dq_ds(float (&s)[kN / 2], float (&dp)[kN / 2], rtc_u32 (&pd)[kN / 4], const DqRows& rw,
                      float scale_log2, bool cut, int n0, rtc_u64 keep, float z) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * j + 2 * i + c;
        float p = sm90::ex2(fmaf(s[e], scale_log2, -rw.lse2[i]));
        if (cut) {
          const int key = n0 + acc_col(j, c);
          if (key < rw.lo[i] || key > rw.hi[i]) p = 0.0f;
        }
        dp[e] = p * drop_dp(dp[e], keep, e, z, rw.delta[i]);
      }
  pack_acc(dp, pd);
}

// The same with score modifications: P of the modified scores, dS = (P (dP - delta)) times the cap's derivative.
template <int kN>
RTC_DEVICE void dq_ds_mod(float (&s)[kN / 2], float (&dp)[kN / 2], rtc_u32 (&pd)[kN / 4], const DqRows& rw,
                          float scale_log2, bool cut, int n0, const PairMods& md, rtc_u64 keep, float z) {
#if RTC_SCORE_MOD
  const float c_p = kScoreT ? 1.f : scale_log2, base = (float)n0 + rw.d0;
  if (RTC_SOFTCAP) {
    cap_r(s, md);
#pragma unroll
    for (int e = 0; e < kN / 2; ++e)
      dp[e] = drop_dp(dp[e], keep, e, z, rw.delta[(e / 2) % 2]) * sm90::Softcap::dt_of(s[e]);
  }
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * j + 2 * i + c;
        float p = sm90::ex2(fmaf(cap_t(s[e], md, base + (float)(8 * j + c - 8 * i)), c_p, -rw.lse2[i]));
        if (cut) {
          const int key = n0 + acc_col(j, c);
          if (key < rw.lo[i] || key > rw.hi[i]) p = 0.0f;
        }
        dp[e] = RTC_SOFTCAP ? p * dp[e] : p * drop_dp(dp[e], keep, e, z, rw.delta[i]);
      }
  pack_acc(dp, pd);
#endif
}

// ---- stores: an accumulator of kN columns times `scale`, rounded to the element type, at rows below `valid` and
// columns below d; dst is the tile's row 0 at column col0, rows ss elements apart (4-byte aligned pairs) ----
template <int kN>
RTC_DEVICE void store_acc(rtc_elem_t* dst, rtc_i64 ss, const float (&acc)[kN / 2], int valid, int col0, int d,
                          float scale) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = acc_row(i), col = col0 + acc_col(j, 0);
      if (r < valid && col < d)
        *reinterpret_cast<rtc_u32*>(dst + (rtc_i64)r * ss + col) =
            pack_elems(acc[4 * j + 2 * i] * scale, acc[4 * j + 2 * i + 1] * scale);
    }
}

}  // namespace bwd90
