// The sm_90a kernel's tile scheduler: which tile a persistent CTA runs next (a static stride, or
// dynamically from a counter, handed from the producer to the consumers), and what a tile index
// means (m-block, head, batch, and its sequence). Packed sequences take the order of the table in
// sm90/schedule.h.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "sm90/pipeline.h"
#include "sm90/expand.h"
#include "score_mod.h"  // RTC_SOFTCAP
#include "dropout.h"    // RTC_DROPOUT

namespace sm90 {

// The tiles of one CTA. Unmasked: blockIdx.x, then every gridDim.x-th (all tiles are alike).
// Masked: the first tile is blockIdx.x; the producer takes each next one from the workspace's
// counter (gridDim.x + the counter's old value), and passes every index, the end marker
// (num_tiles) included, to the consumers through the tile_full/tile_empty ring.
// The tile_full / tile_empty ring of two slots (one counter: sm90/pipeline.h's RingState).
using TileOrder = RingState<2>;

// Called by every producer thread (pipeline.h: one, or the paged warp, whose lanes all get lane 0's index).
RTC_DEVICE int next_tile(const Sm90AttnParams& p, int ti) {
  if (!kDynamic) return ti + gridDim.x;
  if (producer_threads() == 1) return gridDim.x + atomicAdd(static_cast<int*>(p.a.workspace), 1);
  int next = 0;
  if (producer_lane() == 0) next = gridDim.x + atomicAdd(static_cast<int*>(p.a.workspace), 1);
  return __shfl_sync(0xffffffffu, next, 0);
}

// Every producer thread waits for the slot; the leader (the producer's lane 0) writes the index and arrives.
RTC_DEVICE void publish_tile(const Bars& b, TileOrder& o, int ti, bool leader) {
  mbar_wait(b.tile_empty(o.stage()), o.phase() ^ 1);
  if (leader) {
    st_shared_u32(b.tile_id(o.stage()), ti);
    mbar_arrive(b.tile_full(o.stage()));  // release: the consumers' wait acquires the index
  }
  o.advance();
}

RTC_DEVICE int receive_tile(const Bars& b, TileOrder& o) {
  mbar_wait(b.tile_full(o.stage()), o.phase());
  const rtc_u32 ti = ld_shared_u32(b.tile_id(o.stage()));
  release(b.tile_empty(o.stage()));
  o.advance();
  return (int)ti;
}

// The tile after `ti` in this CTA's order: the next index of the static order, or the one the producer
// hands over (dynamic order; it publishes it when it starts that tile's loads).
RTC_DEVICE int following_tile(const Sm90AttnParams& p, const SmemTiles& sm, TileOrder& order, int ti) {
  return kDynamic ? receive_tile(sm.bars, order) : ti + (int)gridDim.x;
}

// The first query row of m-block m_block. Under a mask the tiles end at the last row, not start at row 0: the rows
// of a sequence that are not a whole number of tiles make the first tile short (rows before row 0 are not
// stored), where the last one would be. Bottom-right aligned windows give the last rows the most keys: a short
// last tile of 64 rows cost as much as a whole one (every consumer warpgroup runs every block of its span), a short
// first tile sees the fewest keys. Unmasked, every tile visits every block: row 0 first.
// With dropout the masked tiles move down to the next multiple of 16 (at most 15 rows past the last, not stored; the
// first still starts at or before row 0): a thread's two rows are then one Philox block of the mask (sm90/drop.h).
RTC_DEVICE int tile_row0(const AttnParams& a, int m_block) {
  const int part = a.seq_q % kM;
  const int row0 = m_block * kM - (RTC_MASK && part != 0 ? kM - part : 0);
  return RTC_DROPOUT ? (row0 + 15) & ~15 : row0;
}

struct Tile {
  int row0;         // the tile's first query row (tile_row0: negative when masked and the sequence's rows are not a
                    // whole number of tiles)
  int head, batch;
  Seq seq;          // where the tile's sequence lives (attn_params.h)
  AttnParams view;  // the parameters as that sequence alone sees them (its own lengths)
};
// Unmasked: m-block fastest, then head, then batch: CTAs running together share one head's K/V in L2.
// Masked (bottom-right aligned windows: the last m-blocks see the most keys): the (batch, head) pairs are cut
// into sections of p.l2_heads, the remainder section first; within a section the tiles go longest first, the
// pairs alternating. The CTAs that run together then share one section's K/V in L2, and they take the tiles
// longest first, as list scheduling needs to end together. Longest first within each head in turn (the order
// before) left the last head's long tiles at the end: 7-14% past the ideal end at S 4096 in a model of the
// order, about the causal calls' loss to FA4 (NOTES, "causal: the tile order").
// Packed sequences: the schedule's order (sm90/schedule.h).
RTC_DEVICE Tile decode_tile(const Sm90AttnParams& p, const SmemTiles& sm, int t) {
  Tile r;
  int m_block;
  if (kPacked) {
    sm.sched.decode(t, p.a.heads, m_block, r.head, r.batch);
  } else {
    const int nm = p.num_m_blocks;
    int bh;
    if (RTC_MASK) {
      const int g = p.l2_heads, rem = (p.a.heads * p.a.batch) % g, first = rem * nm;  // the remainder section's tiles
      int base = 0, size = rem, u = t;
      if (t >= first) {
        const int s = (t - first) / (g * nm);
        base = rem + s * g;
        size = g;
        u = t - first - s * g * nm;
      }
      m_block = nm - 1 - u / size;
      bh = base + u % size;
    } else {
      m_block = t % nm;
      bh = t / nm;
    }
    r.head = bh % p.a.heads;
    r.batch = bh / p.a.heads;
  }
  r.seq = seq_of(p.a, r.batch);
  if (RTC_KV_DTYPE != RTC_KV_DTYPE_SAME) expanded_seq(p, r.batch, r.seq);
  r.view = seq_view(p.a, r.seq);
  r.row0 = tile_row0(r.view, m_block);
  if (RTC_KV_FP8) {  // k_descale joins the softmax scale (its sign is in the expanded K: sm90/expand.h)
    const float kd = fabsf(k_descale_of(p.a, r.batch, kv_head(p.a, r.head)));
    r.view.scale *= kd;
    r.view.scale_log2 *= kd;
    if (RTC_SOFTCAP) r.view.softcap_exp2 *= kd;  // the cap is of the dequantized score (score_mod_sm90.h)
  }
  return r;
}

// Tiles of this launch: the schedule's count when packed (the host's num_tiles is then a bound).
RTC_DEVICE int tile_count(const Sm90AttnParams& p, const SmemTiles& sm) {
  return kPacked ? sm.sched_pairs() * p.a.heads : p.num_tiles;
}

}  // namespace sm90
