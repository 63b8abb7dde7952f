// The arithmetic between the sm_90a backward's GEMMs, on wgmma accumulators (thread t of a warpgroup holds
// acc[4j + 2i + c] = D[16 w + l / 4 + 8 i][8 j + 2 (l % 4) + c], w = warp, l = lane): P and dS of each pair, their
// packing as the next GEMM's A operand (a pair of adjacent columns a 32-bit word: word n = columns of acc[2n],
// acc[2n + 1]), and the stores of the gradients. The rules are bwd_common.h's (pair_p_ds): P = exp2(s scale log2(e) -
// LSE log2(e)) rounded to the element type for dV, dS = P (dP - delta) (from P unrounded) rounded for dK and dQ; a pair
// no row sees has P = dS = 0.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bwd_common.h"
#include "ptx_sm90.h"
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

// s (S^T) becomes P^T, unrounded; pp its elements packed. lse: kv_cols of the step's LSE vector (natural log).
RTC_DEVICE void kv_p(float (&s)[32], rtc_u32 (&pp)[16], const float (&lse)[16], float scale_log2, bool cut,
                     const KvCut& kc) {
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
  pack_acc(s, pp);
}

// dp (dP^T) becomes dS^T = P^T (dP^T - delta), packed into pd. delta: kv_cols of the step's delta vector.
RTC_DEVICE void kv_ds(const float (&p)[32], float (&dp)[32], rtc_u32 (&pd)[16], const float (&delta)[16]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        dp[4 * j + 2 * i + c] = p[4 * j + 2 * i + c] * (dp[4 * j + 2 * i + c] - delta[2 * j + c]);
  pack_acc(dp, pd);
}

// ---- DQ: S and dP, rows x keys (64 x kN): a thread's two rows hold their LSE, delta and key range in registers ----

struct DqRows {
  float lse2[2], delta[2];  // log2-domain LSE (+inf: a row past the sequence or seeing no key), delta
  int lo[2], hi[2];  // each row's keys (key_range: the sequence's keys, and the window under RTC_MASK)
};

// s (S) becomes P (unrounded, 0 outside each row's keys when the block is cut), dp (dP) dS, packed into pd.
template <int kN>
RTC_DEVICE void dq_ds(float (&s)[kN / 2], float (&dp)[kN / 2], rtc_u32 (&pd)[kN / 4], const DqRows& rw,
                      float scale_log2, bool cut, int n0) {
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
        dp[e] = p * (dp[e] - rw.delta[i]);
      }
  pack_acc(dp, pd);
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
