// Parameter block and tile constants of the sm_90a attention kernel, shared by host and kernel.
#pragma once
#include "attn_params.h"

// The tile plan of each head-dim bucket: the kernel is compiled for one (RTC_HEAD_DIM_MAX, the manifest's
// bucket), the host sizes shared memory and the tensor-map boxes from the same entry. Tiles are `head_dim`
// columns wide; a call's D below its bucket reads zeros past D (TMA fills the columns out of bounds) and
// stores only D columns. The buckets and their plans were chosen by measurement (docs/NOTES.md,
// "sm90 per head-dim bucket"); the manifest's sm90 buckets are this list (tests/cpu/test_sm90_compile.py).
struct Sm90Plan {
  int head_dim;  // the bucket, a multiple of 32: the GEMMs' head-dim extent; the tiles hold whole 64-column
                 // blocks (SM90_BOX_D), zeros past the call's D
  int block_n;   // kv rows per pipeline stage, a multiple of 16
  int stages;    // depth of the K and V rings
  int q_stages;  // Q tiles of a dense call: 2 lets a tile's first Q K^T go out with the previous tile's
                 // last P V (consume_tile, sm90.cu); packed calls keep 1 (their carried state spilled)
  int consumers; // consumer warpgroups, 64 q rows each: the tile is 64 * consumers rows, and they take
                 // their turns at the tensor cores in a ring (2: ping-pong)
  int open_block_n;  // kv rows per stage of the open variant (no mask, dense K/V): it carries no window state and
                     // no packed rows, so a wider block fits its registers where the others spill (sm90_plan)
  int open_consumers;  // consumer warpgroups of the open variant: three hide its softmax better at 96, where the
                       // masked ones, with their per-block mask, lose at three (docs/NOTES.md)
  int rescale_first; // 1: a block's O rescale goes before its P V issue, under the Q K^T GEMM (the factor of the
                     // block before); 0: after the P V wait, interleaved with the exponentials (mainloop.h)
  int open_overlap;  // 1: with one Q tile (q_stages 1) the open variant still overlaps across tiles, its last P V
                     // waiting for the next Q to land in the slot it frees; the masked ones lost there (NOTES)
};
// clang-format off: one bucket per row (tests/cpu/test_manifest.py reads the rows)
constexpr Sm90Plan kSm90Plans[] = {
    {32, 112, 2, 2, 3, 128, 3, 0, 0},
    {64, 96, 2, 2, 3, 128, 3, 0, 0},
    {96, 128, 2, 2, 2, 112, 3, 0, 0},
    {128, 128, 2, 2, 2, 128, 2, 0, 0},
    {160, 112, 2, 1, 2, 112, 2, 1, 1},
    {192, 112, 2, 1, 2, 112, 2, 1, 1},
    {256, 80, 2, 1, 2, 80, 2, 1, 0},
};
// clang-format on
constexpr int kSm90PlanCount = int(sizeof(kSm90Plans) / sizeof(kSm90Plans[0]));
// The plan of the smallest bucket that holds head dim d (the last one past every bucket).
RTC_HD constexpr Sm90Plan sm90_bucket_plan(int d) {
  for (int i = 0; i < kSm90PlanCount; ++i)
    if (kSm90Plans[i].head_dim >= d) return kSm90Plans[i];
  return kSm90Plans[kSm90PlanCount - 1];
}
// The plan of one variant (kernel and host alike, from RTC_MASK and RTC_KV): its bucket's, with the open block width
// and consumer count for the open variant (no mask, dense K/V). The masked dense variant keeps block_n (wider ones
// were slower: docs/NOTES.md), and so do the packed ones, varlen and paged alike, so that a paged call gives the
// packed call's bits (the gather only moves where rows come from) and a quantized cache the bits of its dequantized
// values packed (tests/gpu/test_paged_gather_gpu.py, test_sm90_kvquant_gpu.py).
RTC_HD constexpr Sm90Plan sm90_plan(int d, bool masked, int kv) {
  Sm90Plan pl = sm90_bucket_plan(d);
  if (!masked && kv == RTC_KV_DENSE) {
    pl.block_n = pl.open_block_n;
    pl.consumers = pl.open_consumers;
  }
  return pl;
}
// The smallest head dim bucket d serves: 8 past the bucket below it (head dims are multiples of 8).
RTC_HD constexpr int sm90_min_head_dim(int d) {
  int below = 0;
  for (int i = 0; i < kSm90PlanCount; ++i)
    if (kSm90Plans[i].head_dim < d) below = kSm90Plans[i].head_dim;
  return below + 8;
}

