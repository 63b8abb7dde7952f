// The sm_90a decode kernel's loads: the item's 16 packed Q rows, and each stage's 64 K and V rows, gathered row by
// row (through the block table when paged) with cp.async by all 128 threads into the shared-memory ring. Every thread
// issues its own rows' 16-byte pieces, so a stage's pages are gathered by 128 lanes at once, whatever the page size.
// Rows past the sequence, unmapped pages and columns past the call's head dim are zero-filled (cp.async with a source
// size of 0 reads nothing): no address outside the tensors is read.
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

// Shared memory: the ring's stages, each K [64][row] and V [64][row], then Q [16 row_tiles][row]; the warps' partial
// results reuse the ring at the end (sm90_decode/epilogue.h).
struct Smem {
  rtc_u32 base;
  RTC_DEVICE rtc_u32 ring() const { return base; }
  RTC_DEVICE rtc_u32 k(int stage) const { return base + stage * kStageBytes; }
  RTC_DEVICE rtc_u32 v(int stage) const { return k(stage) + kHalfStage; }
  RTC_DEVICE rtc_u32 q() const { return base + kRingBytes; }
};

// The item's Q rows: packed row r is query row i = (16 row_tiles chunk + r) / group of q head hk * group + g. Rows
// outside the item and columns past D are zeros. Committed with the first stage's group.
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

// Where key row j (< 2^31) of the item's K/V head starts, in elements from the tensor's base, or -1 when it reads as
// zeros (past the sequence, or paged through an entry that is not a page of the pool). Page sizes are powers of two
// (op.cpp), so a row's page and its row in the page are a shift and a mask.
struct KvRows {
  rtc_i64 off, sb, ss, sh;  // the sequence's first row (dense, varlen) and the tensor's strides
};

RTC_DEVICE rtc_i64 kv_row(const KvRows& t, int page, int in_page, int hk) {
  if (RTC_KV == RTC_KV_PAGED) return (rtc_i64)page * t.sb + (rtc_i64)in_page * t.ss + (rtc_i64)hk * t.sh;
  return t.off + (rtc_i64)in_page * t.ss + (rtc_i64)hk * t.sh;
}

// Stage n's 64 K and V rows into ring slot `slot`: this thread's pieces e = tid + 128 x of each tile, row e / chunks.
// The page of a row comes from the block table (int32 loads that stay in L1: a stage's rows share a few entries).
RTC_DEVICE void load_stage(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const Smem& sm, const KvRows& kt,
                           const KvRows& vt, int page_shift, int slot, int n, int tid) {
  constexpr int per_thread = SM90_DECODE_STAGE_KEYS * kChunks / SM90_DECODE_THREADS;
  const int* table = RTC_KV == RTC_KV_PAGED ? p.block_table + (rtc_i64)w.b * p.table_stride : nullptr;
  // Four rows' table entries in flight at once; unrolled whole, the 256 bucket's 16 pieces held their addresses in
  // registers beside O's 128 accumulators and spilled.
#pragma unroll 4
  for (int x = 0; x < per_thread; ++x) {
    const int e = tid + SM90_DECODE_THREADS * x, r = e / kChunks, c = e - r * kChunks;
    const int j = n * SM90_DECODE_STAGE_KEYS + r;
    bool ok = j < seq.len_k && 8 * c < p.head_dim;
    int page = 0, in_page = j;
    if (RTC_KV == RTC_KV_PAGED && ok) {
      page = __ldg(table + (j >> page_shift));
      ok = page >= 0 && page < p.num_pages;
      in_page = j & ((1 << page_shift) - 1);
    }
    const rtc_u32 at = r * kRowBytes + 16 * c;
    const rtc_elem_t* ks = ok ? p.k + kv_row(kt, page, in_page, w.hk) + 8 * c : p.k;
    const rtc_elem_t* vs = ok ? p.v + kv_row(vt, page, in_page, w.hk) + 8 * c : p.v;
    sm90::cp_async_16_zfill(sm.k(slot) + at, ks, ok ? 16u : 0u);
    sm90::cp_async_16_zfill(sm.v(slot) + at, vs, ok ? 16u : 0u);
  }
}

}  // namespace sm90dec
