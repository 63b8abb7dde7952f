// The sm_90a kernel's online softmax on wgmma accumulator fragments: the row state, the row max, the
// exponentials and the row sum, the O rescale, the 16-bit packing of P, and what a zero-sum row writes.
// The masks that precede it are sm90/mask.h.
#pragma once
#include "platform.h"
#include "ptx_sm90.h"
#include "attn_params.h"  // RTC_DTYPE
#include "bf16_round.h"  // the rounding mode RTC_ROUND and the bf16x2 packing of P and O
#include "fp16_round.h"  // the fp16x2 packing (fp16 variants: round to nearest even only)

namespace sm90 {

RTC_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

// Row state of the two rows a thread owns in a 64-row fragment: raw-score max m, partial sum l
// of unrounded p over this thread's columns (reduced across the quad only at the end).
struct RowState {
  float m[2];
  float l[2];
  float rescale[2];
  RTC_DEVICE void init() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m[i] = neg_inf();
      l[i] = 0.f;
      rescale[i] = 0.f;
    }
  }
};

// The row max m is scaled rounding DOWN (ms = m*c rounded toward -inf), so the single FFMA
// s*c - ms is exact-or-above zero for the max element: p = 2^x with x >= 0 is >= 1 and every mode
// (RTZ included) turns it into exactly 1.0 in bf16. With ms rounded to nearest, the residual
// could be negative and RTZ truncated p = 1 - eps to 0.996 (the GPU test at Sq=4096, Sk=1).
RTC_DEVICE float scale_max(float m, float c) { return __fmul_rd(m, c); }
RTC_DEVICE float scaled_diff(float s, float c, float ms) { return fmaf(s, c, -ms); }

// Max of row i's scores in this thread's columns and m_old: four independent chains and a pairwise
// combine. The row max sits on the softmax's critical path; one chain of N/2 dependent FMNMX was its
// longest part (NOTES step 10). fmaxf skips NaN in any order, so the result is the set maximum.
template <int N>
RTC_DEVICE float row_max(const float (&s)[N], int i, float m_old) {
  float part[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) part[k] = fmaxf(s[4 * k + 2 * i], s[4 * k + 2 * i + 1]);
#pragma unroll
  for (int j = 4; j < N / 4; ++j) part[j % 4] = fmaxf(part[j % 4], fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
  return fmaxf(fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3])), m_old);
}

// s (scores of one block) -> p = 2^(s*c - m*c) in place; updates m, l and the rescale factor
// of the previous O. A row max of -inf (all scores -inf so far) is treated as 0 so exp2 sees
// -inf, never -inf - -inf; NaN scores are skipped by fmaxf and propagate through p and l.
// Both rows' maxima (and their quad shuffles) come first, so their latencies overlap.
// Where the wait for the in-flight P V goes: after the first kEarlyExp2 of a block's exponentials. Before
// it, the row max, its shuffles and those exponentials overlap the GEMM; after it the O rescale and the
// bf16 packing interleave with the remaining exponentials. All 64 before the wait (the whole softmax
// under the GEMM) and none before it were both 2-4% slower on the H200 (NOTES step 14).
constexpr int kEarlyExp2 = 16;

struct NoMid {
  RTC_DEVICE void operator()() const {}
};

// `mid` runs after the first kEarlyExp2 exponentials (a pinned wgmma wait in the steady state).
template <int N, class Mid = NoMid>
RTC_DEVICE void online_softmax(float (&s)[N], RowState& st, float c, const Mid& mid = Mid()) {
  // A block of N scores has N exponentials per thread; small blocks (N / 2 <= kEarlyExp2) wait after a quarter.
  constexpr int early = kEarlyExp2 < N / 2 ? kEarlyExp2 : N / 4;
  float mx[2], ms[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) mx[i] = row_max(s, i, st.m[i]);
#pragma unroll
  for (int i = 0; i < 2; ++i) mx[i] = fmaxf(mx[i], shfl_xor(mx[i], 1));
#pragma unroll
  for (int i = 0; i < 2; ++i) mx[i] = fmaxf(mx[i], shfl_xor(mx[i], 2));
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    ms[i] = (mx[i] == neg_inf()) ? 0.f : scale_max(mx[i], c);
    // Same rounding as ms: an unchanged max gives exactly 2^0 = 1.
    st.rescale[i] = ex2(scale_max(st.m[i], c) - ms[i]);
    st.m[i] = mx[i];
  }
  // Column pairs in order, both rows interleaved.
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (4 * j + 2 * i + k == early) mid();
        const float p = ex2(scaled_diff(s[4 * j + 2 * i + k], c, ms[i]));
        s[4 * j + 2 * i + k] = p;
        sum[i] += p;
      }
