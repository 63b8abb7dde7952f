// The sm_90a decode kernel's scheduler: the work item of a CTA (row_tiles x 16 packed q rows of one (sequence, K/V
// head), whole or one part of a KV split), its sequence, its rows and its KV stages.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90_decode/params.h"

namespace sm90dec {

constexpr int kBucket = RTC_HEAD_DIM_MAX;
constexpr Sm90DecodePlan kPlan = sm90_decode_plan(kBucket, RTC_KV_DTYPE);  // the ring for the cache's element
constexpr int kStageKeys = kPlan.keys;                                      // 32, 64 or 128 (params.h)

struct Work {
  int b, hk, chunk, part;  // sequence, K/V head, chunk of row_tiles x 16 of its packed rows, split part (0: unsplit)
  int i0, i1;              // the query rows [i0, i1) the chunk's rows hold (empty: nothing to write)
  int kb0, kb1;            // KV stages of this CTA
  rtc_i64 item;            // (b * heads_k + hk) * chunks + chunk: the partials' and the merge's index
};

// The item of CTA `cta` and its sequence; false when there is none. Attention: the chunks of one part are adjacent
// (cta = ((b * heads_k + hk) * splits + part) * chunks + chunk), so a chunk after the first finds the part's K and V
// in L2 (MQA with 128 q heads: two chunks). Merge: one CTA per item. The K length of a sequence is seq_of's
// (attn_params.h), the only place that reads it.
RTC_DEVICE bool find_work(const Sm90DecodeParams& p, int cta, bool merge, Work& w, Seq& seq) {
  int bhk;
  if (merge) {
    bhk = cta / p.chunks;
    w.chunk = cta - bhk * p.chunks;
    w.part = 0;
  } else {
    const int u = cta / p.chunks;  // one part of one (sequence, K/V head)
    w.chunk = cta - u * p.chunks;
    bhk = u / p.splits;
    w.part = u - bhk * p.splits;
  }
  if (bhk >= p.batch * p.heads_k) return false;
  w.b = bhk / p.heads_k;
  w.hk = bhk - w.b * p.heads_k;
  w.item = (rtc_i64)bhk * p.chunks + w.chunk;
  seq = seq_of(p, w.b);
  // Rows past the host's seq_q (max_seqlen_q when packed) have no chunk: the grid covers seq_q rows.
  const int rows_q = seq.len_q < p.seq_q ? seq.len_q : p.seq_q;
  const int r0 = w.chunk * DECODE_ROWS * p.row_tiles, r1 = r0 + DECODE_ROWS * p.row_tiles;
  w.i0 = r0 / p.group;
  w.i1 = (r1 + p.group - 1) / p.group;
  if (w.i1 > rows_q) w.i1 = rows_q;
  w.kb0 = w.kb1 = 0;
  if (w.i1 > w.i0) {
    // The stages the chunk's rows reach (a window moves right with the row); a part takes its share of them.
    const KvSpan sp = kv_span(seq_view(p, seq), w.i0, w.i1 - w.i0, kStageKeys, RTC_MASK);
    const int n = sp.end - sp.begin;
    w.kb0 = sp.begin + (int)((rtc_i64)w.part * n / p.splits);
    w.kb1 = sp.begin + (int)((rtc_i64)(w.part + 1) * n / p.splits);
  }
  return true;
}

}  // namespace sm90dec
