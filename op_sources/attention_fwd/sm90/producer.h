// The sm_90a kernel's producer: one thread of warpgroup 0 (paged: its first warp) walks the CTA's tiles
// and issues every TMA load, Q into the Q ring and K, V block by block into the K/V ring, each on its
// slot's full barrier once the consumers have freed it; paged K/V come page by page through the block
// table, one box per lane.
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

// Paged K/V: the producer warp gathers a block's pages. A block is kN / kv_box boxes of kv_box =
// gcd(page_size, kN) rows (page sizes are powers of two, so no box crosses a page) times kDBlocks
// column blocks, at most kN / 16 * kDBlocks TMA boxes; lane l issues box l / kDBlocks, column block
// l % kDBlocks, so the table reads, their latencies and the coordinates of all boxes are taken in
// parallel, and only the TMA issues themselves follow one another. A row past the sequence's keys or
// an out-of-range id gets page coordinate num_pages: TMA reads nothing there and fills zeros (still
// counting the bytes), so no id can reach outside the pool.
static_assert(!paged_loads() || kN / 16 * kDBlocks <= producer_threads(),
              "one TMA box of a paged K/V block per lane of the producer warp");

// This lane's page id of block n (the raw table entry; load_paged clamps it). Issued a block ahead of
// its use: the load is not waited for until the TMA that reads it.
RTC_DEVICE int lane_page(const Sm90AttnParams& p, const Tile& t, int n) {
  const int first = producer_lane() / kDBlocks * p.kv_box, row = n * kN + first;
  if (first >= kN || row >= t.seq.len_k) return p.a.num_pages;  // no box of this lane, or past the keys
  return ld_global_nc_s32(p.a.block_table + (rtc_i64)t.batch * p.a.table_stride + (row >> p.page_shift));
}

// The block's boxes on one full barrier: lane 0 arrives with the whole block's bytes, each gathering lane
// issues its box. The tx-count may see a box complete before lane 0's expect_tx (it goes negative, which
// the mbarrier allows), but the phase cannot complete before it: lane 0's arrive is the phase's only
// arrival and adds the bytes before it counts, so the phase completes once all kKVBytes have landed.
RTC_DEVICE void load_paged(const Sm90AttnParams& p, const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, int page, int n,
                           int kvh) {
  const int lane = producer_lane(), first = lane / kDBlocks * p.kv_box, c = lane % kDBlocks;
  if (lane == 0) mbar_expect_tx(bar, kKVBytes);
  if (first < kN) {  // the box of rows [first, first + kv_box) of the block, column block c
    if ((unsigned)page >= (unsigned)p.a.num_pages) page = p.a.num_pages;
    const int row = (n * kN + first) & ((1 << p.page_shift) - 1);
    tma_load_4d(dst + first * 128 + c * kHalfKV, &map, bar, c * SM90_BOX_D, row, kvh, page);
  }
}

RTC_DEVICE void load_kv(const Sm90AttnParams& p, const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, const Tile& t,
                        int page, int n, int kvh) {
  if (paged_loads())
    load_paged(p, map, dst, bar, page, n, kvh);
  else  // packed rows: batch coordinate 0, the sequence's rows from k_row
    load_tile(map, dst, bar, kKVBytes, t.seq.k_row + n * kN, kvh, kPacked ? 0 : t.batch, kHalfKV);
}

// The producer's tile loop: per tile, publish its index (dynamic order), load Q, then K and V of each
// block of its span; a tile no row of which sees a key loads nothing (the consumers write its zeros).
// Paged, the whole warp runs it in step (every value it branches on is the same in each lane); lane 0
// alone takes and publishes tiles, loads Q and arrives on the K/V barriers, and each lane waits for a
// slot itself before its box may overwrite it.
RTC_DEVICE void produce(const Sm90AttnParams& p, const SmemTiles& sm) {
  PipeState ps;
  QState qs;
  TileOrder order;
  const bool leader = producer_lane() == 0;
  const int tiles = tile_count(p, sm);
  for (int ti = blockIdx.x; ti < tiles; ti = next_tile(p, ti)) {
    if (kDynamic) publish_tile(sm.bars, order, ti, leader);
    const Tile t = decode_tile(p, sm, ti);
    const KvSpan sp = tile_span(t.view, t.row0);
    if (sp.begin == sp.end) continue;  // the consumers write zeros without reading Q
    const int kvh = kv_head(p.a, t.head);
    // Paged: each block's page ids are read one block ahead (the first block's before the Q slot's wait),
    // so their latency hides under the waits before the K load that uses them.
    int page = paged_loads() ? lane_page(p, t, sp.begin) : 0;
    mbar_wait(sm.bars.q_empty(qs.stage()), qs.phase() ^ 1);
    if (leader)
      load_tile(p.tmap_q, sm.q_stage(qs.stage()), sm.bars.q_full(qs.stage()), kQBytes, t.seq.q_row + t.row0, t.head,
                kPacked ? 0 : t.batch, kHalfQ);
    qs.advance();
    for (int n = sp.begin; n < sp.end; ++n) {
      mbar_wait(sm.bars.k_empty(ps.stage()), ps.phase() ^ 1);
      load_kv(p, p.tmap_k, sm.k_stage(ps.stage()), sm.bars.k_full(ps.stage()), t, page, n, kvh);
      const int next = paged_loads() && n + 1 < sp.end ? lane_page(p, t, n + 1) : 0;
      mbar_wait(sm.bars.v_empty(ps.stage()), ps.phase() ^ 1);
      load_kv(p, p.tmap_v, sm.v_stage(ps.stage()), sm.bars.v_full(ps.stage()), t, page, n, kvh);
      page = next;
      ps.advance();
    }
  }
  if (kDynamic) publish_tile(sm.bars, order, tiles, leader);  // the end marker
}

}  // namespace sm90
