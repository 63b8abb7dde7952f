// The gfx942 fast kernel's parameter block: AttnParams plus the launch plan (stage, split), shared by host and kernel.
#pragma once
#include "attn_params.h"

#define GFX942_THREADS 512
#define GFX942_KV_ROWS 64      // kv rows per block: 4 sub-tiles of 16
#define GFX942_MERGE_ROWS 16   // q rows per merge workgroup
// The head-dim buckets (RTC_HEAD_DIM_MAX), increasing: a call's head dim D (a multiple of 8) runs in the
// smallest bucket >= D, its columns D..bucket-1 zeros that are never read from or written to the tensors.
// Why these, and where Q, K and V live in each: docs/NOTES.md, "gfx942 per head-dim bucket".
#define GFX942_BUCKETS 64, 96, 128, 192, 256

// The bucket of head dim d, 0 when none holds it.
RTC_HD constexpr int gfx942_bucket(int d) {
  const int buckets[] = {GFX942_BUCKETS};
  for (int b : buckets)
    if (d <= b) return b;
  return 0;
}
// 16-row q tiles per wave: the O accumulators (and Q, in registers) grow with the bucket, the 256 per-wave
// registers do not; 3 tiles up to 128, 2 at 192, 1 at 256.
RTC_HD constexpr int gfx942_tiles_per_wave(int bucket) { return bucket <= 128 ? 3 : bucket <= 192 ? 2 : 1; }
// q rows per workgroup (work item): 8 waves x tiles x 16.
RTC_HD constexpr int gfx942_q_rows(int bucket) { return 8 * 16 * gfx942_tiles_per_wave(bucket); }
// One 64-row V^T block: the bucket's columns (zeros past the call's D).
RTC_HD constexpr long long gfx942_vt_block_bytes(int bucket) { return (long long)GFX942_KV_ROWS * bucket * 2; }
// One tail-split part's partial result: unnormalised fp32 O [q rows][bucket], then m [q rows], l [q rows].
RTC_HD constexpr long long gfx942_part_bytes(int bucket) { return (long long)gfx942_q_rows(bucket) * (bucket + 2) * 4; }

enum Gfx942Stage { GFX942_STAGE_VT = 0, GFX942_STAGE_ATTN = 1, GFX942_STAGE_MERGE = 2 };

// Work item = one q block (gfx942_q_rows of the bucket) of one (batch, head), numbered head-first: item = bh*nqb + qb,
// the q blocks of a head in descending order under a mask (the last ones see the most keys).
// V^T is per (batch, K/V head): Hk heads, so the q heads of a GQA group share it.
// Workgroups [0, n_prefix) run whole items (ids XCD-swizzled below n_swz); the last `tail`
// items run as split_g KV parts each, workgroups n_prefix + j*split_g + part.
// Packed sequences (RTC_KV): item i is q block nqb - 1 - i / (B*H) of (b, h) = i % (B*H), nqb from
// max_seqlen_q; no split, no swizzle. V^T is per K/V head, vt_head_blocks blocks (gfx942/sequences.h),
// holding every key of every sequence: max_seqlen_k sizes no buffer and bounds no length.
// Everything a launch needs is here: no device-side table, so two streams can run at once.
struct Gfx942Params : AttnParams {
  int stage;         // Gfx942Stage
  int nqb, nkb;      // q blocks per (b, h), kv blocks per (b, h); paged: V^T blocks of a sequence's slot
  int n_prefix;      // items run whole
  int tail;          // items run split (0 = no split)
  int split_g;       // parts per split item (1 when tail == 0)
  int n_swz;         // prefix workgroups remapped so each XCD gets consecutive items (multiple of 8)
  int vt_head_blocks;  // packed: V^T blocks per K/V head (the sequences' blocks one after another)
  rtc_i64 vt_bytes;  // V^T occupies workspace [0, vt_bytes); the partials follow
};

// Paged V^T stage: workgroups per (sequence, K/V head), max_seqlen_k's blocks (at least one, at most the
// slot's nkb); each walks its sequence's blocks with that stride, so a sequence longer than max_seqlen_k
// is still transposed whole, and an honest max_seqlen_k launches no more than one workgroup per block.
RTC_HD int gfx942_paged_vt_stride(int seq_k, int slot_blocks) {
  const int want = seq_k < 1 ? 1 : (int)(((rtc_i64)seq_k + GFX942_KV_ROWS - 1) / GFX942_KV_ROWS);
  return want < slot_blocks ? want : slot_blocks;
}
