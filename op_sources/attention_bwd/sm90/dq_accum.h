// The fused dQ of the sm_90a backward (without `deterministic`; sm90/plan.h): the DKDV stage's steps add dQ of their
// rows into an fp32 workspace, in place of a DQ stage that forms S and dP again. Per step of the DKDV stage:
//   each warpgroup stores its dS^T (the CTA's keys x the step's 64 rows, rounded as for dK) into the step's dS slot;
//   once both have, dQ_rows += dS K over the CTA's keys (SS, both operands read MN-major), 64 columns a GEMM, the
//   bucket's column blocks dealt to the two warpgroups in turn, each result added to the workspace with 16-byte vector
//   reductions (red.global.add.v4.f32) in the accumulator's own order.
// The delta stage zeroes the tiles of its rows first; the DQ_STORE stage rounds the sums times the scale into dq. The
// sums' order varies run to run (the reductions of the key blocks land in any order): `deterministic` takes the DQ
// stage instead.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bwd_common.h"
#include "ptx_sm90.h"
#include "wgmma_sm90.h"
#include "sm90/tiles.h"
#include "sm90/pairs.h"

namespace bwd90 {

constexpr int kDqChunks = bwd_sm90_dq_chunks(kPlan);
static_assert(!bwd_sm90_dq_fused(kPlan) || kPlan.kv_split == 1, "the fused dQ's GEMMs take both warpgroups' keys");
constexpr int kDsSlot = bwd_sm90_ds_slot_bytes(kPlan);
constexpr int kAccKeys = bwd_sm90_kv_keys(kPlan);  // the dQ GEMMs' K extent: the DKDV CTA's keys

// Columns of chunk c: 64, or what the bucket has left.
RTC_HD constexpr int chunk_cols(int c) { return kD - 64 * c < 64 ? kD - 64 * c : 64; }

// The sums' tile of head h's rows [m0, m0 + 64) of sequence b (m0 a multiple of 64), chunk 0; chunk c is c tiles on.
RTC_DEVICE float* dq_tile(const BwdParams& bp, const Seq& seq, int b, int h, int m0) {
  const rtc_i64 blk = bwd_sm90_dq_block0(RTC_KV != RTC_KV_DENSE, b, bp.a.seq_q, seq.q_row) + m0 / 64;
  return bp.dq_accum + bwd_sm90_dq_tile_at(kPlan, blk, bp.a.heads, h, 0);
}
// Element e = 4j + r of this thread's accumulator in a tile: thread t of the warpgroup, float (j * 128 + t) * 4 + r.
RTC_DEVICE int tile_float(int j) { return (j * 128 + (int)threadIdx.x % 128) * 4; }

// The delta stage's share: the tiles of its CTA's rows (rows [256 x, 256 x + 256) of head y of sequence z: four row
// blocks, every chunk), zeroed.
RTC_DEVICE void zero_dq_tiles(const BwdParams& bp) {
  const int b = blockIdx.z, h = blockIdx.y;
  const Seq seq = seq_of(bp.a, b);
  for (int blk = 0; blk < kThreads / 64; ++blk) {
    const int m0 = (int)blockIdx.x * kThreads + 64 * blk;
    if (m0 >= seq.len_q) break;
    float* t = dq_tile(bp, seq, b, h, m0);
    for (int i = threadIdx.x; i < kDqChunks * BWD_SM90_DQ_TILE / 4; i += kThreads)
      sm90::st_global_v4_f32(t + 4 * i, 0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// This warpgroup's dS^T (pd: keys key0 + acc_row(i) x the step's 64 rows, pairs of rows a word) into a dS slot: a key
// a 128-byte row, its 16-byte chunk j at j ^ (key & 7) (the 128-byte swizzle). Keys at or past `keys` (the block's
// end) are stored as zeros: K's zero rows there then meet a finite dS.
RTC_DEVICE void store_ds(rtc_u32 slot, const rtc_u32 (&pd)[16], int key0, int keys) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = key0 + acc_row(i);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      sm90::st_shared_u32(slot + r * 128 + ((j ^ (r & 7)) << 4) + 4 * (lane() % 4), r < keys ? pd[2 * j + i] : 0u);
  }
}

// dQ of the step's 64 rows over the CTA's keys, columns [64 c, 64 c + kN): A = dS (the slot, rows contiguous), B = K
// (k_cols: the K tile at chunk c's column block, columns contiguous); the result added to the chunk's tile.
template <int kN> RTC_DEVICE void dq_chunk(float* tile, rtc_u32 ds_slot, rtc_u32 k_cols) {
  float acc[kN / 2];
  // Formed here, not hoisted out of the stage's loop as invariants (a chunk's descriptors held across the step's
  // other GEMMs cost the registers that spilled at D 192 / 256).
  asm volatile("" : "+r"(ds_slot), "+r"(k_cols));
  const rtc_u64 da = sm90::smem_desc(ds_slot, kDsSlot, 1024), db = sm90::smem_desc(k_cols, 1024, 1024);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kAccKeys / 16; ++kk)
    sm90::WgmmaSSMN<kN, kElem>::k16(acc, sm90::desc_at(da, kk * 2048), sm90::desc_at(db, kk * 2048), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_regs(acc);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
    sm90::red_add_v4_f32(tile + tile_float(j), acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
}

// The dQ GEMMs of step s that fall to warpgroup wg (chunk c to warpgroup (c + s) % 2: chunks p, p + 2, .. from
// p = (wg + s) % 2), once both warpgroups' dS^T are in the slot; then this thread's reads of the slot are done. Every
// thread waits for the slot's full phase, a chunk or not (each arrives on it: compute-sanitizer's synccheck counts an
// arrival on a phase after one never waited for as an error).
RTC_DEVICE void dq_step_sums(const Ring& ds_ring, int s, int wg, rtc_u32 ds_slot, rtc_u32 k_tile, float* tile) {
  const int first = (wg + s) & 1;
  ds_ring.wait(s);
#pragma unroll
  for (int q = 0; q < (kDqChunks + 1) / 2; ++q) {
    const int c = 2 * q + first;
    if (c >= kDqChunks) break;
    float* t = tile + c * BWD_SM90_DQ_TILE;
    const rtc_u32 k_cols = k_tile + c * block_stride(kAccKeys);
    if (kD % 64 == 0 || c < kDqChunks - 1)
      dq_chunk<64>(t, ds_slot, k_cols);
    else
      dq_chunk<chunk_cols(kDqChunks - 1)>(t, ds_slot, k_cols);  // the bucket's last, narrower chunk
  }
  ds_ring.release(s);
}

// The DQ_STORE stage: a CTA per 128 rows of one head, 64 a warpgroup: each thread reads its elements of the rows'
// tiles and stores them times the scale, rounded to the element type, into dq.
RTC_DEVICE void dq_store_stage(const BwdParams& bp) {
  const AttnParams& a = bp.a;
  const int b = blockIdx.z, h = blockIdx.y, wg = (int)threadIdx.x / 128;
  const Seq seq = seq_of(a, b);
  const int m0 = (int)blockIdx.x * 128 + 64 * wg;
  if (m0 >= seq.len_q) return;
  const float* tile = dq_tile(bp, seq, b, h, m0);
  rtc_elem_t* dst = bp.dq + bwd::row_at(bp.dq_sb, bp.dq_ss, b, seq.q_row, m0) + (rtc_i64)h * bp.dq_sh;
#pragma unroll
  for (int c = 0; c < kDqChunks; ++c) {
    constexpr int kMax = 64;
    float acc[kMax / 2];
#pragma unroll
    for (int j = 0; j < kMax / 8; ++j) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (j < chunk_cols(c) / 8) sm90::ld_global_v4_f32(v, tile + c * BWD_SM90_DQ_TILE + tile_float(j));
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[4 * j + r] = v[r];
    }
    // (a chunk narrower than 64 is the bucket's last: its columns past it are past the head dim too)
    store_acc<kMax>(dst, bp.dq_ss, acc, seq.len_q - m0, 64 * c, a.head_dim, a.scale);
  }
}

}  // namespace bwd90
