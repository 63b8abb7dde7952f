// bf16 / fp16 attention forward for decode on sm_90a (H100/H200): few query rows per sequence (at most 16), a pass
// over the KV cache at the memory's speed, for one head-dim bucket (RTC_HEAD_DIM_MAX) of the call's head dim.
//
// A CTA is four warps and one work item: up to 64 packed q rows (one to four 16-row tiles) of one (sequence, K/V
// head), every q head of the K/V head and every query row of the sequence (row R = i * group + g), the M rows of
// mma.sync m16n8k16, so each K/V byte is read once per 64 packed rows. Warp 0 gathers the K and V rows of each
// stage (64 keys; 128 below 96, 32 at 256) by TMA (boxes through the block table when paged, one per lane) into a ring of stages
// in shared memory; each warp takes a row tile, 16-key blocks of every stage and (at 256, two warps to a block) a
// share of O's columns, with its own row max, sum and O, and a row tile's warps are combined at the end. When the batch cannot fill the GPU the host splits each item's stages
// into parts (CTAs of their own) that write partials, and a second launch of the same kernel (the merge stage)
// combines them by LSE in part order: no atomics, the same bits on every run.
// The design and its reasons: docs/design-sm90-decode.md.
//
// This file is the stage switch and the attention stage's top level. The roles' pieces are in sm90_decode/:
// params.h (the shapes per bucket and cache element), scheduler.h (work items), mask.h (a row's keys), loads.h (Q, the
// TMA gathers of the K/V stages, FP4's scales), kv_frag.h (the MMAs' fragments, a quantized cache's bytes expanded),
// mainloop.h (MMAs, scales, softmax, the KV loop) and epilogue.h (the warps' combine, O, LSE, partials and the
// merge). K/V in q's dtype, FP8 E4M3 or FP4 E2M1 + E8M0 (RTC_KV_DTYPE; docs/numerics.md §10). Shared with the prefill kernel: sm90/softmax.h (scaled max, exponentials, packing, ZeroSumRow) and
// csrc_common/ptx_sm90.h; with every decode kernel: decode_params.h.
// The soft cap and ALiBi (RTC_SCORE_MOD) go on the dequantized scores before the mask (sm90_decode/mask.h,
// csrc_common/score_mod_sm90.h).
#ifndef RTC_HEAD_DIM_MAX
#error "RTC_HEAD_DIM_MAX (the head-dim bucket: one of sm90_decode/params.h's plans) must be defined"
#endif
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"
#include "sm90/softmax.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90_decode/mask.h"
#include "sm90_decode/loads.h"
#include "sm90_decode/kv_frag.h"
#include "sm90_decode/mainloop.h"
#include "sm90_decode/epilogue.h"

static_assert(sm90_decode_plan(RTC_HEAD_DIM_MAX).head_dim == RTC_HEAD_DIM_MAX,
              "attention_fwd_sm90_decode: RTC_HEAD_DIM_MAX must be one of sm90_decode/params.h's buckets");
static_assert(sm90_decode_takes_kv(RTC_KV_DTYPE),
              "attention_fwd_sm90_decode reads a cache in q's dtype (RTC_KV_DTYPE=0), FP8 E4M3 (1) or FP4 E2M1 (3)");
#if RTC_DTYPE != RTC_DTYPE_BF16 && RTC_DTYPE != RTC_DTYPE_FP16
#error "attention_fwd_sm90_decode reads and writes bf16 (RTC_DTYPE=0) or fp16 (RTC_DTYPE=1)"
#endif
#if RTC_DTYPE == RTC_DTYPE_FP16 && RTC_ROUND != 0
#error "attention_fwd_sm90_decode: fp16 rounds to nearest even only (RTC_ROUND=0)"
#endif

namespace sm90dec {

// One work item, or one part of it: Q and the KV loop over its stages, each row tile's warps combined, then O and
// LSE, or the partial.
RTC_DEVICE void attn_stage(const Sm90DecodeParams& p, const Smem& sm) {
  Seq seq;
  Work w;
  // Grid padding, or a chunk that holds no row of its sequence (uniform over the CTA).
  if (!find_work(p, (int)blockIdx.x, false, w, seq) || w.i1 <= w.i0) return;
  const int tid = (int)threadIdx.x, lane = tid % 32;
  const Role role = Role::of(tid / 32, p.row_tiles);
  const int rt = role.rt;
  const RowKeys rk[2] = {row_keys(p, w, seq, 16 * rt + lane / 4), row_keys(p, w, seq, 16 * rt + lane / 4 + 8)};
  if (tid == 0) {
    for (int x = 0; x < kStages; ++x) sm90::mbar_init(sm.bar(x), 1);
    sm90::mbar_init_fence();
  }
  __syncthreads();  // the barriers are initialised before any copy signals them
  load_q(p, w, seq, sm, tid);
  sm90::cp_async_commit();
  WarpState st;
  st.init();
  kv_loop(p, w, seq, sm, rk, st, tid);
  stash_warp(sm, st, p.row_tiles, tid);
  __syncthreads();
  for (int t = 0; t < p.row_tiles; ++t) {
    RowSum acc;
    combine_tile(sm, t, role.groups, acc, softmax_scale_log2(p), tid);
    if (p.splits > 1)
      write_part(part_of(p, w.item, w.part, t), acc, tid);
    else
      write_row(p, w, seq, row_keys(p, w, seq, 16 * t + tid / 8), acc, tid % 8, 0);
  }
}

// One slice of one item's merge (sm90_decode_merge_slices: 32 columns a CTA): its parts' partials, in part order, into
// O and the LSE, row tile by row tile.
RTC_DEVICE void merge_stage(const Sm90DecodeParams& p) {
  Seq seq;
  Work w;
  const int slices = sm90_decode_merge_slices(kBucket), slice = (int)blockIdx.x % slices;
  if (!find_work(p, (int)blockIdx.x / slices, true, w, seq) || w.i1 <= w.i0) return;
  const int tid = (int)threadIdx.x;
  for (int t = 0; t < p.row_tiles; ++t) {
    MergeSum acc;
    merge_parts(p, w.item, t, slice * kMergePairs, acc, tid);
    write_row(p, w, seq, row_keys(p, w, seq, 16 * t + tid / 8), acc, tid % 8, slice * kMergePairs);
  }
}

}  // namespace sm90dec

// The tensor maps are read by TMA in parameter space: the block is a __grid_constant__.
RTC_KERNEL(SM90_DECODE_THREADS) attention_fwd_sm90_decode(const __grid_constant__ Sm90DecodeParams p) {
  extern __shared__ __align__(1024) unsigned char sm90_decode_smem[];
  const sm90dec::Smem sm{(sm90::smem_addr(sm90_decode_smem) + 1023u) & ~1023u, p.row_tiles};
  if (p.stage == DECODE_STAGE_ATTN)
    sm90dec::attn_stage(p, sm);
  else
    sm90dec::merge_stage(p);
}
RTC_EXPORT_KERNEL(attention_fwd_sm90_decode, Sm90DecodeParams)
