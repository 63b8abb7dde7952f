// The gfx942 decode kernel's online softmax on one KV step's S^T fragments: the mask, the row max and sum across the
// four lanes of a row, the rescale of O and l, P rounded in the mode and packed as the B operand of O^T = V^T P^T.
// The pieces shared with the prefill kernel (row_max4, p_biased, pack_hi) are gfx942/softmax.h's.
//
// A lane holds S^T[key = key0 + 16 s + 4 quad + i][row = lane % 16] for sub-tiles s and i = 0..3: 4 kSub scores of one
// packed row; the row's other scores sit in lanes lane ^ 16, lane ^ 32, lane ^ 48.
#pragma once
#include "platform.h"
#include "isa_gfx9.h"
#include "gfx942/tiles.h"
#include "gfx942/softmax.h"
#include "gfx942_decode/params.h"

namespace gdec {

constexpr int kBucket = RTC_HEAD_DIM_MAX;
constexpr int kSub = decode_subs(kBucket);  // 16-key sub-tiles per step
constexpr int kHdTiles = kBucket / 16;      // O^T tiles of 16 columns
using g942::Frag;

// Every score is masked by the row's keys [lo, hi] (past the sequence, outside a window, a row of no query): decode
// reads memory for a living, and one select per score costs nothing next to it. -Inf, never -FLT_MAX: the running max
// starts at -FLT_MAX, so exp2(-Inf - m) = 0 for every m and m never becomes -Inf.
RTC_DEVICE void softmax_step(rtc_f32x4 (&s)[kSub], rtc_f32x4 (&o)[kHdTiles], Frag (&p)[kSub], float& m, float& l,
                             float c, int quad, int key0, int lo, int hi, int xor32_addr) {
  rtc_f32x4 t[kSub];
#pragma unroll
  for (int sub = 0; sub < kSub; ++sub) t[sub] = s[sub] * c;
#pragma unroll
  for (int j = 0; j < 4 * kSub; ++j) {
    const int key = key0 + 16 * (j >> 2) + 4 * quad + (j & 3);
    t[j >> 2][j & 3] = key >= lo && key <= hi ? t[j >> 2][j & 3] : g942::kNegInf;
  }
  float mx = t[0][0];
#pragma unroll
  for (int j = 1; j < 4 * kSub; ++j) mx = __builtin_fmaxf(mx, t[j >> 2][j & 3]);
  const float m_new = __builtin_fmaxf(m, g942::row_max4(mx, xor32_addr));
  // Skipping is exact: with an unchanged max the factor would be exp2(0) = 1.
  // The factor as a pair held in two registers (fenced): left to itself clang multiplies O's pairs by the factor's
  // register and its neighbour (op_sel_hi), and where the neighbour is a load's destination (gfx950's FP4 at 256: a
  // scale byte) that read waits for every load in flight (vmcnt(0)).
  if (!wave_all(m_new == m)) {
    const float alpha = exp2_f32(m - m_new);
    l *= alpha;
    rtc_f32x2 a2 = {alpha, alpha};
    reg_fence(a2);
#pragma unroll
    for (int t2 = 0; t2 < kHdTiles; ++t2)
#pragma unroll
      for (int i = 0; i < 4; i += 2) {
        const rtc_f32x2 x = rtc_f32x2{o[t2][i], o[t2][i + 1]} * a2;
        o[t2][i] = x[0];
        o[t2][i + 1] = x[1];
      }
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
      b[i] = g942::p_biased(e);
    }
    p[sub] = g942::as_frag(g942::pack_hi(b[0], b[1]), g942::pack_hi(b[2], b[3]));
  }
  l += sum;
}

}  // namespace gdec
