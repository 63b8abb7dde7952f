// The sm_90a decode kernel's loads: the item's packed Q rows (cp.async, once), and each stage's K and V rows by
// TMA, boxes of kv_box rows x 128 bytes (64 bf16 / fp16 columns, 128 FP8 ones: the cache's bytes as stored) counted on the stage slot's mbarrier. Warp 0 issues a stage: one box per
// lane (at most 4 boxes of rows x 4 column blocks x K and V = 32), so a paged stage's pages are gathered by as many
// lanes as it has boxes, each lane looking up its page one stage ahead. A box past the tensor, or through a
// block-table entry that is not a page of the pool (page coordinate num_pages), reads zeros and reads nothing; rows
// past the sequence inside the tensor are masked (K) and zeroed in shared memory when the stage is in (V).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"

namespace sm90dec {

constexpr int kRowBytes = sm90_decode_row_bytes(kBucket);  // a Q row in shared memory
constexpr int kChunks = kBucket / 8;  // 16-byte pieces of a Q row
constexpr int kStages = kPlan.stages;
constexpr int kColBlocks = sm90_decode_col_blocks(kPlan);
constexpr int kBlockBytes = sm90_decode_block_bytes(kPlan);  // one 128-byte column block of a stage's K or V
constexpr int kStageBytes = sm90_decode_stage_bytes(kPlan);
constexpr int kHalfStage = kStageBytes / 2;  // K's column blocks, then V's
constexpr int kRingBytes = sm90_decode_ring_bytes(kPlan);
constexpr int kBoxUnits = kPlan.kv_bits == 16 ? SM90_DECODE_BOX_BYTES / 2 : SM90_DECODE_BOX_BYTES;  // a box row's
    // map elements
constexpr bool kKvScales = kPlan.kv_bits == 4;  // FP4: an E8M0 scale per key of K and of V (ScaleGather)

// Shared memory (1024-byte aligned): the ring's stages, then Q [16 row_tiles][row], FP4's scales [stage][K, V][keys],
// then the slots' mbarriers; the warps' partial results reuse the ring at the end (sm90_decode/epilogue.h).
struct Smem {
  rtc_u32 base;
  int row_tiles;
  RTC_DEVICE rtc_u32 ring() const { return base; }
  RTC_DEVICE rtc_u32 k(int stage) const { return base + stage * kStageBytes; }
  RTC_DEVICE rtc_u32 v(int stage) const { return k(stage) + kHalfStage; }
  RTC_DEVICE rtc_u32 q() const { return base + kRingBytes; }
  RTC_DEVICE rtc_u32 scales(int stage, int is_v) const {
    return q() + sm90_decode_q_bytes(kBucket, row_tiles) + (2 * stage + is_v) * kStageKeys;
  }
  RTC_DEVICE rtc_u32 bar(int stage) const {
    return base + kRingBytes + sm90_decode_q_bytes(kBucket, row_tiles) + sm90_decode_scale_bytes(kPlan) + 8 * stage;
  }
};

// The 16-byte piece c (0..7) of key row `key` in a column block of a K or V tile: the 128-byte swizzle puts it at
// c ^ (key % 8) within the row. A piece holds 8 bf16 / fp16 columns, or 16 FP8 columns.
RTC_DEVICE rtc_u32 kv_piece(rtc_u32 tile, int col_block, int key, int c) {
  return tile + col_block * kBlockBytes + key * 128 + ((c ^ (key & 7)) << 4);
}

// The item's Q rows: packed row r is query row i = (16 row_tiles chunk + r) / group of q head hk * group + g. Rows
// outside the item and columns past D are zeros (cp.async with a source size of 0), waited for before the KV loop.
RTC_DEVICE void load_q(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const Smem& sm, int tid) {
  const int rows = DECODE_ROWS * p.row_tiles, pieces = rows * kChunks;
  for (int e = tid; e < pieces; e += SM90_DECODE_THREADS) {
    const int r = e / kChunks, c = e - r * kChunks;
    const int packed = w.chunk * rows + r, i = packed / p.group, g = packed - i * p.group;
    const bool ok = i >= w.i0 && i < w.i1 && 8 * c < p.head_dim;
    const rtc_elem_t* src =
        ok ? p.q + seq.q_off + (rtc_i64)i * p.q_ss + (rtc_i64)(w.hk * p.group + g) * p.q_sh + 8 * c : p.q;
    sm90::cp_async_16_zfill(sm.q() + r * kRowBytes + 16 * c, src, ok ? 16u : 0u);
  }
}

// Warp 0's TMA issue of the stages: lane l < 2 x boxes issues box l % boxes of K (l < boxes) or V: box row
// i = (l % boxes) / col_blocks, column block (l % boxes) % col_blocks. `page` is the page of the lane's box in the next
// stage it issues (paged), looked up one stage ahead: num_pages for a box past the sequence or an entry outside the
// pool (TMA fills zeros there).
struct Gather {
  int boxes;  // boxes of one tensor per stage: (64 / kv_box) x col_blocks
  int page;
  RTC_DEVICE void look_up(const Sm90DecodeParams& p, const Work& w, const Seq& seq, int n, int lane) {
    if (RTC_KV != RTC_KV_PAGED || lane >= 2 * boxes) return;
    const int row = n * kStageKeys + ((lane % boxes) / kColBlocks) * p.kv_box;
    page = p.num_pages;
    if (row < seq.len_k) {
      const int id = sm90::ld_global_nc_s32(p.block_table + (rtc_i64)w.b * p.table_stride + (row >> p.page_shift));
      if (id >= 0 && id < p.num_pages) page = id;
    }
  }
  // Stage n into ring slot `slot`, then the pages of stage `next` (none past the part).
  RTC_DEVICE void issue(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const Smem& sm, int slot, int n,
                        int next, int kb1, int lane) {
    const rtc_u32 bar = sm.bar(slot);
    if (lane == 0) sm90::mbar_expect_tx(bar, (rtc_u32)(2 * boxes * p.kv_box * 128));
    __syncwarp();
    if (lane < 2 * boxes) {
      const int x = lane % boxes, i = x / kColBlocks, cb = x - i * kColBlocks;
      const bool is_v = lane >= boxes;
      const int row = n * kStageKeys + i * p.kv_box;
      const rtc_u32 dst = (is_v ? sm.v(slot) : sm.k(slot)) + cb * kBlockBytes + i * p.kv_box * 128;
      const void* map = is_v ? (const void*)&p.tmap_v : (const void*)&p.tmap_k;
      if (RTC_KV == RTC_KV_PAGED)
        sm90::tma_load_4d(dst, map, bar, cb * kBoxUnits, row & ((1 << p.page_shift) - 1), w.hk, page);
      else if (RTC_KV == RTC_KV_VARLEN)
        sm90::tma_load_4d(dst, map, bar, cb * kBoxUnits, seq.k_row + row, w.hk, 0);
      else
        sm90::tma_load_4d(dst, map, bar, cb * kBoxUnits, row, w.hk, w.b);
    }
    if (next < kb1) look_up(p, w, seq, next, lane);
  }
};

// FP4: the E8M0 scales of a stage's keys, thread tid taking key tid (kStageKeys <= threads: params.h) of K and of V:
// looked up when the stage's copies are issued (block table, then the scale bytes) and stored into the slot's scales
// after the step's work, so the loads' latency hides under it. A key past the sequence, or through a block-table entry
// outside the pool (which TMA reads as zeros), takes 127 (2^0): no scale byte outside the tensors is read, and its V
// row's zeros weigh 0, never 0 x NaN.
struct ScaleGather {
  rtc_u32 k, v;
  RTC_DEVICE void look_up(const Sm90DecodeParams& p, const Work& w, const Seq& seq, int n, int tid) {
    k = v = 127u;
    const int row = n * kStageKeys + tid;
    if (tid >= kStageKeys || row >= seq.len_k) return;
    rtc_i64 at_k, at_v;
    if (RTC_KV == RTC_KV_PAGED) {
      const int id = sm90::ld_global_nc_s32(p.block_table + (rtc_i64)w.b * p.table_stride + (row >> p.page_shift));
      if (id < 0 || id >= p.num_pages) return;
      const int r = row & ((1 << p.page_shift) - 1);
      at_k = (rtc_i64)id * p.ks_sb + (rtc_i64)r * p.ks_ss;
      at_v = (rtc_i64)id * p.vs_sb + (rtc_i64)r * p.vs_ss;
    } else {  // packed rows: the sequence's row seq.k_row + row
      at_k = (rtc_i64)(seq.k_row + row) * p.ks_ss;
      at_v = (rtc_i64)(seq.k_row + row) * p.vs_ss;
    }
    k = sm90::ld_global_nc_u8(p.k_scale + at_k + (rtc_i64)w.hk * p.ks_sh);
    v = sm90::ld_global_nc_u8(p.v_scale + at_v + (rtc_i64)w.hk * p.vs_sh);
  }
  RTC_DEVICE void store(const Smem& sm, int slot, int tid) const {
    if (tid >= kStageKeys) return;
    sm90::st_shared_u8(sm.scales(slot, 0) + tid, k);
    sm90::st_shared_u8(sm.scales(slot, 1) + tid, v);
  }
};

// Once stage n is in: its V rows past the sequence (another sequence's rows, or a page's unused tail, which may hold
// anything) become zeros, so p = 0 there weighs nothing (0 x NaN would not). K's are masked. The fence orders these
// generic writes before the slot's next TMA writes.
RTC_DEVICE void zero_v_tail(const Smem& sm, int slot, int n, const Seq& seq, int tid) {
  const rtc_i64 first = (rtc_i64)seq.len_k - (rtc_i64)n * kStageKeys;
  if (first >= kStageKeys) return;
  const int r0 = first < 0 ? 0 : (int)first;
  for (int e = tid; e < (kStageKeys - r0) * kColBlocks * 8; e += SM90_DECODE_THREADS) {
    const int piece = e % 8, rest = e / 8, cb = rest % kColBlocks, r = r0 + rest / kColBlocks;
    sm90::st_shared_v4_splat(sm.v(slot) + cb * kBlockBytes + r * 128 + piece * 16, 0u);
  }
  sm90::fence_proxy_async_smem();
}

}  // namespace sm90dec
