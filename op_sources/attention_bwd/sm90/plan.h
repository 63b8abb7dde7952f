// The tile plan of the sm_90a backward per head-dim bucket, shared by host and kernel: the kernel is compiled for one
// bucket (RTC_HEAD_DIM_MAX), the host sizes shared memory and grids from the same row.
//
// Both stages run two warpgroups a CTA (256 threads), 64 matrix rows each (wgmma's M).
//   DKDV  a CTA per key block of one K/V head: its K and V stay in shared memory while Q, dO and the rows' LSE and delta
//         stream through a two-slot ring, 64 rows a step. kv_split 1: each warpgroup owns 64 of the block's 128 keys;
//         kv_split 2 (head dims past 128, where dK and dV of 64 keys x D fill a warpgroup's registers): both take the
//         same 64 keys and each accumulates its share of the head-dim columns (whole 64-column blocks, the first
//         warpgroup the larger share), both computing the block's S^T and dP^T.
//   DQ    a CTA per 128 query rows of one head: its Q and dO stay, K and V stream, dq_keys keys a step.
// Without `deterministic` the DKDV stage also forms dQ (sm90/dq_accum.h): per step, dQ of the step's rows += dS K over
// the CTA's keys, added into an fp32 workspace with vector reductions; a last launch rounds it into dq. The DQ stage
// then does not run.
#pragma once
#include "attn_params.h"

struct BwdSm90Plan {
  int head_dim;  // the bucket, a multiple of 32: the GEMMs' head-dim extent; tiles hold whole 64-column blocks
  int kv_split;  // 1 or 2: warpgroups sharing a key block of the DKDV stage (above)
  int dq_keys;  // keys per step of the DQ stage, a multiple of 16
  int dq_keys_masked;  // the same under a window (causal: fewer masked pairs on the diagonal; docs/NOTES.md)
  int dq_keys_mods_drop;  // at most this many with a score modification and dropout both on: the cap's and ALiBi's
      // factors and the Philox draws sit beside the step's dS and dP (spills at 192: NOTES)
};
// clang-format off: one bucket per row
constexpr BwdSm90Plan kBwdSm90Plans[] = {
    {32, 1, 128, 64, 128},
    {64, 1, 128, 64, 128},
    {96, 1, 128, 64, 128},
    {128, 1, 128, 64, 128},
    {192, 2, 64, 64, 32},
    {256, 2, 32, 32, 32},
};
// clang-format on
constexpr int kBwdSm90PlanCount = int(sizeof(kBwdSm90Plans) / sizeof(kBwdSm90Plans[0]));
RTC_HD constexpr BwdSm90Plan bwd_sm90_plan(int d) {
  for (int i = 0; i < kBwdSm90PlanCount; ++i)
    if (kBwdSm90Plans[i].head_dim >= d) return kBwdSm90Plans[i];
  return kBwdSm90Plans[kBwdSm90PlanCount - 1];
}

