// The sm_90a kernel's consumer mainloop: the two GEMMs of a K/V block (S = Q K^T from shared memory,
// O += P V with P from registers) and the online-softmax iteration between them, as the first block,
// the steady-state block and the pieces of the last block that sm90.cu's consume_tile puts together.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "wgmma_sm90.h"
#include "sm90/pipeline.h"
#include "sm90/scheduler.h"
#include "sm90/mask.h"
#include "sm90/softmax.h"
#include "sm90/drop.h"

namespace sm90 {

// S = Q K^T over the bucket's kD columns: kD / 16 k-steps of 16; each step moves 32 bytes inside the
// 128-byte rows and jumps to the next 64-column block after 4 steps.
RTC_DEVICE void issue_qk(float (&s)[kAccS], rtc_u32 q_rows, rtc_u32 k_tile) {
  wgmma_fence();
  const rtc_u64 da0 = smem_desc(q_rows, 16, 1024), db0 = smem_desc(k_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const rtc_u32 off = (kk & 3) * 32;
    WgmmaSS<kN, kElem>::k16(s, desc_at(da0, (kk >> 2) * kHalfQ + off), desc_at(db0, (kk >> 2) * kHalfKV + off), kk > 0);
  }
  wgmma_commit();
}

// O += P V: k-steps of 16 kv rows (2048 bytes of each 64-column block of the V tile), P from registers,
// N = kD. V is read "MN-major" (head dim contiguous): LBO steps between the 64-column blocks, SBO between
// groups of 8 kv rows (the canonical SW128 MN-major layout).
RTC_DEVICE void issue_pv(float (&o)[kAccO], const rtc_u32 (&pk)[kN / 4], rtc_u32 v_tile) {
  wgmma_fence();
  const rtc_u64 db0 = smem_desc(v_tile, kHalfKV, 1024);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
    WgmmaRS<kD, kElem>::k16(o, pk[4 * kk], pk[4 * kk + 1], pk[4 * kk + 2], pk[4 * kk + 3], desc_at(db0, kk * 2048), 1);
  wgmma_commit();
}

// Registers of one consumer warpgroup: scores, output, packed P, row state.
struct ConsumerRegs {
  float s[kAccS];
  float o[kAccO];
  rtc_u32 pk[kN / 4];
  RowState st;
};

// S_n = Q K^T finished: free K_n (and Q after the last block), modify its scores (RTC_SCORE_MOD), mask it where
// block n is cut by the window (RTC_MASK) or is the partial last block, then softmax in place (with dropout,
// drop_packed zeroes the dropped ones once packed; the kept ones' 1 / (1 - p) is O's, in the epilogue).
template <class Mid = NoMid>
RTC_DEVICE void scores_done(const SmemTiles& sm, ConsumerRegs& r, const PipeState& ps, int q_slot, bool last,
                            int last_valid, float c, const AttnParams& a, const WindowMask& wm, const TileMods& md,
                            int n, const Mid& mid = Mid()) {
  fence_regs(r.s);
  release(sm.bars.k_empty(ps.stage()));
  if (last) release(sm.bars.q_empty(q_slot));
  if constexpr (RTC_SCORE_MOD != 0) modify_scores(r.s, md, n * kN, a);
  if (RTC_MASK) {
    if (wm.cuts(n)) mask_window(r.s, wm.rows, n * kN);
  } else if (last && last_valid < kN) {
    mask_cols(r.s, last_valid);
  }
  online_softmax(r.s, r.st, c, mid);
}

// What one consumer warpgroup carries from block to block of a tile.
struct TileLoop {
  const SmemTiles& sm;
  int q_slot;        // the Q ring slot of this tile
  rtc_u32 q_rows;    // this warpgroup's 64 rows of the Q tile
  PipeState& ps;     // the K/V ring slot of the next block; the block whose P V is next sits in ps.before()
  int own_bar;       // this warpgroup's turn barrier; the next one's is derived (next_bar), not held
  int n_blocks, last_valid;
  float c;           // the softmax's scale (softmax_scale_log2)
  int never;         // 0 at run time, from a field ptxas cannot evaluate: pins the P V wait (wgmma_wait_pinned)
  WindowMask wm;     // read only when RTC_MASK
  TileMods md;       // the score modifications (empty when plain)
#if RTC_DROPOUT
  TileDrop dr;       // dropout's state (set after the rest: consume_tile)
#endif
  RTC_DEVICE int next_bar() const { return next_turn_bar(own_bar); }
};

// Steady-state block n: [sync own] issue S_n = Q K_n^T and O += P_{n-1} V_{n-1} [arrive other];
// wait S_n -> softmax(S_n): the row max and the first exponentials run under PV_{n-1} (and the other
// warpgroup's GEMMs), then the pinned wait for PV_{n-1}; the O rescale and the packing of P_n
// interleave with the remaining exponentials (online_softmax). Straight-line code (no role flags
// around the waits) so ptxas can prove no accumulator is read while its wgmma is in flight.
RTC_DEVICE void steady_block(TileLoop& L, ConsumerRegs& r, const AttnParams& a, int n, bool last) {
  const SmemTiles& sm = L.sm;
  const PipeState pv = L.ps.before();
  mbar_wait(sm.bars.k_full(L.ps.stage()), L.ps.phase());
  turn_wait(L.own_bar);
  issue_qk(r.s, L.q_rows, sm.k_stage(L.ps.stage()));
  if (kRescaleFirst) rescale_rows(r.o, r.st);
  mbar_wait(sm.bars.v_full(pv.stage()), pv.phase());
  issue_pv(r.o, r.pk, sm.v_stage(pv.stage()));
  turn_pass(L.next_bar());
  wgmma_wait<1>();
  const int never = L.never;
  scores_done(sm, r, L.ps, L.q_slot, last, L.last_valid, L.c, a, L.wm, L.md, n,
              [never] { wgmma_wait_pinned<0>(never); });
  fence_regs(r.o);
  fence_regs(r.pk);  // keeps P_{n-1}'s registers apart from P_n's until its GEMM is done
  release(sm.bars.v_empty(pv.stage()));
  if (!kRescaleFirst) rescale_rows(r.o, r.st);
  pack_p(r.s, r.pk);
#if RTC_DROPOUT
  drop_packed(r.pk, L.dr, n * kN, a);
#endif
  L.ps.advance();
}

// Packed sequences: the V rows of a partial last block past the sequence's keys hold another
// sequence's values (or a page's stale rows). Their weights are 0, but 0 * Inf or NaN is NaN in the
// GEMM: zero them, in every 64-column block, before this warpgroup's P V. Every warpgroup does it (each before its
// own GEMM; the later ones write zeros over zeros), so none waits for another.
RTC_DEVICE void zero_rows_past(rtc_u32 v_tile, int valid) {
  const int tid = threadIdx.x % 128;
  const rtc_u32 from = valid * 128, bytes = (kN - valid) * 128;  // per 64-column block
  for (rtc_u32 off = tid * 16; off < kDBlocks * bytes; off += 128 * 16) {
    const rtc_u32 blk = off / bytes;
    st_shared_v4_splat(v_tile + blk * kHalfKV + from + (off - blk * bytes), 0u);
  }
  fence_proxy_async_smem();         // the generic-proxy stores, before wgmma's async-proxy reads
  // every warp of the warpgroup has stored (ids past the turn ring's; the consumer warpgroup's index read again)
  named_sync(kConsumerWGs + warp_uniform(tid_x_here() / 128), 128);
}

// What a consumer warpgroup needs of a tile: its K/V span and where its rows sit.
struct TilePlan {
  KvSpan sp;
  int n_blocks;
  RTC_DEVICE static TilePlan of(const Tile& t) {
    TilePlan r;
    r.sp = tile_span(t.view, t.row0);
    r.n_blocks = r.sp.end - r.sp.begin;
    return r;
  }
};

// S_0 = Q K_0^T of a tile, issued on its own ([sync own] QK [arrive other]) or, across tiles, together
// with the previous tile's last P V (kOverlapTiles, consume_tile in sm90.cu).
RTC_DEVICE void wait_first_qk(const SmemTiles& sm, const PipeState& ps, const QState& qs) {
  mbar_wait(sm.bars.q_full(qs.stage()), qs.phase());
  mbar_wait(sm.bars.k_full(ps.stage()), ps.phase());
}
RTC_DEVICE void issue_first_qk(const SmemTiles& sm, ConsumerRegs& r, const PipeState& ps, const QState& qs, int wg) {
  issue_qk(r.s, sm.q_stage(qs.stage()) + wg * 64 * 128, sm.k_stage(ps.stage()));
}

}  // namespace sm90
