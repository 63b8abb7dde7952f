// The gfx942 fast kernel's parameter block: AttnParams plus the launch plan (stage, split), shared by host and kernel.
#pragma once
#include "attn_params.h"

#define GFX942_THREADS 512
#define GFX942_HEAD_DIM 128
#define GFX942_Q_ROWS 384      // q rows per workgroup: 8 waves x 3 tiles x 16
#define GFX942_KV_ROWS 64      // kv rows per block: 4 sub-tiles of 16
#define GFX942_VT_BLOCK_BYTES (GFX942_KV_ROWS * GFX942_HEAD_DIM * 2)
#define GFX942_MERGE_ROWS 16   // q rows per merge workgroup
// One tail-split part's partial result: unnormalised fp32 O [384][128], then m [384], l [384].
#define GFX942_PART_BYTES ((long long)GFX942_Q_ROWS * (GFX942_HEAD_DIM + 2) * 4)

enum Gfx942Stage { GFX942_STAGE_VT = 0, GFX942_STAGE_ATTN = 1, GFX942_STAGE_MERGE = 2 };

// Work item = one 384-row q block of one (batch, head), numbered head-first: item = bh*nqb + qb,
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
