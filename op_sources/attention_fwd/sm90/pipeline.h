// What the roles of the sm_90a kernel share: its compile-time configuration (variant flags, tile
// shape, register split), the shared-memory map (Q/K/V tiles, the barrier slots, the packed tile
// table), the positions in the rings, the barriers' initialisation and a consumer's release of a slot.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "sm90/schedule.h"
#include "wgmma_sm90.h"

// The kernel's compile-time configuration. In the anonymous namespace and in this order (after
// sm90/softmax.h's kEarlyExp2): the code object keeps these constants as named globals, so their
// names and their order are part of its bytes (docs/design-sm90.md, "What the code objects show").
namespace {

constexpr bool kPacked = RTC_KV != RTC_KV_DENSE;
// Tiles differ in length under a mask or across packed sequences: CTAs take them dynamically.
constexpr bool kDynamic = RTC_MASK || kPacked;
// The overlap across tiles (sm90/params.h, sm90_overlaps_tiles): a tile's first Q K^T goes out with the previous
// tile's last P V (consume_tile, sm90.cu); otherwise each tile issues its own first Q K^T.
constexpr Sm90Plan kPlan = sm90_plan(RTC_HEAD_DIM_MAX, RTC_MASK, RTC_KV);
constexpr int kQStages = sm90_q_stages(kPlan, RTC_KV);
constexpr bool kOverlapTiles = sm90_overlaps_tiles(kPlan, RTC_MASK, RTC_KV);
// Consumer warpgroups of the plan (2 or 3) and the CTA's threads.
constexpr int kConsumerWGs = kPlan.consumers;
constexpr int kThreads = sm90_threads(kPlan);
// setmaxnreg moves registers inside the CTA's launch allocation (the (kThreads, 1) bound's cap: 168 x 384,
// 128 x 512): the producer gives up what the consumers take.
// The producer's share grows with what it walks: packed rows (varlen: 24 spilled at some buckets), the page
// table (paged: 32 spilled; its consumers spilled at 224 in the 256 bucket with a window). ptxas's reports per bucket are in NOTES.
// A quantized cache's expanded rows are packed rows (sm90/expand.h): the varlen producer's share.
constexpr int kProducerRegs = RTC_KV == RTC_KV_PAGED && RTC_KV_DTYPE == RTC_KV_DTYPE_SAME ? 40 : kPacked ? 32 : 24;
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kConsumerRegs = kConsumerWGs == 2
                                  ? (RTC_KV == RTC_KV_DENSE ? 240 : 232)
                                  : ((kLaunchRegs * kThreads - 128 * kProducerRegs) / (128 * kConsumerWGs)) / 8 * 8;
static_assert(128 * kProducerRegs + 128 * kConsumerWGs * kConsumerRegs <= kLaunchRegs * kThreads,
              "more registers than launched with");

constexpr int kM = sm90_block_m(kPlan), kN = kPlan.block_n, kStages = kPlan.stages;
constexpr int kD = kPlan.head_dim;  // columns of the tiles (the bucket)
constexpr int kDBlocks = sm90_col_blocks(kPlan);  // 64-column blocks of a tile
constexpr int kDMin = sm90_min_head_dim(kD);  // the smallest call head dim of this bucket
constexpr rtc_u32 kQBytes = sm90_q_bytes(kPlan), kKVBytes = sm90_kv_bytes(kPlan);
constexpr rtc_u32 kHalfQ = kM * 128;  // bytes of one 64-column block of the Q tile
constexpr rtc_u32 kHalfKV = kN * 128;
constexpr int kConsumerWarps = 4 * kConsumerWGs;
constexpr int kPingPongThreads = 256;  // a turn's barrier: the warpgroup waiting and the one before it
// Where a block's O rescale goes (the plan's rescale_first): before its P V issue, or after the P V wait.
constexpr bool kRescaleFirst = kPlan.rescale_first != 0;
constexpr int kAccS = kN / 2;  // score accumulators per thread
constexpr int kAccO = kD / 2;  // output accumulators per thread
// The GEMMs' input type: the variant's dtype (RTC_DTYPE).
constexpr sm90::Elem kElem = RTC_DTYPE == RTC_DTYPE_FP16 ? sm90::Elem::f16 : sm90::Elem::bf16;
static_assert(kPlan.head_dim == RTC_HEAD_DIM_MAX, "the manifest's sm90 buckets are the plans' (sm90/params.h)");
static_assert(kQStages == 1 || kQStages == 2, "one Q tile, or two for the overlap across tiles");
static_assert(32 + 32 * kStages + 40 <= SM90_BAR_BYTES, "the rings' barriers must fit their slot area");

}  // namespace

