// Fast bf16 attention forward for sm_90a (H100/H200): a TMA producer warpgroup feeds a K/V ring in
// shared memory; two consumer warpgroups run wgmma in ping-pong, P stays in registers; persistent.
// Dense calls keep two Q tiles: a tile's first Q K^T goes out with the previous tile's last P V, and
// the previous tile's epilogue runs under it.
// With RTC_MASK (a causal or sliding window) a tile visits only the K/V blocks its rows' windows
// reach; blocks cut by the window edge are masked, blocks fully inside run the unmasked path, and
// tiles are taken longest-first. Query head h reads K/V head kv_head(h) (GQA/MQA).
// Packed sequences (RTC_KV): Q/O rows and (varlen) K/V rows sit at each sequence's offset in the
// packed tensors; paged K/V come page by page through the block table (TMA boxes of
// gcd(page_size, 128) rows); the tiles are handed out from a table every CTA builds (sm90/schedule.h).
// The alternatives measured for this kernel, and why they lost, are described in docs/NOTES.md.
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "wgmma_sm90.h"
#include "sm90/softmax.h"
#include "sm90/schedule.h"

namespace {
using namespace sm90;

constexpr bool kPacked = RTC_KV != RTC_KV_DENSE;
// Tiles differ in length under a mask or across packed sequences: CTAs take them dynamically.
constexpr bool kDynamic = RTC_MASK || kPacked;
// Two Q tiles (sm90/params.h): a tile's first Q K^T goes out with the previous tile's last P V
// (consume_tile). With one, each tile issues its own first Q K^T.
constexpr int kQStages = SM90_Q_STAGES(RTC_KV);
constexpr bool kOverlapTiles = kQStages == 2;
// setmaxnreg moves registers inside the CTA's launch allocation (168 x 384): the producer gives up
// what the consumers take.
constexpr int kProducerRegs = RTC_KV == RTC_KV_PAGED ? 40 : 24;  // paged: the page walk (ptxas: 32 spills)
constexpr int kConsumerRegs = RTC_KV == RTC_KV_PAGED ? 224 : 240;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * SM90_THREADS, "more registers than launched with");

constexpr int kM = SM90_BLOCK_M, kN = SM90_BLOCK_N, kStages = SM90_STAGES;
constexpr rtc_u32 kHalfQ = kM * 128;    // bytes of one 64-column half of the Q tile
constexpr rtc_u32 kHalfKV = kN * 128;
constexpr int kConsumerWarps = 8;
constexpr int kPingPongThreads = 256;
constexpr int kAccS = kN / 2;         // score accumulators per thread
static_assert(kN == 128 || kN == 176, "BLOCK_N must be 128 or 176 (the SS wgmma wrappers)");
static_assert(SM90_HEAD_DIM == 128, "head dim 128 only");
static_assert(RTC_DTYPE == RTC_DTYPE_BF16, "bf16 only (RTC_DTYPE=0): the manifest sends fp16 calls to the baseline");
static_assert(kQStages == 1 || kQStages == 2, "one Q tile, or two for the overlap across tiles");
static_assert(32 + 32 * kStages + 40 + 8 * (kN / 16) <= SM90_BAR_BYTES, "the rings' barriers must fit their slot area");

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
  // Paged: the page ids of a block (the producer's own scratch, kN / 16 of them), two sets: the
  // block being loaded and the next one.
  RTC_DEVICE rtc_u32 pages(int set) const { return base + 32 + 8 * (4 * kStages + 4) + 8 + set * 4 * (kN / 16); }
};

// The tiles of one CTA. Unmasked: blockIdx.x, then every gridDim.x-th (all tiles are alike).
// Masked: the first tile is blockIdx.x; the producer takes each next one from the workspace's
// counter (gridDim.x + the counter's old value), and passes every index, the end marker
// (num_tiles) included, to the consumers through the tile_full/tile_empty ring.
struct TileOrder {
  int slot = 0;
  rtc_u32 phase = 0;
  RTC_DEVICE void advance() {
    if (++slot == 2) {
      slot = 0;
      phase ^= 1;
    }
  }
};