// q rows per tile: 64 per consumer warpgroup; threads: the producer warpgroup and the consumers.
RTC_HD constexpr int sm90_block_m(const Sm90Plan& pl) { return 64 * pl.consumers; }
RTC_HD constexpr int sm90_threads(const Sm90Plan& pl) { return 128 * (1 + pl.consumers); }
// A TMA box is at most 128 bytes wide under the 128-byte swizzle: each tile is loaded as column blocks
// of 64 16-bit elements, stored one after the other ([block][rows][64]).
#define SM90_BOX_D 64
#define SM90_BAR_BYTES 256
// 64-column blocks of a tile (the 128-byte swizzle's width): a bucket of 96 keeps two, its GEMMs reading 96 columns.
RTC_HD constexpr int sm90_col_blocks(const Sm90Plan& pl) { return (pl.head_dim + SM90_BOX_D - 1) / SM90_BOX_D; }
RTC_HD constexpr int sm90_q_bytes(const Sm90Plan& pl) {
  return sm90_block_m(pl) * sm90_col_blocks(pl) * SM90_BOX_D * 2;
}
RTC_HD constexpr int sm90_kv_bytes(const Sm90Plan& pl) { return pl.block_n * sm90_col_blocks(pl) * SM90_BOX_D * 2; }
RTC_HD constexpr int sm90_q_stages(const Sm90Plan& pl, int kv) { return kv == RTC_KV_DENSE ? pl.q_stages : 1; }
// Whether a variant issues a tile's first Q K^T with the previous tile's last P V (consume_tile, sm90.cu): dense
// calls with two Q tiles, and the open variant with one where the plan says so; packed calls never (their carried
// state spilled).
RTC_HD constexpr bool sm90_overlaps_tiles(const Sm90Plan& pl, bool masked, int kv) {
  return kv == RTC_KV_DENSE && (pl.q_stages == 2 || (!masked && pl.open_overlap != 0));
}
// +1024: the kernel rounds the dynamic shared-memory base up to the 1024-byte swizzle period.
RTC_HD constexpr int sm90_smem_bytes(const Sm90Plan& pl, int kv) {
  return sm90_q_stages(pl, kv) * sm90_q_bytes(pl) + 2 * pl.stages * sm90_kv_bytes(pl) + SM90_BAR_BYTES + 1024;
}
constexpr int kSm90MaxShared = 227 * 1024;  // sm_90's opt-in limit per block
RTC_HD constexpr bool sm90_plans_fit() {
  for (int i = 0; i < kSm90PlanCount; ++i)
    for (int kv = 0; kv < 3; ++kv)
      for (int masked = 0; masked < 2; ++masked) {
        const Sm90Plan pl = sm90_plan(kSm90Plans[i].head_dim, masked, kv);
        if (sm90_smem_bytes(pl, kv) > kSm90MaxShared || pl.head_dim % 32 != 0 || pl.block_n % 16 != 0 ||
            pl.consumers < 2 || pl.consumers > 3)
          return false;
      }
  return true;
}
static_assert(sm90_plans_fit(),
              "every plan's tiles fit sm_90's shared memory; buckets are multiples of 32; 2 or 3 consumer warpgroups");

// A CUtensorMap: 128 opaque bytes, 64-byte aligned (cuTensorMapEncodeTiled fills it).
struct alignas(64) Sm90TensorMap {
  rtc_u64 opaque[16];
};

// Tensor maps are 4-D over (d, s, h, b), element bf16 or fp16, strides in bytes from AttnParams,
// box (SM90_BOX_D, the plan's block_m or block_n, 1, 1), 128-byte swizzle, zero fill out of bounds.
// The same map serves bshd and bhsd: the layout lives in the strides.
// Under a mask the tiles differ in length: the CTAs take them dynamically, longest first, from a
// counter in the workspace (zeroed by the launch), so they end together.
// Packed sequences take their tiles the same way, in the order of sm90/schedule.h, whose table
// lives in shared memory after the barrier slots.
#define SM90_WORKSPACE_BYTES 16
// Bytes of that table for `batch` sequences and `levels` m-blocks: m-block counts and the sorted
// sequences (4 bytes each), three arrays over the levels and the pair count.
#define SM90_SCHEDULE_BYTES(batch, levels) (4LL * (2LL * (batch) + 3LL * ((levels) + 1) + 1))

struct alignas(64) Sm90AttnParams {
  Sm90TensorMap tmap_q;
  Sm90TensorMap tmap_k;
  Sm90TensorMap tmap_v;
  AttnParams a;
  int num_m_blocks;   // ceil(seq_q / block_m) (packed: of max_seqlen_q)
  int num_tiles;      // num_m_blocks * heads * batch; the grid is min(num_tiles, SMs) (packed: a bound)
  int kv_box;         // paged: rows of a K/V TMA box, gcd(page_size, block_n); else block_n
  int page_shift;     // paged: log2(page_size) (page sizes are powers of two)
  int l2_heads;       // dense, masked: (batch, head) pairs per section of the tile order (sm90/scheduler.h)
  // A quantized K / V cache (RTC_KV_DTYPE != SAME, sm90/expand.h): two launches, the expansion then the attention.
  int stage;          // SM90_STAGE_EXPAND or SM90_STAGE_ATTN
  int kv_slot;        // paged: workspace rows of a sequence, min(block-table capacity, max_seqlen_k)
  int expand_ctas;    // expansion: CTAs per (sequence, K/V head)
  int expand_lanes;   // expansion: lanes per cache row (a power of two <= 32)
  rtc_elem_t* kx;     // the expanded K and V in the workspace: [rows, heads_k, D], 16-bit elements of q's dtype
  rtc_elem_t* vx;
};
#define SM90_STAGE_ATTN 0
#define SM90_STAGE_EXPAND 1
// The tile order's sections hold the K/V of about this many bytes, so that the CTAs running together find
// their blocks in L2 (FlashAttention-3 sizes its sections to 32 MB of the H100's 50 MB L2, as here).
#define SM90_L2_SECTION_BYTES (32LL << 20)
