// The gfx942 kernel's packed sequences (RTC_KV): a sequence's clamped rows, its V^T blocks, and paged K/V rows through per-page buffer resources.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "gfx942/tiles.h"

namespace g942 {

// Sequence b as this kernel reads it: seq_of (rows clamped to the tensors), its keys cut to
// max_seqlen_k (p.seq_k). The V^T stage's grid covers that many keys per sequence; a longer sequence
// breaks the call's contract, and cutting it keeps every V^T read on a block the stage wrote.
RTC_DEVICE Seq packed_seq(const AttnParams& p, int b) {
  Seq s = seq_of(p, b);
  if (s.len_k > p.seq_k) s.len_k = p.seq_k;
  return s;
}

RTC_DEVICE int kv_blocks(int len_k) { return (len_k + GFX942_KV_ROWS - 1) / GFX942_KV_ROWS; }

// First V^T block of sequence b in its K/V head's run of vt_head_blocks. Varlen: floor(k0 / 64) + b,
// so sequences never share a block and the last ends by ceil(total_k / 64) + batch, a size the host
// knows without reading cu_seqlens; paged: a slot of nkb = ceil(max_seqlen_k / 64) blocks per
// sequence. Clamped so that no cu_seqlens value moves a block past the run.
RTC_DEVICE int vt_first_block(const Gfx942Params& p, int b, const Seq& s) {
  const int first = RTC_KV == RTC_KV_PAGED ? b * p.nkb : clamp_i(p.cu_k[b], 0, p.total_k) / GFX942_KV_ROWS + b;
  const int last = p.vt_head_blocks - kv_blocks(s.len_k);
  return first < last ? first : last;
}

// Paged K or V of one K/V head of one sequence: rows found through its block-table row.
struct PagedRows {
  const int* table;         // the sequence's block-table row
  const rtc_bf16_t* head;   // the pool's page 0, row 0, of this K/V head
  rtc_i64 page_stride, row_stride;
  int page_size, num_pages, len;  // len: the sequence's keys; rows past it read as zeros
};

RTC_DEVICE PagedRows paged_rows(const AttnParams& p, const rtc_bf16_t* pool, rtc_i64 page_stride, rtc_i64 row_stride,
                                rtc_i64 head_stride, int b, int hk, int len) {
  return PagedRows{p.block_table + (rtc_i64)b * p.table_stride, pool + (rtc_i64)hk * head_stride, page_stride,
                   row_stride, p.page_size, p.num_pages, len};
}

// The buffer resource of the page holding row j (j uniform): based at the page's row 0 of this head,
// records over its page_size rows only. A row past the sequence, or a block-table id outside
// [0, num_pages) (page_of's rule), gets 0 records: its loads return zeros and never leave the pool.
RTC_DEVICE rtc_buffer_rsrc page_rsrc(const PagedRows& r, int j) {
  const int id = j < r.len ? r.table[j / r.page_size] : -1;
  const bool ok = id >= 0 && id < r.num_pages;
  return uniform_rsrc(r.head + (ok ? (rtc_i64)id * r.page_stride : 0), ok ? rows_span_bytes(r.page_size, r.row_stride) : 0);
}

// Byte offset of row j inside page_rsrc(r, j).
RTC_DEVICE rtc_u32 page_row_byte(const PagedRows& r, int j) { return (rtc_u32)((rtc_i64)(j % r.page_size) * r.row_stride * 2); }

}  // namespace g942