#define BWD_SM90_THREADS 256
#define BWD_SM90_WGS 2
#define BWD_SM90_ROWS 64  // rows of the DKDV stage's steps; rows of each warpgroup's DQ tile
// 64-column blocks of a tile row (the 128-byte swizzle's width); a tile of R rows is [block][R][64] elements.
RTC_HD constexpr int bwd_sm90_col_blocks(const BwdSm90Plan& pl) { return (pl.head_dim + 63) / 64; }
RTC_HD constexpr int bwd_sm90_tile_bytes(const BwdSm90Plan& pl, int rows) {
  return rows * bwd_sm90_col_blocks(pl) * 128;
}
// Keys of a DQ step, the variant's: masked (RTC_MASK on the kernel's side, the call's window on the host's) and
// mods_drop (a score modification and dropout both on: RTC_SCORE_MOD and RTC_DROPOUT, the call's cap, slopes and p).
RTC_HD constexpr int bwd_sm90_dq_keys(const BwdSm90Plan& pl, bool masked, bool mods_drop) {
  const int keys = masked ? pl.dq_keys_masked : pl.dq_keys;
  return mods_drop && pl.dq_keys_mods_drop < keys ? pl.dq_keys_mods_drop : keys;
}
// Keys of a DKDV CTA; rows of a DQ CTA.
RTC_HD constexpr int bwd_sm90_kv_keys(const BwdSm90Plan& pl) { return 64 * BWD_SM90_WGS / pl.kv_split; }
RTC_HD constexpr int bwd_sm90_dq_rows(const BwdSm90Plan&) { return 64 * BWD_SM90_WGS; }
// The first warpgroup's head-dim columns under kv_split 2 (whole 64-column blocks, at least half); the second takes
// the rest.
RTC_HD constexpr int bwd_sm90_split_cols(const BwdSm90Plan& pl) { return (bwd_sm90_col_blocks(pl) + 1) / 2 * 64; }
// Shared memory of each stage, + the ring's barriers + 1024 (the kernel rounds the dynamic base up to the swizzle
// period).
//   DKDV: K, V (the CTA's keys), then two slots of Q, dO (64 rows) and the rows' LSE and delta (fp32), then two slots
//         of dS (the fused dQ's A operand: the CTA's keys x 64 rows).
//   DQ:   Q, dO (the CTA's rows), then two slots of K, V (dq_keys rows).
#define BWD_SM90_BAR_BYTES 64
// A slot is a whole number of 1024-byte periods, so that the next slot's tiles start on one.
RTC_HD constexpr int bwd_sm90_dkdv_slot_bytes(const BwdSm90Plan& pl) {
  return (2 * bwd_sm90_tile_bytes(pl, BWD_SM90_ROWS) + 2 * BWD_SM90_ROWS * 4 + 1023) / 1024 * 1024;
}
// Whether the bucket fuses dQ without `deterministic`: under kv_split 1 only. Under kv_split 2 (D 192, 256) dK and dV
// take 128 of a thread's registers beside the step's S^T and dP^T, and the dQ GEMM's accumulators spilled there (ptxas,
// docs/NOTES.md): those buckets run the DQ stage either way.
RTC_HD constexpr bool bwd_sm90_dq_fused(const BwdSm90Plan& pl) { return pl.kv_split == 1; }
// A dS slot: the CTA's keys x 64 rows of 16-bit elements, rows contiguous (one 128-byte row a key); none where the
// bucket does not fuse dQ.
RTC_HD constexpr int bwd_sm90_ds_slot_bytes(const BwdSm90Plan& pl) {
  return bwd_sm90_dq_fused(pl) ? bwd_sm90_kv_keys(pl) * 128 : 0;
}
RTC_HD constexpr int bwd_sm90_dkdv_smem(const BwdSm90Plan& pl) {
  return 2 * bwd_sm90_tile_bytes(pl, bwd_sm90_kv_keys(pl)) + 2 * bwd_sm90_dkdv_slot_bytes(pl) +
         2 * bwd_sm90_ds_slot_bytes(pl) + BWD_SM90_BAR_BYTES + 1024;
}
RTC_HD constexpr int bwd_sm90_dq_smem(const BwdSm90Plan& pl, bool masked, bool mods_drop) {
  return 2 * bwd_sm90_tile_bytes(pl, bwd_sm90_dq_rows(pl)) +
         4 * bwd_sm90_tile_bytes(pl, bwd_sm90_dq_keys(pl, masked, mods_drop)) + BWD_SM90_BAR_BYTES + 1024;
}
// The fused dQ's fp32 workspace: a tile of 64 rows x 64 columns per (row block, query head, 64-column block of the
// bucket), its 4096 floats in the wgmma accumulator's order (thread t of a warpgroup holds elements 4j..4j+3 at
// (j * 128 + t) * 4: sm90/dq_accum.h), so a warp's reduction covers 512 contiguous bytes. The row blocks of sequence
// b start at b * ceil(seq_q / 64) (dense) or ceil(q_row / 64) + b (packed: each sequence's blocks start on its own,
// and q_row + len_q <= total_q keeps every block below ceil(total_q / 64) + batch).
#define BWD_SM90_DQ_TILE 4096
RTC_HD constexpr int bwd_sm90_dq_chunks(const BwdSm90Plan& pl) { return bwd_sm90_col_blocks(pl); }
RTC_HD constexpr rtc_i64 bwd_sm90_dq_block0(bool packed, int b, rtc_i64 seq_q, rtc_i64 q_row) {
  return packed ? (q_row + 63) / 64 + b : b * ((seq_q + 63) / 64);
}
RTC_HD constexpr rtc_i64 bwd_sm90_dq_blocks(bool packed, rtc_i64 batch, rtc_i64 seq_q, rtc_i64 total_q) {
  return packed ? (total_q + 63) / 64 + batch : batch * ((seq_q + 63) / 64);
}
// The first float of the tile of row block `blk` (bwd_sm90_dq_block0 + the block in the sequence), head h, chunk c.
RTC_HD constexpr rtc_i64 bwd_sm90_dq_tile_at(const BwdSm90Plan& pl, rtc_i64 blk, int heads, int h, int c) {
  return ((blk * heads + h) * bwd_sm90_dq_chunks(pl) + c) * (rtc_i64)BWD_SM90_DQ_TILE;
}
constexpr int kBwdSm90MaxShared = 227 * 1024;  // sm_90's opt-in limit per block
RTC_HD constexpr bool bwd_sm90_plans_fit() {
  for (int i = 0; i < kBwdSm90PlanCount; ++i) {
    const BwdSm90Plan pl = kBwdSm90Plans[i];
    if (bwd_sm90_dkdv_smem(pl) > kBwdSm90MaxShared || bwd_sm90_dq_smem(pl, false, false) > kBwdSm90MaxShared ||
        bwd_sm90_dq_smem(pl, true, false) > kBwdSm90MaxShared || pl.head_dim % 32 != 0 || pl.dq_keys % 16 != 0 ||
        pl.dq_keys_masked % 16 != 0 || pl.dq_keys_mods_drop % 16 != 0 || (pl.kv_split != 1 && pl.kv_split != 2) ||
        (pl.kv_split == 2 && pl.head_dim <= 64))
      return false;
  }
  return true;
}
static_assert(bwd_sm90_plans_fit(), "every plan's tiles fit sm_90's shared memory");