RTC_DEVICE int next_tile(const Sm90AttnParams& p, int ti) {
  if (!kDynamic) return ti + gridDim.x;
  return gridDim.x + atomicAdd(static_cast<int*>(p.a.workspace), 1);
}

RTC_DEVICE void publish_tile(const Bars& b, TileOrder& o, int ti) {
  mbar_wait(b.tile_empty(o.slot), o.phase ^ 1);
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(b.tile_id(o.slot)), "r"(ti) : "memory");
  mbar_arrive(b.tile_full(o.slot));  // release: the consumers' wait acquires the index
  o.advance();
}

RTC_DEVICE void release(rtc_u32 bar);

RTC_DEVICE int receive_tile(const Bars& b, TileOrder& o) {
  mbar_wait(b.tile_full(o.slot), o.phase);
  rtc_u32 ti;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(ti) : "r"(b.tile_id(o.slot)) : "memory");
  release(b.tile_empty(o.slot));
  o.advance();
  return (int)ti;
}

struct SmemTiles {
  rtc_u32 q, k, v;  // q: kQStages tiles
  Bars bars;
  Schedule sched;  // packed sequences only
  RTC_DEVICE rtc_u32 q_stage(int s) const { return q + s * SM90_Q_BYTES; }
  RTC_DEVICE rtc_u32 k_stage(int s) const { return k + s * SM90_KV_BYTES; }
  RTC_DEVICE rtc_u32 v_stage(int s) const { return v + s * SM90_KV_BYTES; }
};

struct Tile {
  int m_block, head, batch;
  Seq seq;          // where the tile's sequence lives (attn_params.h)
  AttnParams view;  // the parameters as that sequence alone sees them (its own lengths)
};
// m-block fastest, then head, then batch: CTAs running together share one head's K/V in L2. Under
// a mask the last m-blocks see the most keys (bottom-right alignment): they go first, so the
// persistent CTAs end together (longest processing time first).
// Packed sequences: the schedule's order (sm90/schedule.h).
RTC_DEVICE Tile decode_tile(const Sm90AttnParams& p, const SmemTiles& sm, int t) {
  Tile r;
  if (kPacked) {
    sm.sched.decode(t, p.a.heads, r.m_block, r.head, r.batch);
  } else {
    r.m_block = t % p.num_m_blocks;
    if (RTC_MASK) r.m_block = p.num_m_blocks - 1 - r.m_block;
    const int bh = t / p.num_m_blocks;
    r.head = bh % p.a.heads;
    r.batch = bh / p.a.heads;
  }
  r.seq = seq_of(p.a, r.batch);
  r.view = seq_view(p.a, r.seq);
  return r;
}

// Tiles of this launch: the schedule's count when packed (the host's num_tiles is then a bound).
RTC_DEVICE int tile_count(const Sm90AttnParams& p, const SmemTiles& sm) {
  return kPacked ? sm.sched.pairs * p.a.heads : p.num_tiles;
}

// The K/V blocks of one tile (kv_span, attn_params.h): [begin, end) are visited; blocks outside
// [full_begin, full_end) are cut by a row's window (or by the end of the keys) and get the
// per-element mask. Unmasked, every block is visited and only a partial last block is masked.
RTC_DEVICE KvSpan tile_span(const AttnParams& a, int m_block) {
  const rtc_i64 r0 = (rtc_i64)m_block * kM;
  return kv_span(a, r0, (r0 + kM < a.seq_q ? r0 + kM : a.seq_q) - r0, kN, RTC_MASK);
}

// Position in a ring of kDepth slots (K/V: kStages, Q: kQStages); the parity flips each time it wraps.
template <int kDepth>
struct RingState {
  int stage = 0;
  rtc_u32 phase = 0;
  RTC_DEVICE void advance() {
    if (++stage == kDepth) {
      stage = 0;
      phase ^= 1;
    }
  }
};
using PipeState = RingState<kStages>;
using QState = RingState<kQStages>;

