// Parameter block and tile constants of the sm_90a attention kernel, shared by host and kernel.
#pragma once
#include "attn_params.h"

// Tile shape and pipeline depth. The host sizes shared memory and the tensor-map boxes from these.
#define SM90_BLOCK_M 128        // q rows per tile: 2 consumer warpgroups x 64 rows
#define SM90_BLOCK_N 128        // kv rows per pipeline stage
#define SM90_HEAD_DIM 128
#define SM90_STAGES 2
#define SM90_THREADS 384        // producer warpgroup + 2 consumer warpgroups
// A TMA box is at most 128 bytes wide under the 128-byte swizzle: each tile is loaded as two
// column halves of 64 bf16, stored one after the other ([half][rows][64]).
#define SM90_BOX_D 64
#define SM90_Q_BYTES (SM90_BLOCK_M * SM90_HEAD_DIM * 2)
#define SM90_KV_BYTES (SM90_BLOCK_N * SM90_HEAD_DIM * 2)
#define SM90_BAR_BYTES 256
// Q tiles in shared memory per K/V mode: dense calls load the next tile's Q while this one runs (its
// first Q K^T goes out with this tile's last P V); packed calls keep one (the state carried from tile
// to tile spilled in their builds).
#define SM90_Q_STAGES(kv) ((kv) == RTC_KV_DENSE ? 2 : 1)
// +1024: the kernel rounds the dynamic shared-memory base up to the 1024-byte swizzle period.
#define SM90_SMEM_BYTES(kv) (SM90_Q_STAGES(kv) * SM90_Q_BYTES + 2 * SM90_STAGES * SM90_KV_BYTES + SM90_BAR_BYTES + 1024)

// A CUtensorMap: 128 opaque bytes, 64-byte aligned (cuTensorMapEncodeTiled fills it).
struct alignas(64) Sm90TensorMap {
  rtc_u64 opaque[16];
};

// Tensor maps are 4-D over (d, s, h, b), element bf16, strides in bytes from AttnParams,
// box (SM90_BOX_D, SM90_BLOCK_M or SM90_BLOCK_N, 1, 1), 128-byte swizzle, zero fill out of bounds.
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
  int num_m_blocks;   // ceil(seq_q / SM90_BLOCK_M) (packed: of max_seqlen_q)
  int num_tiles;      // num_m_blocks * heads * batch; the grid is min(num_tiles, SMs) (packed: a bound)
  int kv_box;         // paged: rows of a K/V TMA box, min(page_size, SM90_BLOCK_N); else SM90_BLOCK_N
  int page_shift;     // paged: log2(page_size) (page sizes are powers of two)
};
