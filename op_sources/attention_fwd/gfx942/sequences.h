// The gfx942 kernel's packed sequences (RTC_KV): where a sequence's V^T blocks sit, and paged K/V rows through
// per-page buffer resources.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "gfx942/tiles.h"

namespace g942 {

RTC_DEVICE int kv_blocks(int len_k) { return (len_k + GFX942_KV_ROWS - 1) / GFX942_KV_ROWS; }

// Every key of a sequence has a V^T block, whatever max_seqlen_k says (it only sizes the launch, as in
// FlashAttention): the run of a K/V head holds what the host can bound without reading a length.
// Varlen: sequence b starts at block floor(k0 / 64) + b, so sequences never share a block and the last
// ends by ceil(total_k / 64) + batch. Paged: a slot of nkb = ceil(pages_per_seq * page_size / 64) blocks
// per sequence, the most seq_of lets a length reach. Varlen with seqused_k: first rows in any order, and
// sequences may share rows, so each gets a slot of nkb = ceil(max_seqlen_k / 64) blocks (used_keys bounds
// its length by max_seqlen_k).
RTC_DEVICE int vt_slot(const Gfx942Params& p, int b) {
  return RTC_KV == RTC_KV_PAGED || p.seqused_k ? b * p.nkb : clamp_i(p.cu_k[b], 0, p.total_k) / GFX942_KV_ROWS + b;
}

// First V^T block of sequence b in its K/V head's run, clamped so that no cu_seqlens value moves a
// block past the run (well-formed metadata never meets the clamp).
RTC_DEVICE int vt_first_block(const Gfx942Params& p, int b, const Seq& s) {
  const int first = vt_slot(p, b), last = p.vt_head_blocks - kv_blocks(s.len_k);
  return first < last ? first : last;
}

// Varlen: the sequence whose blocks hold block j of a K/V head's run, the last b with vt_slot(b) <= j
// (increasing in b for well-formed cu_seqlens). A binary search on uniform values, log2(batch) loads:
// the V^T grid then covers the run, sized from total_k, not batch x max_seqlen_k. Any cu_seqlens
// value gives some b in [0, batch).
RTC_DEVICE int vt_block_owner(const Gfx942Params& p, int j) {
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = uniform_i32((lo + hi + 1) >> 1);
    if (vt_slot(p, mid) <= j)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
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
  return PagedRows{p.block_table + (rtc_i64)b * p.table_stride,
                   pool + (rtc_i64)hk * head_stride,
                   page_stride,
                   row_stride,
                   p.page_size,
                   p.num_pages,
                   len};
}

// The buffer resource of page `id` (uniform; -1 for a row past the sequence), for rows of d columns: based at the
// page's row 0 of this head, records over its page_size rows only. A row past the sequence, or a block-table id
// outside [0, num_pages) (page_of's rule), gets 0 records: its loads return zeros and never leave the pool.
RTC_DEVICE rtc_buffer_rsrc page_rsrc_at(const PagedRows& r, int id, int d) {
  const bool ok = id >= 0 && id < r.num_pages;
  return uniform_rsrc(r.head + (ok ? (rtc_i64)id * r.page_stride : 0),
                      ok ? rows_span_bytes(r.page_size, r.row_stride, d) : 0);
}
// The same for the page holding row j (j uniform), its id read from the block table here.
RTC_DEVICE rtc_buffer_rsrc page_rsrc(const PagedRows& r, int j, int d) {
  return page_rsrc_at(r, j < r.len ? r.table[j / r.page_size] : -1, d);
}

// Byte offset of row j inside page_rsrc(r, j, d).
RTC_DEVICE rtc_u32 page_row_byte(const PagedRows& r, int j) {
  return (rtc_u32)((rtc_i64)(j % r.page_size) * r.row_stride * 2);
}

// The 16-row group of rows j0..j0+15 (j0 a multiple of 16, uniform; one page): the address of row j0, and in
// `left` how many of the group's rows, from j0 on, are rows of the sequence in a page of the pool (0 when the
// page id is outside [0, num_pages), as in page_rsrc). Pages hold a power of two rows (the runtime checks it):
// the page and the row in it are a shift and a mask, scalar work, where page_rsrc divides.
RTC_DEVICE rtc_u64 paged_group(const PagedRows& r, int j0, int& left) {
  const int shift = __builtin_ctz((unsigned)r.page_size);
  const int id = j0 < r.len ? r.table[j0 >> shift] : -1;
  const bool ok = id >= 0 && id < r.num_pages;
  left = ok ? r.len - j0 : 0;
  const rtc_i64 row = (rtc_i64)(j0 & (r.page_size - 1)) * r.row_stride;
  return (rtc_u64)(r.head + (ok ? (rtc_i64)id * r.page_stride + row : 0));
}

}  // namespace g942