// ---------------------------------------------------------------- producer (one thread)
RTC_DEVICE void load_tile(const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, rtc_u32 bytes, int row, int head,
                          int batch, rtc_u32 half_bytes) {
  mbar_expect_tx(bar, bytes);
  tma_load_4d(dst, &map, bar, 0, row, head, batch);
  tma_load_4d(dst + half_bytes, &map, bar, SM90_BOX_D, row, head, batch);
}

// Paged: the pages of K/V block n of a tile, one per TMA box of min(page_size, kN) rows (at most
// kN / 16 boxes; page sizes are powers of two). The producer copies the block-table entries into
// shared memory with cp.async, all at once and before it waits for a free slot, so their latency
// hides under that wait, and K and V share them. A row past the sequence's keys or an out-of-range
// id gets page coordinate num_pages: TMA reads nothing there and fills zeros (still counting the
// bytes), so no id can reach outside the pool.
RTC_DEVICE void fetch_pages(const Sm90AttnParams& p, const Tile& t, int n, rtc_u32 slots) {
  const AttnParams& a = p.a;
  const int first = n * kN, boxes = kN / p.kv_box;
  const int* entry = a.block_table + (rtc_i64)t.batch * a.table_stride + (first >> p.page_shift);
  for (int i = 0; i < boxes; ++i) {
    if (first + i * p.kv_box < t.seq.len_k)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(slots + 4 * i), "l"(entry + i) : "memory");
    else
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(slots + 4 * i), "r"(a.num_pages) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

RTC_DEVICE void load_paged(const Sm90AttnParams& p, const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, rtc_u32 slots,
                           int n, int kvh) {
  const int boxes = kN / p.kv_box, row = (n * kN) & ((1 << p.page_shift) - 1);  // boxes start pages unless page > kN
  mbar_expect_tx(bar, SM90_KV_BYTES);
  for (int i = 0; i < boxes; ++i) {
    int page;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(page) : "r"(slots + 4 * i) : "memory");
    if ((unsigned)page >= (unsigned)p.a.num_pages) page = p.a.num_pages;
    const rtc_u32 at = dst + i * p.kv_box * 128;
    tma_load_4d(at, &map, bar, 0, row, kvh, page);
    tma_load_4d(at + kHalfKV, &map, bar, SM90_BOX_D, row, kvh, page);
  }
}

RTC_DEVICE void load_kv(const Sm90AttnParams& p, const Sm90TensorMap& map, rtc_u32 dst, rtc_u32 bar, const Tile& t,
                        rtc_u32 slots, int n, int kvh) {
  if (RTC_KV == RTC_KV_PAGED)
    load_paged(p, map, dst, bar, slots, n, kvh);
  else  // packed rows: batch coordinate 0, the sequence's rows from k_row
    load_tile(map, dst, bar, SM90_KV_BYTES, t.seq.k_row + n * kN, kvh, kPacked ? 0 : t.batch, kHalfKV);
}

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
    load_tile(p.tmap_q, sm.q_stage(qs.stage), sm.bars.q_full(qs.stage), SM90_Q_BYTES, t.seq.q_row + t.m_block * kM,
              t.head, kPacked ? 0 : t.batch, kHalfQ);
    qs.advance();
    // Paged: block n's table entries were fetched one block ahead (into the slot set of n's parity),
    // so their latency hides under the previous block's waits.
    if (RTC_KV == RTC_KV_PAGED) fetch_pages(p, t, sp.begin, sm.bars.pages(0));
    for (int n = sp.begin; n < sp.end; ++n) {
      const rtc_u32 pages = sm.bars.pages((n - sp.begin) & 1);
      mbar_wait(sm.bars.k_empty(ps.stage), ps.phase ^ 1);
      if (RTC_KV == RTC_KV_PAGED) asm volatile("cp.async.wait_all;" ::: "memory");
      load_kv(p, p.tmap_k, sm.k_stage(ps.stage), sm.bars.k_full(ps.stage), t, pages, n, kvh);
      if (RTC_KV == RTC_KV_PAGED && n + 1 < sp.end) fetch_pages(p, t, n + 1, sm.bars.pages((n + 1 - sp.begin) & 1));
      mbar_wait(sm.bars.v_empty(ps.stage), ps.phase ^ 1);
      load_kv(p, p.tmap_v, sm.v_stage(ps.stage), sm.bars.v_full(ps.stage), t, pages, n, kvh);
      ps.advance();
    }
  }
  if (kDynamic) publish_tile(sm.bars, order, tiles);  // the end marker
}

