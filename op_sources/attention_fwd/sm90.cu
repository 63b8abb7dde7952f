// Fast bf16 attention forward for sm_90a (H100/H200): a TMA producer warpgroup feeds a K/V ring in
// shared memory; two or three consumer warpgroups (the bucket's plan) take turns at wgmma, P stays in
// registers; persistent.
// Dense calls keep two Q tiles: a tile's first Q K^T goes out with the previous tile's last P V, and
// the previous tile's epilogue runs under it.
// With RTC_MASK (a causal or sliding window) a tile visits only the K/V blocks its rows' windows
// reach; blocks cut by the window edge are masked, blocks fully inside run the unmasked path, and
// tiles are taken longest-first. Query head h reads K/V head kv_head(h) (GQA/MQA).
// Score modifications (RTC_SCORE_MOD: the soft cap, ALiBi) go on each block's scores before its mask
// (sm90/mask.h, csrc_common/score_mod_sm90.h); the softmax then takes them at scale 1 where they are t.
// Dropout (RTC_DROPOUT) zeroes each block's dropped probabilities once packed, before P V, and O takes 1 / (1 - p)
// with 1 / l (sm90/drop.h).
// Packed sequences (RTC_KV): Q/O rows and (varlen) K/V rows sit at each sequence's offset in the
// packed tensors; paged K/V come page by page through the block table (TMA boxes of
// gcd(page_size, 128) rows); the tiles are handed out from a table every CTA builds (sm90/schedule.h).
// The alternatives measured for this kernel, and why they lost, are described in docs/NOTES.md.
//
// This file is the kernel's top level: the warpgroup roles, the consumers' tile loop and one tile's
// three phases. The roles' pieces are in sm90/: pipeline.h (shared memory, rings, barriers),
// scheduler.h (tile order), mask.h, producer.h (TMA loads), mainloop.h (GEMMs and the softmax
// iteration; the softmax itself in softmax.h), epilogue.h (O and LSE stores) and, for a quantized K / V
// cache, expand.h (its rows expanded into the workspace by a first launch).
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "wgmma_sm90.h"
#include "sm90/softmax.h"  // before pipeline.h: the order of the constants in the code object (pipeline.h)
#include "sm90/pipeline.h"
#include "sm90/scheduler.h"
#include "sm90/mask.h"
#include "sm90/producer.h"
#include "sm90/mainloop.h"
#include "sm90/epilogue.h"

