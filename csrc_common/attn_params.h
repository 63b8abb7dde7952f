// The parameter block of the attention kernels (the forward's; the backward's embeds it): one struct, passed by value,
// shared by host and kernels.
#pragma once
#include "platform.h"

// Strides are in elements and always given in (batch, seq, head) order whatever the layout;
// the head-dim stride is 1 (checked on the host). Offsets are computed in 64 bits.
// q, k, v and o hold 16-bit elements of the variant's dtype (RTC_DTYPE below): the block is the same for each.
struct AttnParams {
  const rtc_elem_t* q;
  const rtc_elem_t* k;
  const rtc_elem_t* v;
  rtc_elem_t* o;
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
  // RTC_KV != 0: `batch` packed sequences; seq_q / seq_k are max_seqlen_q / max_seqlen_k (grid sizes).
  // seq_k bounds no sequence: its keys are all of cu_k's length (seq_of), as in FlashAttention; it bounds only the
  // values of seqused_k (used_keys).
  const int* cu_q;            // [batch + 1] first q (and o) row of each sequence in the packed q
  const int* cu_k;            // [batch + 1] varlen: first k/v row; paged: its differences are the KV lengths
  const int* block_table;     // paged: page ids, row b = sequence b, `table_stride` apart
  const int* seqused_k;       // null, or [batch]: sequence b's KV length (then cu_k gives varlen's first rows only)
  int total_q, total_k;       // rows of the packed q/o and (varlen) k/v: the bounds cu_* are clamped to
  int page_size, num_pages;   // paged: k/v are [num_pages, page_size, heads_k, D] (strides: page, row, head)
  int pages_per_seq, table_stride;  // paged: usable entries of a block-table row, and its stride
  // RTC_KV_DTYPE != SAME: k / v hold bytes (the strides above count bytes), read through kv_quant.h.
  const float* k_descale;     // FP8: null (1), or (sequence b, K/V head h) at b * kd_sb + h * kd_sh
  const float* v_descale;
  rtc_i64 kd_sb, kd_sh, vd_sb, vd_sh;
  const unsigned char* k_scale;  // FP4: E8M0 of key row r of page g, head h at g * ks_sb + r * ks_ss + h * ks_sh
  const unsigned char* v_scale;  // (varlen: the packed row r, ks_sb unused)
  rtc_i64 ks_sb, ks_ss, ks_sh;
  rtc_i64 vs_sb, vs_ss, vs_sh;
  // Score modifications (score_mod.h; read by the variants of the score_mod axis that have them).
  float softcap_log2;         // softcap * log2(e): the capped score's bound in the log2 domain
  float softcap_exp2;         // 2 * scale / softcap * log2(e): exp2(s * softcap_exp2) = e^(2 scale s / softcap)
  const float* alibi_slopes;  // fp32 slope of (sequence or batch b, query head h) at b * alibi_sb + h * alibi_sh
  rtc_i64 alibi_sb, alibi_sh;
  // Dropout (dropout.h; read by the dropout variants).
  const rtc_i64* rng_state;   // int64 [2]: the call's Philox key (seed) and counter offset
  rtc_u32 drop_threshold;     // round(p * 65536): a 16-bit draw below it drops its element
  float drop_scale;           // 1 / (1 - p): a kept element's factor
};

#ifndef RTC_KV
#define RTC_KV 0  // the manifest's kv axis: 0 dense [B, S, H, D]; 1 varlen (packed rows); 2 paged K/V
#endif
#define RTC_KV_DENSE 0
#define RTC_KV_VARLEN 1
#define RTC_KV_PAGED 2

#ifndef RTC_DTYPE
#define RTC_DTYPE 0  // the manifest's dtype axis: q, k, v and o are 0 bf16, 1 fp16 (LSE is fp32 either way)
#endif
#define RTC_DTYPE_BF16 0
#define RTC_DTYPE_FP16 1

#ifndef RTC_KV_DTYPE
#define RTC_KV_DTYPE 0  // the manifest's kv_dtype axis: K / V in q's dtype (0), or a quantized cache (below)
#endif
#define RTC_KV_DTYPE_SAME 0
#define RTC_KV_DTYPE_FP8_E4M3 1       // OCP E4M3 (torch.float8_e4m3fn), with FA3's descales
#define RTC_KV_DTYPE_FP8_E4M3FNUZ 2   // E4M3 FNUZ (torch.float8_e4m3fnuz, MI300X's), with FA3's descales
#define RTC_KV_DTYPE_FP4_E2M1 3       // two E2M1 values a byte, one E8M0 scale per key row and head
// The same FP4 cache, read by gfx950's scaled MFMA with q quantized to FP8 E4M3 per (row, head) by a power-of-two
// scale (an opt-in: q loses bits; the gfx950_decode entry of the manifest).
#define RTC_KV_DTYPE_FP4_E2M1_NATIVE 4
// An FP4 cache, read either way (its layout, scales and checks are the same).
RTC_HD constexpr bool rtc_kv_fp4(int kv_dtype) {
  return kv_dtype == RTC_KV_DTYPE_FP4_E2M1 || kv_dtype == RTC_KV_DTYPE_FP4_E2M1_NATIVE;
}

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