namespace sm90 {

// Barrier slots (8 bytes each) after the tiles.
struct Bars {
  rtc_u32 base;
  RTC_DEVICE rtc_u32 q_full(int s) const { return base + 8 * s; }
  RTC_DEVICE rtc_u32 q_empty(int s) const { return base + 16 + 8 * s; }
  RTC_DEVICE rtc_u32 k_full(int s) const { return base + 32 + 8 * s; }
  RTC_DEVICE rtc_u32 k_empty(int s) const { return base + 32 + 8 * (kStages + s); }
  RTC_DEVICE rtc_u32 v_full(int s) const { return base + 32 + 8 * (2 * kStages + s); }
  RTC_DEVICE rtc_u32 v_empty(int s) const { return base + 32 + 8 * (3 * kStages + s); }
  // Dynamic order: the producer hands each tile's index to the consumers through a 2-slot ring.
  RTC_DEVICE rtc_u32 tile_full(int s) const { return base + 32 + 8 * (4 * kStages + s); }
  RTC_DEVICE rtc_u32 tile_empty(int s) const { return base + 32 + 8 * (4 * kStages + 2 + s); }
  RTC_DEVICE rtc_u32 tile_id(int s) const { return base + 32 + 8 * (4 * kStages + 4) + 4 * s; }
};

// The CTA's shared memory as the roles address it (laid out by the kernel entry, sm90.cu).
struct SmemTiles {
  rtc_u32 q, k, v;  // q: kQStages tiles
  Bars bars;
  Schedule sched;  // packed sequences only
  RTC_DEVICE rtc_u32 q_stage(int s) const { return q + s * kQBytes; }
  RTC_DEVICE rtc_u32 k_stage(int s) const { return k + s * kKVBytes; }
  RTC_DEVICE rtc_u32 v_stage(int s) const { return v + s * kKVBytes; }
  // The packed schedule's table (sm90/schedule.h), after the barrier slots: its shared address, and its pair count
  // read again from the table's first word (a volatile load from the CTA's base: one LDS a tile, where a value
  // held across the consumers' tile loop was spilled in the tightest variants).
  RTC_DEVICE rtc_u32 sched_table() const { return bars.base + SM90_BAR_BYTES; }
  RTC_DEVICE int sched_pairs() const { return int(ld_shared_u32(sched_table())); }
};

// Position in a ring of kDepth slots (K/V: kStages, Q: kQStages); the parity flips each time it wraps. One
// counter modulo 2 * kDepth holds both (one register where a slot and a parity took two: the consumers' tile loop
// runs at the register cap).
template <int kDepth>
struct RingState {
  rtc_u32 n = 0;
  RTC_DEVICE int stage() const { return int(n % kDepth); }
  RTC_DEVICE rtc_u32 phase() const { return (n / kDepth) & 1u; }
  RTC_DEVICE void advance() { n = n + 1 == 2 * kDepth ? 0u : n + 1; }
  // The slot before this one (what advance() left): derived, not carried, so a loop that needs both holds one.
  RTC_DEVICE RingState before() const {
    RingState r;
    r.n = n == 0 ? 2 * kDepth - 1 : n - 1;
    return r;
  }
};
using PipeState = RingState<kStages>;
using QState = RingState<kQStages>;

// The producer: one thread; paged, the whole first warp, whose lanes gather a K/V block's pages one TMA box
// each (sm90/producer.h). Functions, not constants: the constants above are part of every code object's bytes.
// K / V come through the block table only from a paged cache in q's dtype; a quantized cache's pages were expanded
// into packed rows first (sm90/expand.h).
RTC_DEVICE constexpr bool paged_loads() { return RTC_KV == RTC_KV_PAGED && RTC_KV_DTYPE == RTC_KV_DTYPE_SAME; }
RTC_DEVICE constexpr int producer_threads() { return paged_loads() ? 32 : 1; }
RTC_DEVICE int producer_lane() { return producer_threads() == 1 ? 0 : (int)(threadIdx.x % 32); }

// The consumers take turns at the tensor cores in a ring: warpgroup wg waits on its named barrier, issues
// its GEMMs and arrives on the next warpgroup's (ids 1..kConsumerWGs; 0 is __syncthreads').
RTC_DEVICE constexpr int turn_bar(int wg) { return 1 + wg % kConsumerWGs; }
// The barrier of the warpgroup after the one whose barrier is `bar` (turn_bar(wg + 1) from turn_bar(wg)).
RTC_DEVICE constexpr int next_turn_bar(int bar) { return 1 + bar % kConsumerWGs; }
// A warpgroup's turn: wait for it on its own barrier, pass it on by arriving on the next one's.
RTC_DEVICE void turn_wait(int bar) { named_sync(bar, kPingPongThreads); }
RTC_DEVICE void turn_pass(int bar) { named_arrive(bar, kPingPongThreads); }

// One arrival per consumer warp frees a ring slot (barrier counts are kConsumerWarps).
RTC_DEVICE void release(rtc_u32 bar) {
  __syncwarp();
  if (elect_one()) mbar_arrive(bar);
}

RTC_DEVICE void init_barriers(const Sm90AttnParams& p, const Bars& b) {
  for (int s = 0; s < kQStages; ++s) {
    mbar_init(b.q_full(s), 1);
    mbar_init(b.q_empty(s), kConsumerWarps);
  }
  for (int s = 0; s < kStages; ++s) {
    mbar_init(b.k_full(s), 1);
    mbar_init(b.k_empty(s), kConsumerWarps);
    mbar_init(b.v_full(s), 1);
    mbar_init(b.v_empty(s), kConsumerWarps);
  }
  for (int s = 0; s < 2; ++s) {
    mbar_init(b.tile_full(s), 1);
    mbar_init(b.tile_empty(s), kConsumerWarps);
  }
  mbar_init_fence();
  tma_prefetch_desc(&p.tmap_q);
  tma_prefetch_desc(&p.tmap_k);
  tma_prefetch_desc(&p.tmap_v);
}

}  // namespace sm90