namespace {
using namespace sm90;

// One tile of one consumer warpgroup. With `pending`, the tile's S_0 is already in flight (issued by the
// previous tile's last block). The last P V of a tile goes out in one issue with the next tile's S_0 when
// that tile has keys: the epilogue (O scaled and stored) then runs under that GEMM, and the tensor cores
// need not wait for the store, the Q load or a separate first issue. With two Q slots the next Q is loaded
// already; with one (sm90_overlaps_tiles) the warpgroups freed it at their last Q K^T and the P V waits for the load.
// Returns the next tile's index; `pending` tells whether its S_0 was issued.
RTC_DEVICE int consume_tile(const Sm90AttnParams& p, const SmemTiles& sm, const Tile& t, int ti, int wg, PipeState& ps,
                            QState& qs, ConsumerRegs& r, bool& pending, TileOrder& order) {
  const AttnParams& a = t.view;
  const TilePlan plan = TilePlan::of(t);
  const KvSpan& sp = plan.sp;
  const int n0 = sp.begin, n_blocks = plan.n_blocks;
  const int last_valid = a.seq_k - (sp.end - 1) * kN;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const WindowMask wm{KeyWindow::of(a, (rtc_i64)t.row0 + wg * 64 + warp * 16 + lane / 4), sp.full_begin, sp.full_end};
  TileLoop L{sm,
             qs.stage(),
             sm.q_stage(qs.stage()) + wg * 64 * 128,  // the warpgroup's rows of block 0
             ps,
             turn_bar(wg),
             n_blocks,
             last_valid,
             softmax_scale_log2(a),
             p.a.seq_k < 0,
             wm,
             TileMods::of(p.a, a, t.batch, t.head, t.row0)};
#if RTC_DROPOUT
  L.dr = TileDrop::of(p.a, t.batch, t.head, t.row0 + wg * 64 + warp * 16 + lane / 4);  // the thread's rows
#endif
  r.st.init();
#pragma unroll
  for (int i = 0; i < kAccO; ++i) r.o[i] = 0.f;
  if ((RTC_MASK || kPacked) && n_blocks == 0) {  // no row sees a key: zeros, LSE -inf, nothing read
    store_empty_tile(p, t, wg);
    pending = false;
    return following_tile(p, sm, order, ti);
  }

  // 1. first block: scores only.
  if (!pending) {
    wait_first_qk(sm, ps, qs);
    turn_wait(L.own_bar);
    issue_first_qk(sm, r, ps, qs, wg);
    turn_pass(L.next_bar());
    wgmma_wait<0>();
  }
  qs.advance();
  scores_done(sm, r, ps, L.q_slot, n_blocks == 1, L.last_valid, L.c, a, L.wm, L.md, n0);
  pack_p(r.s, r.pk);
#if RTC_DROPOUT
  drop_packed(r.pk, L.dr, n0 * kN, a);
#endif
  ps.advance();
  // 2. steady state.
  for (int n = 1; n < n_blocks; ++n) steady_block(L, r, a, n0 + n, n == n_blocks - 1);
  // 3. last block: P V, and the next tile's S_0 when it has keys.
  const int next = following_tile(p, sm, order, ti);
  pending = false;
  if (kOverlapTiles && next < tile_count(p, sm))
    pending = !(RTC_MASK || kPacked) || TilePlan::of(decode_tile(p, sm, next)).n_blocks > 0;
  const PipeState pv = ps.before();  // the last block's slot
  if (kRescaleFirst) rescale_rows(r.o, r.st);
  mbar_wait(sm.bars.v_full(pv.stage()), pv.phase());
  if (kPacked && last_valid < kN) zero_rows_past(sm.v_stage(pv.stage()), last_valid);
  // Two straight-line paths: ptxas must see every wait after the issues it covers.
  if (pending) {
    wait_first_qk(sm, ps, qs);
    turn_wait(L.own_bar);
    issue_pv(r.o, r.pk, sm.v_stage(pv.stage()));
    issue_first_qk(sm, r, ps, qs, wg);
    turn_pass(L.next_bar());
    wgmma_wait<1>();
    fence_regs(r.o);
    release(sm.bars.v_empty(pv.stage()));
    store_tile(p, t, wg, r.o, r.st, wm.rows);
    wgmma_wait<0>();  // nothing in flight across tiles: ptxas would serialize the pipeline
    fence_regs(r.s);
  } else {
    turn_wait(L.own_bar);
    issue_pv(r.o, r.pk, sm.v_stage(pv.stage()));
    turn_pass(L.next_bar());
    wgmma_wait<0>();
    fence_regs(r.o);
    release(sm.bars.v_empty(pv.stage()));
    store_tile(p, t, wg, r.o, r.st, wm.rows);
  }
  return next;
}

// The consumers' tile loop, per warpgroup (wg 0 .. kConsumerWGs - 1): the CTA's tiles in the order the producer
// loads them, each through consume_tile.
RTC_DEVICE void consume(const Sm90AttnParams& p, const SmemTiles& sm, int wg) {
  PipeState ps;
  QState qs;
  TileOrder order;
  ConsumerRegs carried;  // across tiles only when a tile's S_0 is issued by the previous tile
  bool pending = false;
  // Warpgroup 0 issues first: the last warpgroup pre-arrives on its barrier.
  if (wg == kConsumerWGs - 1) turn_pass(turn_bar(0));
  for (int ti = kDynamic ? receive_tile(sm.bars, order) : (int)blockIdx.x; ti < tile_count(p, sm);) {
    ConsumerRegs fresh;  // otherwise nothing lives from one tile to the next (fewer live registers)
    ti = consume_tile(p, sm, decode_tile(p, sm, ti), ti, wg, ps, qs, kOverlapTiles ? carried : fresh, pending, order);
  }
  // Balance the pre-arrival so the barrier is idle when the block exits.
  if (wg == 0) turn_wait(turn_bar(0));
}

}  // namespace

// Shared memory: Q ring, K ring, V ring, barrier slots, then (packed) the tile table. Warpgroup 0
// produces (one thread issues every load; paged, one warp), the others consume; setmaxnreg moves registers
// from the first to the others (kProducerRegs, kConsumerRegs: sm90/pipeline.h).
// The (threads, 1) bound gives the register cap at entry that setmaxnreg needs.
// A quantized K / V cache takes two launches: the expansion of its rows into the workspace (sm90/expand.h), then this.
extern "C" __global__ void __launch_bounds__(kThreads, 1) attention_fwd_sm90(const __grid_constant__ Sm90AttnParams p) {
  if (RTC_KV_DTYPE != RTC_KV_DTYPE_SAME && p.stage == SM90_STAGE_EXPAND) {
    expand_stage(p);
    return;
  }
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const rtc_u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  SmemTiles sm;
  sm.q = base;
  sm.k = sm.q + kQStages * kQBytes;
  sm.v = sm.k + kStages * kKVBytes;
  sm.bars.base = sm.v + kStages * kKVBytes;
  if (threadIdx.x == 0) init_barriers(p, sm.bars);
  if (kPacked)  // after the barrier slots; its own __syncthreads also publishes the barriers' init
    sm.sched = build_schedule(p.a, p.num_m_blocks,
                              reinterpret_cast<int*>(smem_raw + (sm.sched_table() - smem_addr(smem_raw))), kM);
  __syncthreads();
  const int wg = warp_uniform(threadIdx.x / 128);
  if (wg == 0) {
    regs_shrink<kProducerRegs>();
    if (threadIdx.x < producer_threads()) produce(p, sm);
  } else {
    regs_grow<kConsumerRegs>();
    consume(p, sm, wg - 1);
  }
}
