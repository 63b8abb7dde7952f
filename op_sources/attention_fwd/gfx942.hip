// bf16 / fp16 attention forward for MI300X (gfx942; also gfx90a): 8 waves in two phase-offset groups, MFMA 16x16x16,
// K in LDS, V^T via L1, for one head-dim bucket (RTC_HEAD_DIM_MAX) of the call's head dim.
//
// One workgroup = the q rows of one (batch, head) of its bucket (gfx942/params.h: 384 up to head dim 128, 256 at
// 192, 128 at 256); wave w owns 16 x kTilesPerWave of them as 16-row tiles (in VGPRs; at 128 the third in LDS).
// KV is walked in 64-row blocks. We compute S^T = K Q^T, so each lane's S^T fragment is already the B operand
// of O^T = V^T P^T: P never leaves registers. The price is V^T, written by the companion stage GFX942_STAGE_VT
// into the workspace.
//
// Schedule: every wave runs the same loop, "MFMA step; barrier; softmax step; barrier", and waves
// 4..7 (group B) pass one extra barrier first, so at any moment one group feeds the matrix core
// while the other does softmax and memory traffic (see NOTES.md, gfx942):
//   half-step 2k   : A: PV(k-1) + QK(k)            B: softmax(k-1) + K[k+1] HBM -> LDS
//   half-step 2k+1 : A: softmax(k) + V^T(k) -> L1  B: PV(k-1) + QK(k)
// One stage per launch (params.stage): V^T, attention (whole items and tail-split parts), merge.
// Packed sequences (RTC_KV, gfx942/sequences.h): an item is a q block of one (sequence, head), the
// grid covers max_seqlen_q, and paged K/V rows come through per-page buffer resources.
// Score modifications (RTC_SCORE_MOD: the soft cap, ALiBi; gfx942/score_mods.h) go on each tile's scores before its
// softmax, which masks them as a plain variant's.
// Dropout (RTC_DROPOUT; dropout.h, numerics §13): each lane draws its scores' keep bits in the softmax step
// (gfx942/softmax.h, TileDropout); l and the LSE take every p, P V the kept ones scaled.
// The call's head dim d (a multiple of 8) may be below the bucket: its columns past d are zeros in registers and
// LDS, never read from or written to q, k, v or o.
//
// This file is the attention stage's top level and the stage switch. The roles' pieces are in gfx942/:
// scheduler.h (work items), mainloop.h (loads, the MFMA and softmax steps, the walk over KV blocks),
// softmax.h, mask.h, epilogue.h, companions.h (the V^T and merge stages), tiles.h (data placement),
// sequences.h (packed sequences) and score_mods.h (the soft cap, ALiBi).
#ifndef RTC_HEAD_DIM_MAX
#error "RTC_HEAD_DIM_MAX (the head-dim bucket: one of gfx942/params.h's GFX942_BUCKETS) must be defined"
#endif
#include "platform.h"
#include "attn_params.h"
#include "bf16_round.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "kv_quant.h"
#include "gfx942/params.h"
#include "gfx942/tiles.h"
#include "gfx942/softmax.h"
#include "gfx942/companions.h"
#include "gfx942/sequences.h"
#include "gfx942/scheduler.h"
#include "gfx942/mainloop.h"
#include "gfx942/mask.h"
#include "gfx942/epilogue.h"
#include "gfx942/score_mods.h"

static_assert(gfx942_bucket(RTC_HEAD_DIM_MAX) == RTC_HEAD_DIM_MAX,
              "attention_fwd_gfx942: RTC_HEAD_DIM_MAX must be one of gfx942/params.h's GFX942_BUCKETS");
#if RTC_DTYPE != RTC_DTYPE_BF16 && RTC_DTYPE != RTC_DTYPE_FP16
#error "attention_fwd_gfx942 reads and writes bf16 (RTC_DTYPE=0) or fp16 (RTC_DTYPE=1)"
#endif
#if RTC_DTYPE == RTC_DTYPE_FP16 && RTC_ROUND != 0
#error "attention_fwd_gfx942: fp16 rounds to nearest even only (RTC_ROUND=0; the manifest excludes fp16 x rtna / rtz)"
#endif

