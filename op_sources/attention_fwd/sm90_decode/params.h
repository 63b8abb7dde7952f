// The sm_90a decode kernel's shapes per head-dim bucket, shared by host and kernel: the K/V ring in shared memory
// (keys per stage, stages) and what it costs in shared memory. The parameter block DecodeParams, the work item and
// the partials' layout are every decode kernel's (decode_params.h).
#pragma once
#include "decode_params.h"
#include "sm90/params.h"  // Sm90TensorMap

#define SM90_DECODE_WARPS 4                           // a CTA is 4 warps: row tiles x 16-key blocks of a stage
#define SM90_DECODE_THREADS (32 * SM90_DECODE_WARPS)  // 128
#define SM90_DECODE_MAX_ROW_TILES 4  // 16-row tiles of packed q rows per CTA: 1, 2 or 4

// The kernel's parameter block: every decode kernel's, and the row tiles of a work item. An item is row_tiles x 16
// packed rows (row_tiles = 1, 2, 4, the fewest that hold a (sequence, K/V head)'s group x Sq rows, at most
// 4 / col_split): each warp takes a row tile, 16-key blocks of each stage and a share of O's columns (mainloop.h's
// Role), so with a GQA group or Sq that fills more than 16 rows each K/V byte is still read once for up to 64 rows.
// K and V come by TMA through the two tensor maps (boxes of kv_box rows x 128 bytes; paged: the page is the batch
// coordinate, page_shift its log2), which the kernel reads in parameter space (__grid_constant__).
struct alignas(64) Sm90DecodeParams : DecodeParams {
  int row_tiles;
  int kv_box;
  int page_shift;
  int pad_;
  Sm90TensorMap tmap_k, tmap_v;
};

// Per bucket: the depth of the ring of K/V stages and their keys; a CTA keeps stages - 1 stages in flight. Chosen by
// the decode bench (docs/NOTES.md, "sm90 decode kernel"): at 256, 32-key stages let two CTAs share an SM, and the
// warps split O's columns in two so that all four of them have work (two 16-key blocks x two column halves).
struct Sm90DecodePlan {
  int head_dim;   // the bucket (a multiple of 32): tiles are this wide, zeros past the call's D
  int stages;     // K/V stages in the ring
  int keys;       // keys per stage: 64 (a 16-key block per warp); 128 below 96 (two blocks per warp: a stage's
                  // fixed costs over as many bytes as at 128); 32 at 256, where 64 would leave one CTA per SM
  int col_split;  // 1, or 2: two warps share a 16-key block, each with half of O's columns (S computed by both)
  int kv_bits = 16;  // bits of a K/V element in the ring: 16 (the cache in q's dtype), 8 (FP8 E4M3), 4 (FP4 E2M1)
};
// clang-format off: one bucket per row (tests/cpu/test_manifest.py reads the rows)
constexpr Sm90DecodePlan kSm90DecodePlans[] = {
    {32, 3, 128, 1},
    {64, 3, 128, 1},
    {96, 3, 64, 1},
    {128, 3, 64, 1},
    {160, 2, 64, 1},
    {192, 2, 64, 1},
    {256, 3, 32, 2},
};
// clang-format on
constexpr int kSm90DecodePlanCount = int(sizeof(kSm90DecodePlans) / sizeof(kSm90DecodePlans[0]));
RTC_HD constexpr Sm90DecodePlan sm90_decode_plan(int d) {
  for (int i = 0; i < kSm90DecodePlanCount; ++i)
    if (kSm90DecodePlans[i].head_dim >= d) return kSm90DecodePlans[i];
  return kSm90DecodePlans[kSm90DecodePlanCount - 1];
}

// The kv_dtype values the kernel reads (the manifest's sm90_decode entry lists the same): the cache in q's dtype, FP8
// E4M3 and FP4 E2M1, whose bytes travel as they are and are expanded in registers (sm90_decode/kv_frag.h).
RTC_HD constexpr bool sm90_decode_takes_kv(int kv_dtype) {
  return kv_dtype == RTC_KV_DTYPE_SAME || kv_dtype == RTC_KV_DTYPE_FP8_E4M3 || kv_dtype == RTC_KV_DTYPE_FP4_E2M1;
}

// K and V tiles are TMA's: 128-byte column blocks of [stage keys][128 bytes] (64 columns of bf16, 128 of FP8, 256 of
// FP4) under the 128-byte swizzle, one after the other; a stage is K's blocks then V's.
#define SM90_DECODE_BOX_BYTES 128
RTC_HD constexpr int sm90_decode_col_blocks(const Sm90DecodePlan& pl) {
  return (pl.head_dim * pl.kv_bits / 8 + SM90_DECODE_BOX_BYTES - 1) / SM90_DECODE_BOX_BYTES;
}
RTC_HD constexpr int sm90_decode_block_bytes(const Sm90DecodePlan& pl) { return pl.keys * SM90_DECODE_BOX_BYTES; }
RTC_HD constexpr int sm90_decode_stage_bytes(const Sm90DecodePlan& pl) {
  return 2 * sm90_decode_col_blocks(pl) * sm90_decode_block_bytes(pl);
}

