// The sm_90a kernel's producer: one thread of warpgroup 0 walks the CTA's tiles and issues every TMA
// load, Q into the Q ring and K, V block by block into the K/V ring, each on its slot's full barrier
// once the consumers have freed it; paged K/V come page by page through the block table.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "sm90/pipeline.h"
#include "sm90/scheduler.h"
#include "sm90/mask.h"

namespace sm90 {

// A tile of the bucket's kD columns: one box per 64-column block (columns past the call's D read as zeros).
RTC_DEVICE void load_tile(const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, rtc_u32 bytes, int row, int head,
                          int batch, rtc_u32 block_bytes) {
  mbar_expect_tx(bar, bytes);
#pragma unroll
  for (int c = 0; c < kDBlocks; ++c) tma_load_4d(dst + c * block_bytes, &map, bar, c * SM90_BOX_D, row, head, batch);
}

// Paged: the pages of K/V block n of a tile, one per TMA box of gcd(page_size, kN) rows (at most
// kN / 16 boxes; page sizes are powers of two, so no box crosses a page). The producer copies the block-table entries into
// shared memory with cp.async, all at once and before it waits for a free slot, so their latency
// hides under that wait, and K and V share them. A row past the sequence's keys or an out-of-range
// id gets page coordinate num_pages: TMA reads nothing there and fills zeros (still counting the
// bytes), so no id can reach outside the pool.
RTC_DEVICE void fetch_pages(const Sm90AttnParams& p, const Tile& t, int n, rtc_u32 slots) {
  const AttnParams& a = p.a;
  const int first = n * kN, boxes = kN / p.kv_box;
  const int* entry = a.block_table + (rtc_i64)t.batch * a.table_stride;
  for (int i = 0; i < boxes; ++i) {
    const int row = first + i * p.kv_box;
    if (row < t.seq.len_k)
      cp_async_4(slots + 4 * i, entry + (row >> p.page_shift));
    else
      st_shared_u32(slots + 4 * i, a.num_pages);
  }
  cp_async_commit();
}

RTC_DEVICE void load_paged(const Sm90AttnParams& p, const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, rtc_u32 slots,
                           int n, int kvh) {
  const int boxes = kN / p.kv_box, in_page = (1 << p.page_shift) - 1;
  mbar_expect_tx(bar, kKVBytes);
  for (int i = 0; i < boxes; ++i) {
    int page = (int)ld_shared_u32(slots + 4 * i);
    if ((unsigned)page >= (unsigned)p.a.num_pages) page = p.a.num_pages;
    const rtc_u32 at = dst + i * p.kv_box * 128;
    const int row = (n * kN + i * p.kv_box) & in_page;
#pragma unroll
    for (int c = 0; c < kDBlocks; ++c) tma_load_4d(at + c * kHalfKV, &map, bar, c * SM90_BOX_D, row, kvh, page);
  }
}

RTC_DEVICE void load_kv(const Sm90AttnParams& p, const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, const Tile& t,
                        rtc_u32 slots, int n, int kvh) {
  if (RTC_KV == RTC_KV_PAGED)
    load_paged(p, map, dst, bar, slots, n, kvh);
  else  // packed rows: batch coordinate 0, the sequence's rows from k_row
    load_tile(map, dst, bar, kKVBytes, t.seq.k_row + n * kN, kvh, kPacked ? 0 : t.batch, kHalfKV);
}

// The producer's tile loop: per tile, publish its index (dynamic order), load Q, then K and V of each
// block of its span; a tile no row of which sees a key loads nothing (the consumers write its zeros).
RTC_DEVICE void produce(const Sm90AttnParams& p, const SmemTiles& sm) {
  PipeState ps;
  QState qs;
  TileOrder order;
  const int tiles = tile_count(p, sm);
  for (int ti = blockIdx.x; ti < tiles; ti = next_tile(p, ti)) {
    if (kDynamic) publish_tile(sm.bars, order, ti);
    const Tile t = decode_tile(p, sm, ti);
    const KvSpan sp = tile_span(t.view, t.m_block);
    if (sp.begin == sp.end) continue;  // the consumers write zeros without reading Q
    const int kvh = kv_head(p.a, t.head);
    mbar_wait(sm.bars.q_empty(qs.stage), qs.phase ^ 1);
    load_tile(p.tmap_q, sm.q_stage(qs.stage), sm.bars.q_full(qs.stage), kQBytes, t.seq.q_row + t.m_block * kM, t.head,
              kPacked ? 0 : t.batch, kHalfQ);
    qs.advance();
    // Paged: block n's table entries were fetched one block ahead (into the slot set of n's parity),
    // so their latency hides under the previous block's waits.
    if (RTC_KV == RTC_KV_PAGED) fetch_pages(p, t, sp.begin, sm.bars.pages(0));
    for (int n = sp.begin; n < sp.end; ++n) {
      const rtc_u32 pages = sm.bars.pages((n - sp.begin) & 1);
      mbar_wait(sm.bars.k_empty(ps.stage), ps.phase ^ 1);
      if (RTC_KV == RTC_KV_PAGED) cp_async_wait_all();
      load_kv(p, p.tmap_k, sm.k_stage(ps.stage), sm.bars.k_full(ps.stage), t, pages, n, kvh);
      if (RTC_KV == RTC_KV_PAGED && n + 1 < sp.end) fetch_pages(p, t, n + 1, sm.bars.pages((n + 1 - sp.begin) & 1));
      mbar_wait(sm.bars.v_empty(ps.stage), ps.phase ^ 1);
      load_kv(p, p.tmap_v, sm.v_stage(ps.stage), sm.bars.v_full(ps.stage), t, pages, n, kvh);
      ps.advance();
    }
  }
  if (kDynamic) publish_tile(sm.bars, order, tiles);  // the end marker
}

}  // namespace sm90
