// bf16 / fp16 attention forward for decode on MI300X (gfx942; also gfx90a): few query rows per sequence (at most 16),
// a pass over the KV cache at the memory's speed, for one head-dim bucket (RTC_HEAD_DIM_MAX) of the call's head dim.
//
// One workgroup is one wave. Its work item is 16 packed q rows of one (sequence, K/V head): every q head of the
// K/V head and every query row of the sequence, row R = i * group + g, are the M rows of the MFMAs, so each K/V byte is
// read once per 16 packed rows (once for every call with group x Sq <= 16). K and V go from memory straight into
// registers (buffer loads through one resource per (sequence, K/V head), or per page), S^T = K Q^T and O^T = V^T P^T
// on v_mfma_f32_16x16x16, V^T through a 16-key LDS tile. When the batch cannot fill the GPU the host splits each
// item's KV steps into parts (workgroups of their own) that write partials, and a second launch of the same kernel
// (the merge stage) combines them by LSE in a fixed order: no atomics, the same bits on every run.
// The design and its reasons: docs/design-gfx942-decode.md.
//
// This file is the stage switch and the attention stage's top level. The roles' pieces are in gfx942_decode/:
// params.h (the parameter block and the shapes), scheduler.h (work items), mask.h (a row's keys), kv_cache.h (K / V
// rows into registers; a quantized cache's bytes and their exact expansion), mainloop.h (MFMAs, the KV loop),
// softmax.h, epilogue.h (O, LSE, partials and the merge). Shared with the prefill kernel:
// gfx942/tiles.h (buffer resources, fragments), gfx942/softmax.h (row reductions, P and O rounding, ZeroSumRow),
// gfx942/sequences.h (paged rows through per-page resources) and gfx942/score_mods.h (the soft cap and ALiBi, on the
// scores before the softmax: RTC_SCORE_MOD).
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
#include "gfx942/sequences.h"
#include "gfx942/score_mods.h"
#include "gfx942_decode/params.h"
#include "gfx942_decode/scheduler.h"
#include "gfx942_decode/mask.h"
#include "gfx942_decode/softmax.h"
#include "gfx942_decode/kv_cache.h"
#include "gfx942_decode/mainloop.h"
#include "gfx942_decode/epilogue.h"

static_assert(gfx942_bucket(RTC_HEAD_DIM_MAX) == RTC_HEAD_DIM_MAX,
              "attention_fwd_gfx942_decode: RTC_HEAD_DIM_MAX must be one of gfx942/params.h's GFX942_BUCKETS");
#if RTC_DTYPE != RTC_DTYPE_BF16 && RTC_DTYPE != RTC_DTYPE_FP16
#error "attention_fwd_gfx942_decode reads and writes bf16 (RTC_DTYPE=0) or fp16 (RTC_DTYPE=1)"
#endif
#if RTC_DTYPE == RTC_DTYPE_FP16 && RTC_ROUND != 0
#error "attention_fwd_gfx942_decode: fp16 rounds to nearest even only (RTC_ROUND=0)"
#endif

namespace gdec {

// One work item, or one part of it: its rows' keys, Q, the KV loop over its steps, then O and LSE, or the partial.
RTC_DEVICE void attn_stage(const DecodeParams& p, Smem& sm) {
  Seq seq;
  Work w;
  // Grid padding, or a chunk that holds no row of its sequence (uniform).
  if (!find_work(p, (int)blockIdx.x, false, w, seq) || w.i1 <= w.i0) return;
  const int lane = (int)lane_id();
  const RowKeys rk = row_keys(p, w, seq, lane & 15);
  const rtc_buffer_rsrc qr = g942::uniform_rsrc(p.q + seq.q_off + (rtc_i64)w.hk * p.group * p.q_sh,
                                                decode_group_span_bytes(w.i1, p.q_ss, p.group, p.q_sh, p.head_dim));
  const rtc_u32 q_row = rk.i < 0 ? 0u : (rtc_u32)(((rtc_i64)rk.i * p.q_ss + (rtc_i64)rk.g * p.q_sh) * 2);
  QOperand q;
  load_q(q, qr, q_row, rk.i >= 0, lane, p.head_dim);
  const KvRows kr = kv_rows(p, false, seq, w.b, w.hk);
  const KvRows vr = kv_rows(p, true, seq, w.b, w.hk);
  LoopState st;
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) st.o[t] = rtc_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  st.m = g942::kNegMax;
  st.l = 0.0f;
#if RTC_SCORE_MOD
  st.mods = g942::mod_params(p);
  st.slope_log2 = g942::row_slope_log2(p, w.b, w.hk * p.group + rk.g);
  st.diag = g942::key_distance(rk.i, seq.len_q - seq.len_k);  // (a row of no query: anything, its keys masked)
#endif
#if RTC_KV_FP8
  const float k_descale = kv_descale(p.k_descale, p.kd_sb, p.kd_sh, w.b, w.hk);
#else
  const float k_descale = 1.0f;
#endif
  kv_loop(sm, kr, vr, q, st, w.kb0, w.kb1, p.head_dim, p.scale_log2, k_descale, rk.lo, rk.hi, lane);
#if RTC_KV_FP8
  // O of the dequantized values, before / l (numerics §10); a split part's partial likewise (the merge is linear).
  const float v_descale = kv_descale(p.v_descale, p.vd_sb, p.vd_sh, w.b, w.hk);
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) st.o[t] *= v_descale;
#endif
  const float l = g942::row_sum4(st.l, (lane ^ 32) << 2);
  if (p.splits > 1)
    write_part(part_of(p, ((rtc_i64)w.b * p.heads_k + w.hk) * p.chunks + w.chunk, w.part), st.o, st.m, l, rk, lane);
  else
    write_row(out_rows(p, w, seq, rk), st.o, st.m, l, rk, lane, p.head_dim);
}

// One item's merge for one 16-column tile of O (workgroup item * tiles + t, tiles = ceil(d / 16)): its parts'
// partials, in a fixed order (merge_tile), into O (and, tile 0, the LSE).
RTC_DEVICE void merge_stage(const DecodeParams& p) {
  Seq seq;
  Work w;
  const int tiles = (p.head_dim + 15) / 16, item = (int)blockIdx.x / tiles, t = (int)blockIdx.x - item * tiles;
  if (!find_work(p, item, true, w, seq) || w.i1 <= w.i0) return;
  const int lane = (int)lane_id();
  // The item's rows of the call (packed rows 16 chunk .. i1 group - 1), and the merge's lanes by them.
  const int live = w.i1 * p.group - w.chunk * DECODE_ROWS;
  const int rows = decode_merge_rows(live < DECODE_ROWS ? live : DECODE_ROWS);
  const RowKeys rk = row_keys(p, w, seq, lane & (rows - 1));
  merge_tile(p, item, t, out_rows(p, w, seq, rk), rk, lane, rows);
}

}  // namespace gdec

#if defined(RTC_EMU)
#define DECODE_OCCUPANCY
#else
#define DECODE_OCCUPANCY __attribute__((amdgpu_waves_per_eu(decode_min_waves(RTC_HEAD_DIM_MAX, RTC_KV_DTYPE, RTC_GFX))))
#endif

RTC_KERNEL(DECODE_THREADS) DECODE_OCCUPANCY attention_fwd_gfx942_decode(DecodeParams p) {
  RTC_SHARED(gdec::Smem, sm);
  if (p.stage == DECODE_STAGE_ATTN)
    gdec::attn_stage(p, sm);
  else
    gdec::merge_stage(p);
}
RTC_EXPORT_KERNEL(attention_fwd_gfx942_decode, DecodeParams)