// The plan of a bucket for a cache of kv_dtype. A quantized key row is half (FP8) or a quarter (FP4) of a bf16 row,
// so a stage takes twice or four times the keys (at most 128) while that fits in the bf16 stage's shared memory: FP8
// at D 96, 128, 256 and FP4 at every D hold 128 keys (64 at FP8's 256) in the same bytes in flight, with the stages'
// fixed costs over more keys; elsewhere the bf16 plan's keys, in fewer bytes. Not measured yet: the decode bench
// decides (docs/NOTES.md, "sm90_decode over quantized caches").
RTC_HD constexpr Sm90DecodePlan sm90_decode_plan(int d, int kv_dtype) {
  Sm90DecodePlan pl = sm90_decode_plan(d);
  if (kv_dtype == RTC_KV_DTYPE_SAME) return pl;
  const int same_bytes = sm90_decode_stage_bytes(pl);
  pl.kv_bits = kv_dtype == RTC_KV_DTYPE_FP4_E2M1 ? 4 : 8;
  while (2 * pl.keys <= 128) {
    Sm90DecodePlan more = pl;
    more.keys *= 2;
    if (sm90_decode_stage_bytes(more) > same_bytes) break;
    pl = more;
  }
  return pl;
}
// FP4: each stage's E8M0 scales, one byte per key of K and of V, gathered by the threads (sm90_decode/loads.h).
RTC_HD constexpr int sm90_decode_scale_bytes(const Sm90DecodePlan& pl) {
  return pl.kv_bits == 4 ? pl.stages * 2 * pl.keys : 0;
}

// A row of the Q tile in shared memory: the bucket's columns and 16 bytes of padding, so the 8 rows an ldmatrix reads
// start in 8 different 16-byte bank groups (the stride is an odd multiple of 16 bytes for every bucket: 2 * bucket is
// a multiple of 64).
RTC_HD constexpr int sm90_decode_row_bytes(int bucket) { return 2 * bucket + 16; }
RTC_HD constexpr int sm90_decode_q_bytes(int bucket, int row_tiles) {
  return row_tiles * DECODE_ROWS * sm90_decode_row_bytes(bucket);
}
// The merge of a split's parts runs as a CTA per item and 32 columns: an item's partials are read by bucket / 32 CTAs.
RTC_HD constexpr int sm90_decode_merge_slices(int bucket) { return bucket / 32; }
// The warps' partial results, combined at the end through shared memory over the ring: O [warps][16][bucket + 4]
// fp32 and m, l [warps][16].
RTC_HD constexpr int sm90_decode_combine_bytes(int bucket) {
  return SM90_DECODE_WARPS * DECODE_ROWS * ((bucket + 4) + 2) * 4;
}
RTC_HD constexpr int sm90_decode_ring_bytes(const Sm90DecodePlan& pl) {
  return pl.stages * sm90_decode_stage_bytes(pl) > sm90_decode_combine_bytes(pl.head_dim)
             ? pl.stages * sm90_decode_stage_bytes(pl)
             : sm90_decode_combine_bytes(pl.head_dim);
}
// Shared memory of a launch: the ring first (1024-byte aligned for the swizzle: the kernel rounds its base up, hence
// the 1024 more), then Q's row tiles, FP4's scales, then one mbarrier per stage.
RTC_HD constexpr int sm90_decode_smem_bytes(const Sm90DecodePlan& pl, int row_tiles) {
  return 1024 + sm90_decode_ring_bytes(pl) + sm90_decode_q_bytes(pl.head_dim, row_tiles) + sm90_decode_scale_bytes(pl) +
         8 * pl.stages;
}
// CTAs an SM holds: 228 KB of shared memory per SM, 1 KB of it reserved per CTA (the registers allow more).
RTC_HD constexpr int sm90_decode_ctas_per_sm(const Sm90DecodePlan& pl, int row_tiles) {
  return 228 * 1024 / (sm90_decode_smem_bytes(pl, row_tiles) + 1024);
}
RTC_HD constexpr bool sm90_decode_plan_fits(const Sm90DecodePlan& pl) {
  return sm90_decode_smem_bytes(pl, 1) <= 227 * 1024 && pl.head_dim % 32 == 0 && pl.stages >= 2 &&
         (pl.col_split == 1 || pl.col_split == 2) && pl.keys / 16 * pl.col_split >= SM90_DECODE_WARPS &&
         2 * (pl.keys / 16) * sm90_decode_col_blocks(pl) <= 32 && (pl.kv_bits != 4 || pl.keys <= SM90_DECODE_THREADS);
}
RTC_HD constexpr bool sm90_decode_plans_fit() {
  for (int i = 0; i < kSm90DecodePlanCount; ++i)
    if (!sm90_decode_plan_fits(kSm90DecodePlans[i]) ||
        !sm90_decode_plan_fits(sm90_decode_plan(kSm90DecodePlans[i].head_dim, RTC_KV_DTYPE_FP8_E4M3)) ||
        !sm90_decode_plan_fits(sm90_decode_plan(kSm90DecodePlans[i].head_dim, RTC_KV_DTYPE_FP4_E2M1)))
      return false;
  return true;
}
static_assert(
    sm90_decode_plans_fit(),
    "every decode plan (bf16 / fp16, FP8 and FP4 caches) fits sm_90's shared memory with one row tile, buckets "
    "are multiples of 32, a column split is 1 or 2, every warp has a block of each stage (blocks x split >= "
    "warps), warp 0's lanes hold a stage's TMA boxes at the smallest page (16 rows), and an FP4 stage's keys are at "
    "most one per thread (their scales)");
// The row tiles a launch may take: as many as asked (1, 2, 4), fewer where Q's rows would not fit beside the ring,
// and at most one per warp's share of the columns (4 / col_split: every warp takes one row tile).
RTC_HD constexpr int sm90_decode_row_tiles(const Sm90DecodePlan& pl, int wanted) {
  int t = 1;
  while (t < wanted && 2 * t <= SM90_DECODE_MAX_ROW_TILES / pl.col_split &&
         sm90_decode_smem_bytes(pl, 2 * t) <= 227 * 1024)
    t *= 2;
  return t;
}