// The window of a sequence of seq_q query rows over seq_k keys: the four values key_range reads of the parameter
// block, for code that holds those alone (the backward's pair masks). Its key_range is the one above, over a block
// with only those four set (the rule stated once; the forward kernels' code is that function's, unchanged).
struct Window {
  int seq_q, seq_k, left, right;
};
RTC_HD Window window_of(const AttnParams& p) { return Window{p.seq_q, p.seq_k, p.window_left, p.window_right}; }
RTC_HD KeyRange key_range(const Window& w, rtc_i64 row) {
  AttnParams p = {};
  p.seq_q = w.seq_q;
  p.seq_k = w.seq_k;
  p.window_left = w.left;
  p.window_right = w.right;
  return key_range(p, row);
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

// ------------------------------------------------------------------ one sequence of the batch
// Where sequence b lives: element offsets of its row 0 in q, o (and k, v unless paged), its lengths,
// and where its LSE rows go. Dense: b's slice of [B, S, H, D]. Varlen / paged: rows read from cu_q /
// cu_k, clamped to [0, total] so that no value of them, decreasing or out of range, reaches outside
// the tensors (a decreasing pair is an empty sequence); paged KV lengths are clamped to the block
// table's row; seqused_k, when given, replaces the KV lengths (used_keys). The kernels never read cu_*,
// seqused_k or block_table on the host: nothing waits on the device.
struct Seq {
  rtc_i64 q_off, o_off, k_off, v_off;
  rtc_i64 lse_off, lse_head_stride;  // lse[lse_off + h * lse_head_stride + row]
  int len_q, len_k;
  int q_row, k_row;  // packed: the sequence's first row in q / o and in k / v (0 when dense; k: 0 when paged)
};

RTC_HD int clamp_i(rtc_i64 x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : (int)x); }

// [start, start + len) of sequence b in offsets cu over [0, total].
RTC_HD void seq_rows(const int* cu, int b, int total, int& start, int& len) {
  start = clamp_i(cu[b], 0, total);
  len = clamp_i(cu[b + 1], start, total) - start;
}

// seqused_k[b] clamped to [0, min(room, max_seqlen_k)]: room is what the sequence can reach from its first key row
// (varlen: total_k - that row; paged: its block-table row's capacity), and max_seqlen_k bounds it too, so a host
// that sizes per-sequence buffers by max_seqlen_k (the gfx942 V^T slots) needs no device value.
RTC_HD int used_keys(const AttnParams& p, int b, int room) {
  return clamp_i(p.seqused_k[b], 0, room < p.seq_k ? room : p.seq_k);
}

RTC_HD Seq seq_of(const AttnParams& p, int b) {
  Seq s;
  if (RTC_KV == RTC_KV_DENSE) {
    s.q_off = (rtc_i64)b * p.q_sb;
    s.o_off = (rtc_i64)b * p.o_sb;
    s.k_off = (rtc_i64)b * p.k_sb;
    s.v_off = (rtc_i64)b * p.v_sb;
    s.lse_off = (rtc_i64)b * p.heads * p.seq_q;
    s.lse_head_stride = p.seq_q;
    s.len_q = p.seq_q;
    s.len_k = p.seq_k;
    s.q_row = s.k_row = 0;
    return s;
  }
  int q0, k0;
  seq_rows(p.cu_q, b, p.total_q, q0, s.len_q);
  s.q_off = (rtc_i64)q0 * p.q_ss;
  s.o_off = (rtc_i64)q0 * p.o_ss;
  s.lse_off = q0;  // AITER's varlen LSE: [heads, total_q]
  s.lse_head_stride = p.total_q;
  s.q_row = q0;
  s.k_row = 0;
  if (RTC_KV == RTC_KV_PAGED) {
    const rtc_i64 cap = (rtc_i64)p.pages_per_seq * p.page_size;
    const int room = (int)(cap < 0x7FFFFFFF ? cap : 0x7FFFFFFF);
    if (p.seqused_k) {
      s.len_k = used_keys(p, b, room);
    } else {
      k0 = clamp_i(p.cu_k[b], 0, 0x7FFFFFFF);
      s.len_k = clamp_i((rtc_i64)clamp_i(p.cu_k[b + 1], k0, 0x7FFFFFFF) - k0, 0, room);
    }
    s.k_off = s.v_off = 0;  // rows through the block table (page_row)
  } else {
    k0 = clamp_i(p.cu_k[b], 0, p.total_k);
    const int end = p.seqused_k ? k0 + used_keys(p, b, p.total_k - k0) : clamp_i(p.cu_k[b + 1], k0, p.total_k);
    s.len_k = end - k0;
    s.k_row = k0;
    s.k_off = (rtc_i64)k0 * p.k_ss;
    s.v_off = (rtc_i64)k0 * p.v_ss;
  }
  return s;
}

// The parameter block as sequence b alone would see it: its lengths in seq_q / seq_k, so that
// key_range and kv_span align its masks bottom-right to its own lengths.
RTC_HD AttnParams seq_view(const AttnParams& p, const Seq& s) {
  AttnParams v = p;
  v.seq_q = s.len_q;
  v.seq_k = s.len_k;
  return v;
}

// Paged: the page that holds key row j of sequence b, or -1 when the block table's entry is not a
// page of the pool (such a row reads as zeros). Row j sits at row j % page_size of that page.
RTC_HD int page_of(const AttnParams& p, int b, int j) {
  const int id = p.block_table[(rtc_i64)b * p.table_stride + j / p.page_size];
  return id >= 0 && id < p.num_pages ? id : -1;
}
