// The sm_90a decode kernel's loads: the item's packed Q rows (cp.async, once), and each stage's 64 K and V rows,
// gathered row by row (through the block table when paged) by the 32 lanes of warp 0, each row one bulk copy (the
// TMA unit's cp.async.bulk: D x 2 bytes) counted on the stage slot's mbarrier. The copy engine holds a stage's bytes
// in flight, not the SM's load queues, and the lanes gather a stage's pages at once whatever the page size; a lane
// looks up its next rows' pages one stage ahead. Rows past the sequence and unmapped pages are written as zeros by the
// lane instead; columns past the call's head dim are zeros once for all (no copy reaches them): no address outside
// the tensors is read.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"

namespace sm90dec {

constexpr int kRowBytes = sm90_decode_row_bytes(kBucket);
constexpr int kChunks = kBucket / 8;  // 16-byte pieces of a row
constexpr int kStages = sm90_decode_plan(kBucket).stages;
constexpr int kStageBytes = sm90_decode_stage_bytes(kBucket);
constexpr int kHalfStage = kStageBytes / 2;  // the K rows, then the V rows

constexpr int kRingBytes = sm90_decode_ring_bytes(sm90_decode_plan(kBucket));

// Shared memory: the ring's stages, each K [64][row] and V [64][row], then Q [16 row_tiles][row], then the stage
// slots' mbarriers; the warps' partial results reuse the ring at the end (sm90_decode/epilogue.h).
struct Smem {
  rtc_u32 base;
  int row_tiles;
  RTC_DEVICE rtc_u32 ring() const { return base; }
  RTC_DEVICE rtc_u32 k(int stage) const { return base + stage * kStageBytes; }
  RTC_DEVICE rtc_u32 v(int stage) const { return k(stage) + kHalfStage; }
  RTC_DEVICE rtc_u32 q() const { return base + kRingBytes; }
  RTC_DEVICE rtc_u32 bar(int stage) const {
    return base + kRingBytes + sm90_decode_q_bytes(kBucket, row_tiles) + 8 * stage;
  }
};

// Before any load: the slots' barriers, and zeros in the ring rows' columns past the call's head dim (a bucket wider
// than D: the copies write D columns only). The caller syncs the CTA after.
RTC_DEVICE void init_ring(const Sm90DecodeParams& p, const Smem& sm, int tid) {
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) sm90::mbar_init(sm.bar(s), 1);
    sm90::mbar_init_fence();
  }
  const int c0 = p.head_dim / 8, pieces = kChunks - c0;
  if (pieces <= 0) return;
  for (int e = tid; e < kStages * 2 * SM90_DECODE_STAGE_KEYS * pieces; e += SM90_DECODE_THREADS) {
    const int row = e / pieces, c = c0 + e - row * pieces;  // rows of every slot, K then V, one after another
    sm90::st_shared_v4_splat(sm.ring() + row * kRowBytes + 16 * c, 0u);
  }
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

// Where a K or V row of the item's K/V head starts: the sequence's first row (dense, varlen) and the tensor's strides.
struct KvRows {
  rtc_i64 off, sb, ss, sh;
};

RTC_DEVICE rtc_i64 kv_row(const KvRows& t, int page, int in_page, int hk) {
  if (RTC_KV == RTC_KV_PAGED) return (rtc_i64)page * t.sb + (rtc_i64)in_page * t.ss + (rtc_i64)hk * t.sh;
  return t.off + (rtc_i64)in_page * t.ss + (rtc_i64)hk * t.sh;
}

// Warp 0's gather of the stages: lane l copies rows l and l + 32 of each stage. `page` holds the pages of the lane's
// rows of the next stage it issues, looked up one stage ahead (page sizes are powers of two: a shift), -1 for a row
// past the sequence or an entry outside the pool.
struct Gather {
  const int* table;  // the sequence's block-table row (paged)
  int page_shift;
  int page[2];

  RTC_DEVICE void look_up(const Sm90DecodeParams& p, const Seq& seq, int n, int lane) {
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int j = n * SM90_DECODE_STAGE_KEYS + lane + 32 * x;
      page[x] = j < seq.len_k ? 0 : -1;
      if (RTC_KV == RTC_KV_PAGED && j < seq.len_k) {
        const int id = sm90::ld_global_nc_s32(table + (j >> page_shift));
        page[x] = id >= 0 && id < p.num_pages ? id : -1;
      }
    }
  }

  // Stage n into ring slot `slot`, then the pages of stage `next` (its next issue; past the part: none).
  RTC_DEVICE void issue(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const Smem& sm, int slot, int n,
                        int next, int kb1, int lane) {
    const rtc_u32 row_bytes = 2u * (rtc_u32)p.head_dim, bar = sm.bar(slot);
    const KvRows kt = {seq.k_off, p.k_sb, p.k_ss, p.k_sh}, vt = {seq.v_off, p.v_sb, p.v_ss, p.v_sh};
    const int valid = (page[0] >= 0) + (page[1] >= 0);
    const int total = __reduce_add_sync(0xffffffffu, valid);
    if (lane == 0) sm90::mbar_expect_tx(bar, 2u * row_bytes * (rtc_u32)total);
    __syncwarp();
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int r = lane + 32 * x, j = n * SM90_DECODE_STAGE_KEYS + r;
      const rtc_u32 at = r * kRowBytes;
      if (page[x] >= 0) {
        const int in_page = RTC_KV == RTC_KV_PAGED ? j & ((1 << page_shift) - 1) : j;
        sm90::bulk_load(sm.k(slot) + at, p.k + kv_row(kt, page[x], in_page, w.hk), row_bytes, bar);
        sm90::bulk_load(sm.v(slot) + at, p.v + kv_row(vt, page[x], in_page, w.hk), row_bytes, bar);
      } else {  // reads as zeros: the row's D columns (K: its score is 0 where a mask does not take it)
        for (rtc_u32 c = 0; c < row_bytes; c += 16) {
          sm90::st_shared_v4_splat(sm.k(slot) + at + c, 0u);
          sm90::st_shared_v4_splat(sm.v(slot) + at + c, 0u);
        }
      }
    }
    if (next < kb1) look_up(p, seq, next, lane);
  }
};

}  // namespace sm90dec
