// The gfx942 decode kernel's epilogue and merge: a row's O / l in the rounding mode and its LSE, or a split part's
// unnormalised partial (O, m, l) in the workspace; and the merge stage, which combines an item's parts in part order.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bf16_round.h"
#include "isa_gfx9.h"
#include "gfx942/tiles.h"
#include "gfx942/softmax.h"
#include "gfx942_decode/params.h"
#include "gfx942_decode/scheduler.h"
#include "gfx942_decode/mask.h"
#include "gfx942_decode/mainloop.h"

namespace gdec {

constexpr long long kPartBytes = decode_part_bytes(kBucket);

// Where an item's rows go: its (sequence, K/V head)'s o rows through one resource, and this lane's row in it.
struct OutRows {
  rtc_buffer_rsrc o;
  rtc_u32 row_byte;  // this lane's row: i * o_ss + g * o_sh elements, in bytes
  float* lse;        // this lane's LSE element (null: not requested, or no row)
};

RTC_DEVICE OutRows out_rows(const DecodeParams& p, const Work& w, const Seq& s, const RowKeys& rk) {
  OutRows out;
  const int rows = w.i1 > 0 ? w.i1 : 0;
  out.o = g942::uniform_rsrc(p.o + s.o_off + (rtc_i64)w.hk * p.group * p.o_sh,
                             decode_group_span_bytes(rows, p.o_ss, p.group, p.o_sh, p.head_dim));
  out.row_byte = rk.i < 0 ? 0u : (rtc_u32)(((rtc_i64)rk.i * p.o_ss + (rtc_i64)rk.g * p.o_sh) * 2);
  const int h = w.hk * p.group + rk.g;
  out.lse = p.lse && rk.i >= 0 ? p.lse + s.lse_off + (rtc_i64)h * s.lse_head_stride + rk.i : nullptr;
  return out;
}

// A row's final O and LSE from its unnormalised O^T columns, max m and full sum l (not a lane's share). l = 0 is
// ZeroSumRow's row: 0 and LSE -Inf when the row sees no key, NaN when it saw keys (numerics §4, §8).
RTC_DEVICE void write_row(const OutRows& out, const rtc_f32x4 (&o)[kHdTiles], float m, float l, const RowKeys& rk,
                          int lane, int d) {
  if (rk.i < 0) return;
  const int quad = lane >> 4;
  const bool empty = l == 0.0f;
  const g942::ZeroSumRow blank = g942::ZeroSumRow::of(rk.lo <= rk.hi);
  const float inv = empty ? 0.0f : rcp_f32(l);
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) {
    const int col = 16 * t + 4 * quad;  // the call's columns only
    if (col >= d) continue;
    rtc_u32x2 v = {g942::o_pair(o[t][0] * inv, o[t][1] * inv), g942::o_pair(o[t][2] * inv, o[t][3] * inv)};
    if (empty) v[0] = v[1] = blank.o;
    buffer_store_dwordx2(out.o, out.row_byte + (rtc_u32)(col * 2), 0u, v);
  }
  if (out.lse && quad == 0) global_store(out.lse, empty ? blank.lse : (m + log2_f32(l)) * 0.693147180559945309f);
}

// Part `part` of item `item`'s partials: O^T as rows [16][bucket] of fp32, then m [16], l [16].
RTC_DEVICE char* part_of(const DecodeParams& p, rtc_i64 item, int part) {
  return (char*)p.workspace + (item * p.splits + part) * kPartBytes;
}

RTC_DEVICE void write_part(char* part, const rtc_f32x4 (&o)[kHdTiles], float m, float l, int lane) {
  const int r = lane & 15, quad = lane >> 4;
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) global_store((rtc_f32x4*)part + (r * kBucket + 16 * t + 4 * quad) / 4, o[t]);
  if (quad == 0) {
    float* ml = (float*)(part + DECODE_ROWS * kBucket * 4);
    global_store(ml + r, m);
    global_store(ml + DECODE_ROWS + r, l);
  }
}

// The merge of one item's parts, in part order (never atomics, so every run gives the same bits):
// O = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p, M = max_p m_p. A part with no step left m = -FLT_MAX, l = 0,
// O = 0: it weighs 0 beside any part that saw a score, and a row whose parts all saw none ends with l = 0.
RTC_DEVICE void merge_item(const DecodeParams& p, rtc_i64 item, const OutRows& out, const RowKeys& rk, int lane) {
  const int r = lane & 15, quad = lane >> 4;
  const char* first = part_of(p, item, 0);
  float mx = g942::kNegMax;
  for (int g = 0; g < p.splits; ++g)
    mx = __builtin_fmaxf(mx, global_load((const float*)(first + g * kPartBytes + DECODE_ROWS * kBucket * 4) + r));
  rtc_f32x4 o[kHdTiles];
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) o[t] = rtc_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  float l = 0.0f;
  for (int g = 0; g < p.splits; ++g) {
    const char* part = first + g * kPartBytes;
    const float* ml = (const float*)(part + DECODE_ROWS * kBucket * 4);
    const float w = exp2_f32(global_load(ml + r) - mx);
    l += w * global_load(ml + DECODE_ROWS + r);
#pragma unroll
    for (int t = 0; t < kHdTiles; ++t)
      o[t] += w * global_load((const rtc_f32x4*)part + (r * kBucket + 16 * t + 4 * quad) / 4);
  }
  write_row(out, o, mx, l, rk, lane, p.head_dim);
}

}  // namespace gdec
