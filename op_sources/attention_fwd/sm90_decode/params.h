// The sm_90a decode kernel's shapes per head-dim bucket, shared by host and kernel: the K/V ring in shared memory
// (keys per stage, stages) and what it costs in shared memory. The parameter block DecodeParams, the work item and
// the partials' layout are every decode kernel's (decode_params.h).
#pragma once
#include "decode_params.h"

#define SM90_DECODE_WARPS 4                           // a CTA is 4 warps: row tiles x 16-key blocks of a stage
#define SM90_DECODE_THREADS (32 * SM90_DECODE_WARPS)  // 128
#define SM90_DECODE_STAGE_KEYS (16 * SM90_DECODE_WARPS)
#define SM90_DECODE_MAX_ROW_TILES 4  // 16-row tiles of packed q rows per CTA: 1, 2 or 4

// The kernel's parameter block: every decode kernel's, and the row tiles of a work item. An item is row_tiles x 16
// packed rows (row_tiles = 1, 2, 4, the fewest that hold a (sequence, K/V head)'s group x Sq rows, at most 4): warp w
// takes row tile w / (4 / row_tiles) and 16-key blocks of each stage, so with a GQA group or Sq that fills more than
// 16 rows each K/V byte is still read once for up to 64 rows.
struct Sm90DecodeParams : DecodeParams {
  int row_tiles;
  int pad_;
};

// Per bucket: the depth of the cp.async ring of K/V stages (64 keys each); a CTA keeps stages - 1 stages in flight.
// Chosen by the decode bench (docs/NOTES.md, "sm90 decode kernel"): more CTAs per SM beat a deeper ring at 32 and 64
// (64: 3 stages, 3 CTAs per SM, 70% of copy; 6 stages, 2 CTAs, 62%), 3 stages and two CTAs at 128, and above it one
// CTA of 3-4 stages (about 170-205 KB; 2 stages at 256 lost 3%).
struct Sm90DecodePlan {
  int head_dim;  // the bucket (a multiple of 32): tiles are this wide, zeros past the call's D
  int stages;    // K/V stages in the ring
};
// clang-format off: one bucket per row (tests/cpu/test_manifest.py reads the rows)
constexpr Sm90DecodePlan kSm90DecodePlans[] = {
    {32, 4},
    {64, 3},
    {96, 4},
    {128, 3},
    {160, 4},
    {192, 4},
    {256, 3},
};
// clang-format on
constexpr int kSm90DecodePlanCount = int(sizeof(kSm90DecodePlans) / sizeof(kSm90DecodePlans[0]));
RTC_HD constexpr Sm90DecodePlan sm90_decode_plan(int d) {
  for (int i = 0; i < kSm90DecodePlanCount; ++i)
    if (kSm90DecodePlans[i].head_dim >= d) return kSm90DecodePlans[i];
  return kSm90DecodePlans[kSm90DecodePlanCount - 1];
}

// A row of a Q, K or V tile in shared memory: the bucket's columns and 16 bytes of padding, so the 8 rows an
// ldmatrix reads start in 8 different 16-byte bank groups (the stride is an odd multiple of 16 bytes for every
// bucket: 2 * bucket is a multiple of 64).
RTC_HD constexpr int sm90_decode_row_bytes(int bucket) { return 2 * bucket + 16; }
RTC_HD constexpr int sm90_decode_q_bytes(int bucket, int row_tiles) {
  return row_tiles * DECODE_ROWS * sm90_decode_row_bytes(bucket);
}
RTC_HD constexpr int sm90_decode_stage_bytes(int bucket) {
  return 2 * SM90_DECODE_STAGE_KEYS * sm90_decode_row_bytes(bucket);  // K and V
}
// The warps' partial results, combined at the end through shared memory over the ring: O [warps][16][bucket + 4]
// fp32 and m, l [warps][16].
RTC_HD constexpr int sm90_decode_combine_bytes(int bucket) {
  return SM90_DECODE_WARPS * DECODE_ROWS * ((bucket + 4) + 2) * 4;
}
RTC_HD constexpr int sm90_decode_ring_bytes(const Sm90DecodePlan& pl) {
  return pl.stages * sm90_decode_stage_bytes(pl.head_dim) > sm90_decode_combine_bytes(pl.head_dim)
             ? pl.stages * sm90_decode_stage_bytes(pl.head_dim)
             : sm90_decode_combine_bytes(pl.head_dim);
}
// Shared memory of a launch: the ring first (its offset stays fixed), then Q's row tiles.
RTC_HD constexpr int sm90_decode_smem_bytes(const Sm90DecodePlan& pl, int row_tiles) {
  return sm90_decode_ring_bytes(pl) + sm90_decode_q_bytes(pl.head_dim, row_tiles);
}
// CTAs an SM holds: 228 KB of shared memory per SM, 1 KB of it reserved per CTA (the registers allow more).
RTC_HD constexpr int sm90_decode_ctas_per_sm(const Sm90DecodePlan& pl, int row_tiles) {
  return 228 * 1024 / (sm90_decode_smem_bytes(pl, row_tiles) + 1024);
}
RTC_HD constexpr bool sm90_decode_plans_fit() {
  for (int i = 0; i < kSm90DecodePlanCount; ++i)
    if (sm90_decode_smem_bytes(kSm90DecodePlans[i], 1) > 227 * 1024 || kSm90DecodePlans[i].head_dim % 32 != 0 ||
        kSm90DecodePlans[i].stages < 2)
      return false;
  return true;
}
static_assert(sm90_decode_plans_fit(),
              "every decode plan fits sm_90's shared memory with one row tile, buckets are multiples of 32");
// The row tiles a launch may take: as many as asked (1, 2, 4), fewer where Q's rows would not fit beside the ring.
RTC_HD constexpr int sm90_decode_row_tiles(const Sm90DecodePlan& pl, int wanted) {
  int t = 1;
  while (t < wanted && t < SM90_DECODE_MAX_ROW_TILES && sm90_decode_smem_bytes(pl, 2 * t) <= 227 * 1024) t *= 2;
  return t;
}