// ---------------------------------------------------------------- consumer GEMMs
// S = Q K^T over d = 128: 8 k-steps of 16; each step moves 32 bytes inside the 128-byte rows
// and jumps to the second column half after 4 steps.
RTC_DEVICE void issue_qk(float (&s)[kAccS], rtc_u32 q_rows, rtc_u32 k_tile) {
  wgmma_fence();
  const rtc_u64 da0 = smem_desc(q_rows, 16, 1024), db0 = smem_desc(k_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const rtc_u32 off = (kk & 3) * 32;
    WgmmaSS<kN>::k16(s, desc_at(da0, (kk >> 2) * kHalfQ + off), desc_at(db0, (kk >> 2) * kHalfKV + off), kk > 0);
  }
  wgmma_commit();
}

// O += P V: k-steps of 16 kv rows (2048 bytes of the V tile each), P from registers. V is read
// "MN-major" (head dim contiguous): LBO steps between the two 64-column halves, SBO between groups
// of 8 kv rows (CUTLASS's canonical SW128 MN-major layout).
RTC_DEVICE void issue_pv(float (&o)[64], const rtc_u32 (&pk)[kN / 4], rtc_u32 v_tile) {
  wgmma_fence();
  const rtc_u64 db0 = smem_desc(v_tile, kHalfKV, 1024);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
    wgmma_rs_k16_tb(o, pk[4 * kk], pk[4 * kk + 1], pk[4 * kk + 2], pk[4 * kk + 3], desc_at(db0, kk * 2048), 1);
  wgmma_commit();
}

// One arrival per consumer warp frees a ring slot (barrier counts are kConsumerWarps).
RTC_DEVICE void release(rtc_u32 bar) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) mbar_arrive(bar);
}

// ---------------------------------------------------------------- consumer epilogue
// keys: this thread's two rows' key windows, read under RTC_MASK (unmasked, a row sees a key iff its
// sequence has one).
RTC_DEVICE void store_tile(const Sm90AttnParams& p, const Tile& t, int wg, float (&o)[64], RowState& st,
                           const KeyWindow& keys) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const AttnParams& a = p.a;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = st.l[i];
    l += shfl_xor(l, 1);
    l += shfl_xor(l, 2);
    l = final_row_sum(l, st.m[i], a.scale_log2);
    // l == 0: every score the row saw was -inf; it writes ZeroSumRow's row: 0 and LSE -inf when it sees
    // no key (even where O holds 0 * NaN from a V NaN under a zero weight), NaN when it sees keys.
    // A NaN l keeps the row NaN.
    const bool empty = l == 0.f;
    const float inv = empty ? 0.f : 1.f / l;
    const ZeroSumRow blank = ZeroSumRow::of(RTC_MASK ? keys.sees_a_key(i) : !kPacked || t.view.seq_k > 0);
    const int row = t.m_block * kM + wg * 64 + warp * 16 + lane / 4 + 8 * i;
    if (row >= t.view.seq_q) continue;
    rtc_bf16_t* dst = a.o + t.seq.o_off + (rtc_i64)row * a.o_ss + (rtc_i64)t.head * a.o_sh + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<rtc_u32*>(dst + 8 * j) =
          empty ? blank.o : rtc_f32x2_to_bf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    if (a.lse != nullptr && lane % 4 == 0)
      a.lse[t.seq.lse_off + (rtc_i64)t.head * t.seq.lse_head_stride + row] =
          empty ? blank.lse : st.m[i] * a.scale + logf(l);
  }
}

// ---------------------------------------------------------------- consumer main loop
// Registers of one consumer warpgroup: scores, output, packed P, row state.
struct ConsumerRegs {
  float s[kAccS];
  float o[64];
  rtc_u32 pk[kN / 4];
  RowState st;
};

