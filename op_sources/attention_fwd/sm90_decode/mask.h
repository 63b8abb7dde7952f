// The sm_90a decode kernel's masks: the keys each of a thread's two packed rows sees, and the scores of a stage that
// fall outside them set to -inf before the softmax.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90/softmax.h"  // neg_inf

namespace sm90dec {

// Packed row r (< 16 row_tiles) of the item: query row i of q head hk * group + g, and the keys [lo, hi] it sees (aligned
// bottom-right to its sequence; unmasked: all of the sequence's keys). i = -1: a row past the item's rows, which sees
// no key and writes nothing.
struct RowKeys {
  int i, g;
  rtc_i64 lo, hi;
};

RTC_DEVICE RowKeys row_keys(const Sm90DecodeParams& p, const Work& w, const Seq& seq, int r) {
  const int packed = w.chunk * DECODE_ROWS * p.row_tiles + r, i = packed / p.group;
  RowKeys k = {-1, packed - i * p.group, 0, -1};
  if (i < w.i0 || i >= w.i1) return k;
  k.i = i;
  if (RTC_MASK) {
    const KeyRange kr = key_range(seq_view(p, seq), i);
    k.lo = kr.lo;
    k.hi = kr.hi;
  } else {
    k.hi = (rtc_i64)seq.len_k - 1;
  }
  return k;
}

// Scores of the stage at key `key0` (this warp's 16 keys: fragment column 8 j + 2 (lane % 4) + c of n-tile j) outside
// their row's keys become -inf. Unmasked stages whose keys all lie in the sequence skip it (the caller's test).
RTC_DEVICE void mask_scores(float (&s)[8], const RowKeys (&rk)[2], rtc_i64 key0, int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const rtc_i64 key = key0 + 8 * j + 2 * (lane % 4) + c;
        if (key < rk[i].lo || key > rk[i].hi) s[4 * j + 2 * i + c] = sm90::neg_inf();
      }
}

}  // namespace sm90dec
