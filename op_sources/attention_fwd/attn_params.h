// The parameter block of every attention forward kernel: one struct, passed by value, shared by host and kernels.
#pragma once
#include "platform.h"

// Strides are in elements and always given in (batch, seq, head) order whatever the layout;
// the head-dim stride is 1 (checked on the host). Offsets are computed in 64 bits.
struct AttnParams {
  const rtc_bf16_t* q;
  const rtc_bf16_t* k;
  const rtc_bf16_t* v;
  rtc_bf16_t* o;
  float* lse;                 // [B, H, Sq] contiguous fp32, natural log; null when not requested
  void* workspace;            // caller-allocated scratch (tail-split partials, V transpose); may be null
  rtc_i64 workspace_bytes;
  rtc_i64 q_sb, q_ss, q_sh;   // strides of q
  rtc_i64 k_sb, k_ss, k_sh;
  rtc_i64 v_sb, v_ss, v_sh;
  rtc_i64 o_sb, o_ss, o_sh;
  int batch, heads, seq_q, seq_k, head_dim;
  float scale;                // softmax scale (default 1/sqrt(D))
  float scale_log2;           // scale * log2(e): scores go to the log2 domain with one multiply
  int tail_split;             // fast kernels: number of KV parts of the tail (0 = off); baseline ignores
  int heads_k;                // K/V heads: query head h reads K/V head h / (heads / heads_k) (GQA/MQA)
  int window_left;            // keys a row sees before its diagonal (-1: unbounded); read when RTC_MASK
  int window_right;           // keys after the diagonal (-1: unbounded; causal: 0); read when RTC_MASK
};

#ifndef RTC_MASK
#define RTC_MASK 0  // the manifest's mask axis: 0 every row sees every key, 1 the window below
#endif

// The keys query row i sees, [lo, hi] (empty when hi < lo), aligned bottom-right as in AITER and
// FlashAttention >= 2.1: row i sits at key position i + Sk - Sq. Shared by every kernel and the host.
struct KeyRange {
  rtc_i64 lo, hi;
};

RTC_HD KeyRange key_range(const AttnParams& p, rtc_i64 row) {
  const rtc_i64 diag = row + p.seq_k - p.seq_q;
  KeyRange r = {0, (rtc_i64)p.seq_k - 1};
  if (p.window_left >= 0 && diag - p.window_left > r.lo) r.lo = diag - p.window_left;
  if (p.window_right >= 0 && diag + p.window_right < r.hi) r.hi = diag + p.window_right;
  return r;
}

// The key blocks of `block` rows that the query rows [q0, q0 + rows) reach: [begin, end); and the
// ones every such row sees whole, [full_begin, full_end) (a partial last block is never whole).
// Windows move right with the row, so the first and last rows bound both. Not masked: every block.
// The kernels' tiles and the hosts' plans use this one function.
struct KvSpan {
  int begin, end, full_begin, full_end;
};

RTC_HD KvSpan kv_span(const AttnParams& p, rtc_i64 q0, rtc_i64 rows, int block, bool masked) {
  const int n_blocks = (int)(((rtc_i64)p.seq_k + block - 1) / block), whole = (int)(p.seq_k / block);
  KvSpan sp = {0, n_blocks, 0, whole};
  if (!masked) return sp;
  const KeyRange first = key_range(p, q0), last = key_range(p, q0 + rows - 1);
  if (last.hi < first.lo) return KvSpan{0, 0, 0, 0};  // no row sees a key
  sp.begin = (int)(first.lo / block);
  sp.end = (int)(last.hi / block) + 1;
  sp.full_begin = (int)((last.lo + block - 1) / block);
  sp.full_end = (int)((first.hi + 1) / block);
  if (sp.full_end > whole) sp.full_end = whole;
  if (sp.full_begin < sp.begin) sp.full_begin = sp.begin;
  if (sp.full_end < sp.full_begin) sp.full_end = sp.full_begin;
  return sp;
}

// The K/V head that query head h reads.
RTC_HD int kv_head(const AttnParams& p, int h) { return h / (p.heads / p.heads_k); }