// Where this warpgroup's window mask applies: the rows' key ranges and whether block n is cut.
struct WindowMask {
  KeyWindow rows;   // the keys of this thread's two rows
  int full_begin, full_end;
  RTC_DEVICE bool cuts(int n) const { return n < full_begin || n >= full_end; }
};

// S_n = Q K^T finished: free K_n (and Q after the last block), mask it where block n is cut by the
// window (RTC_MASK) or is the partial last block, then softmax in place.
template <class Mid = NoMid>
RTC_DEVICE void scores_done(const SmemTiles& sm, ConsumerRegs& r, const PipeState& ps, int q_slot, bool last,
                            int last_valid, float c, const AttnParams& a, const WindowMask& wm, int n,
                            const Mid& mid = Mid()) {
  fence_regs(r.s);
  release(sm.bars.k_empty(ps.stage));
  if (last) release(sm.bars.q_empty(q_slot));
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
  PipeState& ps;     // the K/V ring slot of the next block
  PipeState pv;      // the slot of the block whose P V is next
  int own_bar, other_bar, n_blocks, last_valid;
  float c;
  int never;         // 0 at run time, from a field ptxas cannot evaluate: pins the P V wait (wgmma_wait_pinned)
  WindowMask wm;     // read only when RTC_MASK
};

// Steady-state block n: [sync own] issue S_n = Q K_n^T and O += P_{n-1} V_{n-1} [arrive other];
// wait S_n -> softmax(S_n): the row max and the first exponentials run under PV_{n-1} (and the other
// warpgroup's GEMMs), then the pinned wait for PV_{n-1}; the O rescale and the packing of P_n
// interleave with the remaining exponentials (online_softmax). Straight-line code (no role flags
// around the waits) so ptxas can prove no accumulator is read while its wgmma is in flight.
RTC_DEVICE void steady_block(TileLoop& L, ConsumerRegs& r, const AttnParams& a, int n, bool last) {
  const SmemTiles& sm = L.sm;
  mbar_wait(sm.bars.k_full(L.ps.stage), L.ps.phase);
  named_sync(L.own_bar, kPingPongThreads);
  issue_qk(r.s, L.q_rows, sm.k_stage(L.ps.stage));
  mbar_wait(sm.bars.v_full(L.pv.stage), L.pv.phase);
  issue_pv(r.o, r.pk, sm.v_stage(L.pv.stage));
  named_arrive(L.other_bar, kPingPongThreads);
  wgmma_wait<1>();
  const int never = L.never;
  scores_done(sm, r, L.ps, L.q_slot, last, L.last_valid, L.c, a, L.wm, n, [never] { wgmma_wait_pinned<0>(never); });
  fence_regs(r.o);
  fence_regs(r.pk);  // keeps P_{n-1}'s registers apart from P_n's until its GEMM is done
  release(sm.bars.v_empty(L.pv.stage));
  rescale_rows(r.o, r.st);
  pack_p(r.s, r.pk);
  L.pv = L.ps;
  L.ps.advance();
}

// Packed sequences: the V rows of a partial last block past the sequence's keys hold another
// sequence's values (or a page's stale rows). Their weights are 0, but 0 * Inf or NaN is NaN in the
// GEMM: zero them, both halves, before this warpgroup's P V. Both warpgroups do it (each before its
// own GEMM; the second writes zeros over zeros), so neither waits for the other.
RTC_DEVICE void zero_rows_past(rtc_u32 v_tile, int valid, int wg) {
  const int tid = threadIdx.x % 128;
  const rtc_u32 from = valid * 128, bytes = (kN - valid) * 128;  // per 64-column half
  for (rtc_u32 off = tid * 16; off < 2 * bytes; off += 128 * 16) {
    const rtc_u32 at = v_tile + (off < bytes ? from + off : kHalfKV + from + off - bytes);
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at), "r"(0u) : "memory");
  }
  fence_proxy_async_smem();         // the generic-proxy stores, before wgmma's async-proxy reads
  named_sync(3 + wg, 128);          // every warp of the warpgroup has stored
}