#pragma unroll
  for (int i = 0; i < 2; ++i) st.l[i] = st.l[i] * st.rescale[i] + sum[i];
}

// Final row sum of a row with (quad-reduced) sum l and raw max m. Every p of the row carries the
// common factor 2^r, r = m*c - ms >= 0 (ms rounded down): dividing by the max element's own p takes
// it out, so a row whose only weight is its max gets l = 1 exactly and O = V exactly in RTZ too.
RTC_DEVICE float final_row_sum(float l, float m, float c) {
  if (m == neg_inf()) return l;
  return __fdiv_rn(l, ex2(fmaf(m, c, -scale_max(m, c))));
}

// What the epilogue writes for a row whose sum l is 0, i.e. every score it saw was -inf (m stays -inf).
// A row that sees no key (a window, a sequence without keys) is the empty row: O = +0, LSE -inf
// (numerics §8). A row that sees keys got there through scores past -FLT_MAX (or Inf inputs), and a 0
// row would pass for a right answer: it is NaN, O 0x7FFF and LSE NaN (numerics §4). A select per row in
// the epilogue, none in the main loop, which cannot tell the two -inf apart (masking writes -inf).
struct ZeroSumRow {
  rtc_u32 o;  // two elements
  float lse;
  RTC_DEVICE static ZeroSumRow of(bool sees_key) {
    const rtc_u32 nan2 = RTC_DTYPE == RTC_DTYPE_FP16 ? RTC_FP16_NAN | (RTC_FP16_NAN << 16) : 0x7fff7fffu;
    return sees_key ? ZeroSumRow{nan2, __int_as_float(0x7fc00000)} : ZeroSumRow{0u, neg_inf()};
  }
};

// Two fp32 -> two elements of the variant's dtype: bf16 in the rounding mode RTC_ROUND, fp16 to nearest even.
// The raw form leaves a NaN half as the conversion gives it (P: its row sum carries the NaN); the other form
// writes the canonical NaN of the type (O).
RTC_DEVICE rtc_u32 pack2_raw(float lo, float hi) {
  return RTC_DTYPE == RTC_DTYPE_FP16 ? rtc_f32x2_to_fp16x2_raw_rtne(lo, hi) : rtc_f32x2_to_bf16x2_raw(lo, hi);
}
RTC_DEVICE rtc_u32 pack2(float lo, float hi) {
  return RTC_DTYPE == RTC_DTYPE_FP16 ? rtc_f32x2_to_fp16x2_fast(lo, hi) : rtc_f32x2_to_bf16x2(lo, hi);
}

// O *= its row's rescale factor, always: skipping it when no row max moved was ~3% slower (the
// warp vote sits on the critical path; the FMULs are hidden anyway; NOTES step 5).
template <int N>
RTC_DEVICE void rescale_rows(float (&o)[N], const RowState& st) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) o[4 * j + k] *= st.rescale[k >> 1];
}

// Accumulator layout of p (pairs of adjacent columns) is already the register A-fragment
// layout of the next wgmma: packing pairs in order is the whole conversion. The raw form: a NaN p needs no
// canonical bits here, its row sum l is NaN too and so is the row of O.
template <int N>
RTC_DEVICE void pack_p(const float (&s)[N], rtc_u32 (&p)[N / 2]) {
#pragma unroll
  for (int q = 0; q < N / 2; ++q) p[q] = pack2_raw(s[2 * q], s[2 * q + 1]);
}

}  // namespace sm90
