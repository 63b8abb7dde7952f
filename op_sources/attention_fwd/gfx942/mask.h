// The gfx942 kernel's mask outside the KV loop: whether a row of a workgroup sees any key (its window, from
// uniform values), for the zero-sum rows of the epilogue. The K/V blocks a window reaches come from kv_span
// (attn_params.h, gfx942/scheduler.h), the scores outside a row's window get -Inf in softmax_tile
// (gfx942/softmax.h) from the row's key bounds (row_keys, gfx942/mainloop.h).
#pragma once
#include "platform.h"
#include "attn_params.h"

namespace g942 {

// Whether the rows of a workgroup see keys, for the epilogue (ZeroSumRow). Uniform values only, so
// nothing per lane is held across the last PV step: row r of the item sits at key r + diag_off.
struct RowKeys {
  bool any;  // false: no row of the item sees a key
  int diag_off, left, right, seq_k;  // RTC_MASK: the window, as in row_keys
};

RTC_DEVICE bool sees_a_key(const RowKeys& rk, int r) {
  if (!RTC_MASK || !rk.any) return rk.any;  // unmasked: every row sees the item's keys (nblk > 0)
  const rtc_i64 diag = (rtc_i64)r + rk.diag_off;
  const rtc_i64 lo = rk.left < 0 || diag - rk.left < 0 ? 0 : diag - rk.left;
  const rtc_i64 hi = rk.right < 0 || diag + rk.right > rk.seq_k - 1 ? rk.seq_k - 1 : diag + rk.right;
  return lo <= hi;
}

}  // namespace g942
