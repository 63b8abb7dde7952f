// The gfx942 decode kernel's scheduler: the work item of a workgroup (16 packed q rows of one (sequence, K/V head),
// whole or one part of a KV split), its sequence and its KV steps.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx942.h"
#include "gfx942_decode/params.h"

namespace gdec {

constexpr int kStepKeys = decode_step_keys(RTC_HEAD_DIM_MAX);

struct Work {
  int b, hk, chunk, part;  // sequence, K/V head, 16-row chunk of its packed rows, split part (0 when unsplit)
  int i0, i1;              // the query rows [i0, i1) the chunk's valid rows hold (empty: nothing to write)
  int kb0, kb1;            // KV steps of this workgroup
};

// The item of workgroup `wg` and its sequence; false when the workgroup holds none (the attention grid's padding).
// Attention: a unit is one part of one (sequence, K/V head), u = (b * heads_k + hk) * splits + part, and its chunks
// run on one XCD one after another: the hardware deals workgroup i to XCD i % 8, so workgroup
// ((u / 8) * chunks + chunk) * 8 + u % 8 puts every chunk of u on XCD u % 8, where the later chunks find the unit's K
// and V in that XCD's L2 (one chunk: the identity). Merge: one workgroup per item, item = bhk * chunks + chunk.
// The K length of a sequence is seq_of's (attn_params.h), the only place that reads it.
RTC_DEVICE bool find_work(const DecodeParams& p, int wg, bool merge, Work& w, Seq& seq) {
  int bhk;
  if (merge) {
    bhk = wg / p.chunks;
    w.chunk = wg - bhk * p.chunks;
    w.part = 0;
  } else {
    const int j = wg >> 3, u = ((j / p.chunks) << 3) + (wg & 7);
    w.chunk = j - (j / p.chunks) * p.chunks;
    bhk = u / p.splits;
    w.part = u - bhk * p.splits;
  }
  if (bhk >= p.batch * p.heads_k) return false;
  w.b = bhk / p.heads_k;
  w.hk = bhk - w.b * p.heads_k;
  seq = seq_of(p, w.b);
  // Rows past the host's seq_q (max_seqlen_q when packed) have no chunk: the grid covers seq_q rows.
  const int rows_q = seq.len_q < p.seq_q ? seq.len_q : p.seq_q;
  const int r0 = w.chunk * DECODE_ROWS, r1 = r0 + DECODE_ROWS;
  w.i0 = r0 / p.group;
  w.i1 = (r1 + p.group - 1) / p.group;
  if (w.i1 > rows_q) w.i1 = rows_q;
  w.kb0 = w.kb1 = 0;
  if (w.i1 > w.i0) {
    // The steps the chunk's rows reach (a window moves right with the row); a part takes its share of them.
    const KvSpan sp = kv_span(seq_view(p, seq), w.i0, w.i1 - w.i0, kStepKeys, RTC_MASK);
    const int n = sp.end - sp.begin;
    w.kb0 = sp.begin + (int)((rtc_i64)w.part * n / p.splits);
    w.kb1 = sp.begin + (int)((rtc_i64)(w.part + 1) * n / p.splits);
  }
  w.b = uniform_i32(w.b);
  w.hk = uniform_i32(w.hk);
  w.chunk = uniform_i32(w.chunk);
  w.part = uniform_i32(w.part);
  w.i0 = uniform_i32(w.i0);
  w.i1 = uniform_i32(w.i1);
  w.kb0 = uniform_i32(w.kb0);
  w.kb1 = uniform_i32(w.kb1);
  return true;
}

}  // namespace gdec
