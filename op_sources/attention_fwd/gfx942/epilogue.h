// The gfx942 kernel's epilogue: where a work item's output goes (O rows, LSE, or a split part's partials),
// and the row sums across lanes, O / l in the rounding mode and the LSE, or the unnormalised partial.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bf16_round.h"
#include "isa_gfx9.h"
#include "gfx942/params.h"
#include "gfx942/tiles.h"
#include "gfx942/softmax.h"
#include "gfx942/scheduler.h"
#include "gfx942/mask.h"

namespace g942 {

// Where the epilogue writes, built before the kv loop so that only these few uniform values (not
// the whole parameter block) stay in SGPRs across it.
struct OutPlan {
  rtc_buffer_rsrc o;   // this q block's O rows
  rtc_u32 o_row_bytes;
  char* aux;           // split part: its partials; whole item: LSE of row q0 (null: not requested)
  // Valid rows (bits 0..15), | kSplitFlag for a split part, | the call's head dim << kDimShift: one SGPR where
  // three would be (gfx90a is at the limit).
  int rows;
};
constexpr int kSplitFlag = 1 << 16, kDimShift = 17;
RTC_DEVICE int plan_rows(const OutPlan& op) { return op.rows & (kSplitFlag - 1); }
RTC_DEVICE int plan_dim(const OutPlan& op) { return op.rows >> kDimShift; }

RTC_DEVICE OutPlan out_plan(const Gfx942Params& p, const Work& w, const Seq& s) {
  OutPlan op;
  op.o = uniform_rsrc(p.o + s.o_off + (rtc_i64)w.h * p.o_sh + (rtc_i64)w.q0 * p.o_ss,
                      rows_span_bytes(w.rows, p.o_ss, p.head_dim));
  op.o_row_bytes = (rtc_u32)(p.o_ss * 2);
  if (w.part >= 0)
    op.aux = (char*)p.workspace + p.vt_bytes + (rtc_i64)w.part * kPartBytes;
  else if (RTC_KV == RTC_KV_DENSE)
    op.aux = p.lse ? (char*)(p.lse + ((rtc_i64)w.b * p.heads + w.h) * p.seq_q + w.q0) : nullptr;
  else  // packed: [heads, total_q]
    op.aux = p.lse ? (char*)(p.lse + s.lse_off + (rtc_i64)w.h * s.lse_head_stride + w.q0) : nullptr;
  op.rows = w.rows | (w.part >= 0 ? kSplitFlag : 0) | (p.head_dim << kDimShift);
  return op;
}

// Stage 3 (epilogue): row sums across lanes, then O / l in the rounding mode and the LSE, or the
// unnormalised partial (O, m, l) of a split part. o_scale: a quantized FP8 cache's v_descale, on 1 / l (packed
// calls: never a split part); 1 otherwise.
RTC_DEVICE void epilogue(const OutPlan& op, Acc& a, RowState& st, int wave, int lane_in, const RowKeys& rk,
                         float o_scale = 1.0f) {
  rtc_u32 fenced = (rtc_u32)lane_in;
  reg_fence(fenced);  // lane-derived values are rebuilt here, not held across the kv loop
  const int lane = (int)fenced, quad = lane >> 4, xaddr = (lane ^ 32) << 2;
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    const float l = row_sum4(st.l[g], xaddr), m = st.m[g];
    const int r = kRowsPerWave * wave + 16 * g + (lane & 15);
    if (r >= plan_rows(op)) continue;
    if (op.rows & kSplitFlag) {
#pragma unroll
      for (int t = 0; t < kHdTiles; ++t)
        global_store((rtc_f32x4*)op.aux + (r * kBucket + 16 * t + 4 * quad) / 4, a.o[g][t]);
      if (quad == 0) {
        float* ml = (float*)(op.aux + kQRows * kBucket * 4);
        global_store(ml + r, m);
        global_store(ml + kQRows + r, l);
      }
      continue;
    }
    // All scores -Inf: l = 0, ZeroSumRow's row (exactly, even where O holds 0 * NaN from a V NaN).
    const bool empty = l == 0.0f;
    const ZeroSumRow blank = ZeroSumRow::of(sees_a_key(rk, r));
#if RTC_KV_FP8
    const float inv = empty ? 0.0f : rcp_f32(l) * o_scale;
#else
    (void)o_scale;
    const float inv = empty ? 0.0f : rcp_f32(l);
#endif
#pragma unroll
    for (int t = 0; t < kHdTiles; ++t) {
      const int col = 16 * t + 4 * quad;  // the call's columns only: a bucket's last ones may be past them
      if (col >= plan_dim(op)) continue;
      const rtc_f32x4 o = a.o[g][t];
      rtc_u32x2 v = {o_pair(o[0] * inv, o[1] * inv), o_pair(o[2] * inv, o[3] * inv)};
      if (empty) v[0] = v[1] = blank.o;
      buffer_store_dwordx2(op.o, (rtc_u32)r * op.o_row_bytes + (rtc_u32)(col * 2), 0u, v);
    }
    if (op.aux && quad == 0)
      global_store((float*)op.aux + r, empty ? blank.lse : (m + log2_f32(l)) * 0.693147180559945309f);
  }
}

}  // namespace g942