namespace g942 {

// The attention stage: one work item (whole, or one part of a tail split) of one workgroup, its KV
// loop rotated by half an iteration between the prologue and the last PV step, then the epilogue.
RTC_DEVICE void attn_stage(const Gfx942Params& p, AttnSmem& sm) {
#if RTC_KV == RTC_KV_DENSE
  const Work w = find_work(p);
  const Seq seq = seq_of(p, w.b);
#else
  Seq seq;
  const Work w = find_packed_work(p, seq);
  if (w.rows <= 0) return;  // past its sequence's end (uniform: before any barrier)
#endif
  const int lane = (int)lane_id(), wave = (int)readfirstlane(threadIdx.x >> 6);
  const bool group_b = wave >= 4;
  // nblk through readfirstlane: a window's bounds come from divisions that clang may leave in VGPRs.
  const int xaddr = (lane ^ 32) << 2, nblk = (int)readfirstlane((rtc_u32)(w.kb1 - w.kb0));
  const rtc_buffer_rsrc qr = uniform_rsrc(p.q + seq.q_off + (rtc_i64)w.h * p.q_sh + (rtc_i64)w.q0 * p.q_ss,
                                          rows_span_bytes(w.rows, p.q_ss, p.head_dim));
  const int hk = kv_head(p, w.h);  // GQA/MQA: the K/V head of this q head
#if RTC_SCORE_MOD
  // The item's ALiBi slope, loaded here: loaded where KvWalk is built, its address's kernel arguments were held
  // longer, and the SGPRs past the budget left clang a private segment (the 192 FP4 window paged variants). At 64
  // and 256 it and the modifications' constants move to VGPRs (kModsInVgprs).
  float slope_log2 = uniform_slope_log2(p, w.b, w.h);
  ModParams mods = mod_params(p);
  if (kModsInVgprs) {
    hold<true>(slope_log2);
    hold<true>(mods);
  }
#endif
  const KRows kr = k_rows(p, seq, w.b, hk);
  const rtc_u32 dbytes = (rtc_u32)p.head_dim * 2;
  // Every V^T access stays inside this item's padded blocks by construction, so the record count
  // can be a constant the compiler rematerialises instead of holding an SGPR for it.
  const rtc_buffer_rsrc vt = uniform_rsrc(vt_blocks(p, w, seq, hk), 0xFFFFFFFFll);
  const OutPlan op = out_plan(p, w, seq);
#if GFX942_K_FROM_CACHE
  const rtc_i64 k_ss = p.k_ss;
#else
  // A quantized cache: the K workspace's rows, kBucket elements apart; opaque, so that the K DMA's row addresses are
  // the same scalar work as a cache's in q's dtype (a constant moved them to VALU and readfirstlane).
  rtc_i64 k_ss = kBucket;
  sreg_fence(k_ss);
#endif
  const int seq_k = seq.len_k;
#if RTC_KV_FP8 && RTC_SCORE_MOD
  // FP8's K descale on the score, which the modifications then take (numerics §10, score_mod.h); in a VGPR where the
  // modifications' constants are (kModsInVgprs).
  float c = uniform_descale(p.k_descale, p.kd_sb, p.kd_sh, w.b, hk);
  if (kModsInVgprs) hold<true>(c);
#elif RTC_KV_FP8
  // FP8's K descale with the softmax scale: (q . k) * (k_descale * scale_log2) per score (numerics §10).
  const float c = p.scale_log2 * uniform_descale(p.k_descale, p.kd_sb, p.kd_sh, w.b, hk);
#elif RTC_SCORE_MOD
  const float c = 1.0f;  // the modifications scale the scores (gfx942/score_mods.h)
#else
  const float c = p.scale_log2;
#endif
  Acc a;
  RowState st;
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    st.m[g] = kNegMax;
    st.l[g] = 0.0f;
#pragma unroll
    for (int t = 0; t < kHdTiles; ++t) a.o[g][t] = rtc_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  }
  // No row sees a key (a window, a sequence without keys, or an empty split part): zeros / an empty partial.
  if ((RTC_MASK || RTC_KV != RTC_KV_DENSE) && nblk == 0) {
    epilogue(op, a, st, wave, lane, RowKeys{false, 0, 0, 0, 0});
    return;
  }
  // Stage 0: K(0), K(1) in flight while Q loads; then group B falls one half-step behind.
  if (group_b) {
    issue_k(sm, kr, k_ss, w.kb0, 0, wave - 4, lane, dbytes);
    if (nblk > 1) issue_k(sm, kr, k_ss, w.kb0 + 1, 1, wave - 4, lane, dbytes);
  }
  load_q(a, sm, qr, p.q_ss, w.rows, p.head_dim, wave, lane);
  s_waitcnt_vmcnt<0>();
  __syncthreads();
  if (group_b) __syncthreads();
#if RTC_DROPOUT
  // Dropout's loop constants: the row and (sequence, head) words of the Philox counter in VGPRs, the threshold, the
  // factor and the generator state's pointer in SGPRs. The attention stage has few SGPRs to spare (all five in SGPRs,
  // the 64 paged window variants spilled SGPRs to VGPR lanes) and at 128 few VGPRs (all four in VGPRs, gfx950's 128
  // paged window variant spilled VGPRs).
  rtc_u32 drop_threshold = p.drop_threshold;
  float drop_scale = p.drop_scale;
  int drop_bh = w.bh, drop_row0 = w.q0 + kRowsPerWave * wave;
  sreg_fence(drop_threshold);
  sreg_fence(drop_scale);
  reg_fence(drop_bh);
  reg_fence(drop_row0);
#endif
  const KvWalk kw = {kr,
                     vt,
                     k_ss,
                     w.kb0,
                     nblk,
                     seq_k,
                     dbytes,
                     c,
                     wave,
                     lane,
                     xaddr,
                     group_b,
                     w.q0 + kRowsPerWave * wave + (lane & 15) + seq_k - seq.len_q,
                     p.window_left,
                     p.window_right
#if RTC_KV_FP4
                     ,
                     key_factors(p, seq, w.b, hk)
#endif
#if RTC_SCORE_MOD
                         ,
                     mods,
                     slope_log2
#endif
#if RTC_DROPOUT
                     ,
                     p.rng_state,
                     drop_threshold,
                     drop_scale,
                     drop_bh,
                     drop_row0
#endif
  };
  // Iteration k is "MFMA step(k); barrier; softmax(k); barrier". The loop is rotated by half an
  // iteration: MFMA step 0 (QK only) before it, softmax(nblk-1) and the PV-only step after it.
  // So the loop body has neither the PV/QK switches nor the kv mask, which only the last block
  // needs (see softmax_tile). Under a window, the blocks a window cuts run the same body with the
  // masked softmax, in their own loops before and after the unmasked one.
  // soffsets through readfirstlane: clang 15 (hipRTC 5.2) does not legalise a VGPR soffset.
  mfma_step(a, sm, vt, 0u, 0, false, true, wave, lane);
  __syncthreads();
#if RTC_MASK
  const int fb = w.fb - w.kb0, fe = w.fe - w.kb0;  // full blocks, relative to kb0
  int k = walk<true>(kw, a, st, sm, 1, fb < nblk - 1 ? fb + 1 : nblk);
  k = walk<false>(kw, a, st, sm, k, fe < nblk - 1 ? fe + 1 : nblk);
  walk<true>(kw, a, st, sm, k, nblk);
  softmax_step<true, true>(kw, a, st, sm, nblk - 1);
#else
  walk<false>(kw, a, st, sm, 1, nblk);
  softmax_step<true>(kw, a, st, sm, nblk - 1);
#endif
  // The PV of the last block, alone: the same half-step as every other MFMA step.
  mfma_step(a, sm, vt, readfirstlane((rtc_u32)(w.kb1 - 1) * kVtBlockBytes), 0, true, false, wave, lane);
  __syncthreads();
  s_waitcnt_vmcnt<0>();
  __syncthreads();
  if (!group_b) __syncthreads();  // matches group B's stagger barrier
#if RTC_KV_FP8
  // FP8's V descale on O, with 1 / l (numerics §10).
  const float o_scale = uniform_descale(p.v_descale, p.vd_sb, p.vd_sh, w.b, hk);
#else
  const float o_scale = 1.0f;
#endif
  epilogue(op, a, st, wave, lane, RowKeys{true, w.q0 + seq_k - seq.len_q, kw.left, kw.right, kw.seq_k}, o_scale);
}

}  // namespace g942

RTC_KERNEL(GFX942_THREADS) attention_fwd_gfx942(Gfx942Params p) {
  RTC_SHARED(g942::Smem, sm);
  if (p.stage == GFX942_STAGE_VT)
    g942::vt_stage(p, sm);
  else if (p.stage == GFX942_STAGE_ATTN)
    g942::attn_stage(p, sm.attn);
  else if (RTC_KV == RTC_KV_DENSE)  // packed calls run no split
    g942::merge_stage(p);
}
RTC_EXPORT_KERNEL(attention_fwd_gfx942, Gfx942Params)