// The tile after `ti` in this CTA's order: the next index of the static order, or the one the producer
// hands over (dynamic order; it publishes it when it starts that tile's loads).
RTC_DEVICE int following_tile(const Sm90AttnParams& p, const SmemTiles& sm, TileOrder& order, int ti) {
  return kDynamic ? receive_tile(sm.bars, order) : ti + (int)gridDim.x;
}

// What a consumer warpgroup needs of a tile: its K/V span and where its rows sit.
struct TilePlan {
  KvSpan sp;
  int n_blocks;
  RTC_DEVICE static TilePlan of(const Tile& t) {
    TilePlan r;
    r.sp = tile_span(t.view, t.m_block);
    r.n_blocks = r.sp.end - r.sp.begin;
    return r;
  }
};

// S_0 = Q K_0^T of a tile, issued on its own ([sync own] QK [arrive other]) or, across tiles, together
// with the previous tile's last P V (kOverlapTiles below).
RTC_DEVICE void wait_first_qk(const SmemTiles& sm, const PipeState& ps, const QState& qs) {
  mbar_wait(sm.bars.q_full(qs.stage), qs.phase);
  mbar_wait(sm.bars.k_full(ps.stage), ps.phase);
}
RTC_DEVICE void issue_first_qk(const SmemTiles& sm, ConsumerRegs& r, const PipeState& ps, const QState& qs, int wg) {
  issue_qk(r.s, sm.q_stage(qs.stage) + wg * 64 * 128, sm.k_stage(ps.stage));
}

// One tile of one consumer warpgroup. With `pending`, the tile's S_0 is already in flight (issued by the
// previous tile's last block). The last P V of a tile goes out in one issue with the next tile's S_0 when
// that tile has keys: the epilogue (O scaled and stored) then runs under that GEMM, and the tensor cores
// need not wait for the store, the Q load or a separate first issue (the Q ring is two tiles deep).
// Returns the next tile's index; `pending` tells whether its S_0 was issued.
RTC_DEVICE int consume_tile(const Sm90AttnParams& p, const SmemTiles& sm, const Tile& t, int ti, int wg, PipeState& ps,
                            QState& qs, ConsumerRegs& r, bool& pending, TileOrder& order) {
  const AttnParams& a = t.view;
  const TilePlan plan = TilePlan::of(t);
  const KvSpan& sp = plan.sp;
  const int n0 = sp.begin, n_blocks = plan.n_blocks;
  const int last_valid = a.seq_k - (sp.end - 1) * kN;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const WindowMask wm{KeyWindow::of(a, (rtc_i64)t.m_block * kM + wg * 64 + warp * 16 + lane / 4), sp.full_begin,
                      sp.full_end};
  TileLoop L{sm,
             qs.stage,
             sm.q_stage(qs.stage) + wg * 64 * 128,
             ps,
             ps,
             1 + wg,
             2 - wg,
             n_blocks,
             last_valid,
             a.scale_log2,
             p.a.seq_k < 0,
             wm};
  r.st.init();
#pragma unroll
  for (int i = 0; i < 64; ++i) r.o[i] = 0.f;
  if ((RTC_MASK || kPacked) && n_blocks == 0) {  // no row sees a key: zeros, LSE -inf, nothing read
    store_tile(p, t, wg, r.o, r.st, wm.rows);
    pending = false;
    return following_tile(p, sm, order, ti);
  }

  // 1. first block: scores only.
  if (!pending) {
    wait_first_qk(sm, ps, qs);
    named_sync(L.own_bar, kPingPongThreads);
    issue_first_qk(sm, r, ps, qs, wg);
    named_arrive(L.other_bar, kPingPongThreads);
    wgmma_wait<0>();
  }
  qs.advance();
  scores_done(sm, r, ps, L.q_slot, n_blocks == 1, L.last_valid, L.c, a, L.wm, n0);
  pack_p(r.s, r.pk);
  L.pv = ps;
  ps.advance();
  // 2. steady state.
  for (int n = 1; n < n_blocks; ++n) steady_block(L, r, a, n0 + n, n == n_blocks - 1);
  // 3. last block: P V, and the next tile's S_0 when it has keys.
  const int next = following_tile(p, sm, order, ti);
  pending = false;
  if (kOverlapTiles && next < tile_count(p, sm))
    pending = !(RTC_MASK || kPacked) || TilePlan::of(decode_tile(p, sm, next)).n_blocks > 0;
  mbar_wait(sm.bars.v_full(L.pv.stage), L.pv.phase);
  if (kPacked && last_valid < kN) zero_rows_past(sm.v_stage(L.pv.stage), last_valid, wg);
  // Two straight-line paths: ptxas must see every wait after the issues it covers.
  if (pending) {
    wait_first_qk(sm, ps, qs);
    named_sync(L.own_bar, kPingPongThreads);
    issue_pv(r.o, r.pk, sm.v_stage(L.pv.stage));
    issue_first_qk(sm, r, ps, qs, wg);
    named_arrive(L.other_bar, kPingPongThreads);
    wgmma_wait<1>();
    fence_regs(r.o);
    release(sm.bars.v_empty(L.pv.stage));
    store_tile(p, t, wg, r.o, r.st, wm.rows);
    wgmma_wait<0>();  // nothing in flight across tiles: ptxas would serialize the pipeline
    fence_regs(r.s);
  } else {
    named_sync(L.own_bar, kPingPongThreads);
    issue_pv(r.o, r.pk, sm.v_stage(L.pv.stage));
    named_arrive(L.other_bar, kPingPongThreads);
    wgmma_wait<0>();
    fence_regs(r.o);
    release(sm.bars.v_empty(L.pv.stage));
    store_tile(p, t, wg, r.o, r.st, wm.rows);
  }
  return next;
}

