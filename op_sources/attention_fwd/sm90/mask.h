// The sm_90a kernel's mask: the K/V blocks a tile visits and which of them a row's window cuts
// (tile_span), the key windows of a thread's two rows, and the -inf written over the scores outside
// them (a window, or the keys past a partial last block).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90/pipeline.h"
#include "sm90/softmax.h"

namespace sm90 {

// The K/V blocks of one tile (kv_span, attn_params.h) for its rows inside the sequence: [begin, end) are
// visited; blocks outside [full_begin, full_end) are cut by a row's window (or by the end of the keys) and get
// the per-element mask. Unmasked, every block is visited and only a partial last block is masked.
RTC_DEVICE KvSpan tile_span(const AttnParams& a, int row0) {
  const rtc_i64 r0 = row0 > 0 ? row0 : 0, r1 = (rtc_i64)row0 + kM < a.seq_q ? (rtc_i64)row0 + kM : a.seq_q;
  return kv_span(a, r0, r1 - r0, kN, RTC_MASK);
}

// Columns >= valid of this block get -inf; the row-max guard of online_softmax (sm90/softmax.h) keeps
// -inf - -inf away.
template <int N>
RTC_DEVICE void mask_cols(float (&s)[N], int valid) {
  const int c0 = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (8 * j + c0 + (k & 1) >= valid) s[4 * j + k] = neg_inf();
}

// The keys of the two rows a thread owns (row0 and row0 + 8) as 32-bit bounds: a row that sees no
// key gets lo > hi. Computed once per tile; the mask of a block then compares columns only.
struct KeyWindow {
  int lo[2], hi[2];
  RTC_DEVICE static KeyWindow of(const AttnParams& a, rtc_i64 row0) {
    KeyWindow w;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const KeyRange kr = key_range(a, row0 + 8 * i);
      w.lo[i] = (int)(kr.lo < a.seq_k ? kr.lo : a.seq_k);  // past every key: clamped, still > hi
      w.hi[i] = (int)(kr.hi > -1 ? kr.hi : -1);
    }
    return w;
  }
  RTC_DEVICE bool sees_a_key(int i) const { return lo[i] <= hi[i]; }
};

// Scores outside each row's key window get -inf (RTC_MASK); col0 is the block's first key, and
// columns past the last key fall outside too (hi <= Sk - 1).
template <int N>
RTC_DEVICE void mask_window(float (&s)[N], const KeyWindow& w, int col0) {
  const int c0 = col0 + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < N / 4; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int col = c0 + 8 * j + k;
        if (col < w.lo[i] || col > w.hi[i]) s[4 * j + 2 * i + k] = neg_inf();
      }
}

// Where a consumer warpgroup's window mask applies: the rows' key ranges and whether block n is cut.
struct WindowMask {
  KeyWindow rows;   // the keys of this thread's two rows
  int full_begin, full_end;
  RTC_DEVICE bool cuts(int n) const { return n < full_begin || n >= full_end; }
};

}  // namespace sm90
