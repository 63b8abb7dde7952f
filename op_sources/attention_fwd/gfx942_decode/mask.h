// The gfx942 decode kernel's mask: which packed row a lane holds, and the keys that row sees ([lo, hi], bottom-right
// aligned to its sequence's own lengths through key_range, so a decode row under a causal mask sees the whole cache).
// The scores outside [lo, hi] get -Inf in softmax_step (gfx942_decode/softmax.h); the epilogue tells a row that sees
// no key from one whose scores were all -Inf by lo <= hi.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "gfx942_decode/params.h"
#include "gfx942_decode/scheduler.h"

namespace gdec {

struct RowKeys {
  int g, i;    // q head inside the K/V head's group, query row of the sequence; i < 0: no row of the call
  int lo, hi;  // keys the row sees, inside [0, len_k); none when hi < lo
};

// Packed row r (0..15) of item w: row R = 16 * chunk + r is query row R / group of q head hk * group + R % group.
RTC_DEVICE RowKeys row_keys(const DecodeParams& p, const Work& w, const Seq& seq, int r) {
  RowKeys rk;
  const int R = w.chunk * DECODE_ROWS + r;
  rk.i = R / p.group;
  rk.g = R - rk.i * p.group;
  rk.lo = 0;
  rk.hi = seq.len_k - 1;
  if (rk.i >= w.i1) {  // past the sequence's rows (or the grid's seq_q): computed on nothing, never written
    rk.i = -1;
    rk.hi = -1;
  } else if (RTC_MASK) {
    const KeyRange kr = key_range(seq_view(p, seq), rk.i);
    rk.lo = (int)(kr.lo < seq.len_k ? kr.lo : seq.len_k);
    rk.hi = (int)(kr.hi > -1 ? kr.hi : -1);
  }
  return rk;
}

}  // namespace gdec