RTC_DEVICE void consume(const Sm90AttnParams& p, const SmemTiles& sm, int wg) {
  PipeState ps;
  QState qs;
  TileOrder order;
  ConsumerRegs carried;  // across tiles only when a tile's S_0 is issued by the previous tile
  bool pending = false;
  // Warpgroup 0 issues first: warpgroup 1 pre-arrives on its barrier.
  if (wg == 1) named_arrive(1, kPingPongThreads);
  const int tiles = tile_count(p, sm);
  for (int ti = kDynamic ? receive_tile(sm.bars, order) : (int)blockIdx.x; ti < tiles;) {
    ConsumerRegs fresh;  // otherwise nothing lives from one tile to the next (fewer live registers)
    ti = consume_tile(p, sm, decode_tile(p, sm, ti), ti, wg, ps, qs, kOverlapTiles ? carried : fresh, pending, order);
  }
  // Balance the pre-arrival so the barrier is idle when the block exits.
  if (wg == 0) named_sync(1, kPingPongThreads);
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

}  // namespace

// The (threads, 1) bound gives the register cap at entry that setmaxnreg needs.
extern "C" __global__ void __launch_bounds__(SM90_THREADS, 1)
    attention_fwd_sm90(const __grid_constant__ Sm90AttnParams p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const rtc_u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  SmemTiles sm;
  sm.q = base;
  sm.k = sm.q + kQStages * SM90_Q_BYTES;
  sm.v = sm.k + kStages * SM90_KV_BYTES;
  sm.bars.base = sm.v + kStages * SM90_KV_BYTES;
  if (threadIdx.x == 0) init_barriers(p, sm.bars);
  if (kPacked)  // after the barrier slots; its own __syncthreads also publishes the barriers' init
    sm.sched =
        build_schedule(p.a, p.num_m_blocks,
                       reinterpret_cast<int*>(smem_raw + (sm.bars.base + SM90_BAR_BYTES - smem_addr(smem_raw))), kM);
  __syncthreads();
  const int wg = warp_uniform(threadIdx.x / 128);
  if (wg == 0) {
    regs_shrink<kProducerRegs>();
    if (threadIdx.x == 0) produce(p, sm);
  } else {
    regs_grow<kConsumerRegs>();
    consume(p, sm, wg - 1);
  }
}
