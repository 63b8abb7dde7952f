// The gfx942 decode kernel's epilogue and merge: a row's O / l in the rounding mode and its LSE, or a split part's
// unnormalised partial (O, m, l) in the workspace; and the merge stage, which combines an item's parts in fixed order.
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

// What a row with sum l writes (l = 0: ZeroSumRow's row, 0 and LSE -Inf when the row sees no key, NaN when it saw
// keys: numerics §4, §8), and 1 / l.
struct RowEnd {
  bool empty;
  g942::ZeroSumRow blank;
  float inv;
};
RTC_DEVICE RowEnd row_end(float l, const RowKeys& rk) {
  const bool empty = l == 0.0f;
  return RowEnd{empty, g942::ZeroSumRow::of(rk.lo <= rk.hi), empty ? 0.0f : rcp_f32(l)};
}

// Columns 16 t + 4 quad .. + 3 of this lane's row: O / l in the rounding mode (the call's columns only).
RTC_DEVICE void store_cols(const OutRows& out, int t, rtc_f32x4 o, const RowEnd& e, int lane, int d) {
  const int col = 16 * t + 4 * (lane >> 4);
  if (col >= d) return;
  rtc_u32x2 v = {g942::o_pair(o[0] * e.inv, o[1] * e.inv), g942::o_pair(o[2] * e.inv, o[3] * e.inv)};
  if (e.empty) v[0] = v[1] = e.blank.o;
  buffer_store_dwordx2(out.o, out.row_byte + (rtc_u32)(col * 2), 0u, v);
}

// The row's LSE, (m + log2 l) ln 2, from one lane of the row.
RTC_DEVICE void store_lse(const OutRows& out, float m, float l, const RowEnd& e, int lane) {
  if (out.lse && (lane >> 4) == 0)
    global_store(out.lse, e.empty ? e.blank.lse : (m + log2_f32(l)) * 0.693147180559945309f);
}

// A row's final O and LSE from its unnormalised O^T columns, max m and full sum l (not a lane's share).
RTC_DEVICE void write_row(const OutRows& out, const rtc_f32x4 (&o)[kHdTiles], float m, float l, const RowKeys& rk,
                          int lane, int d) {
  if (rk.i < 0) return;
  const RowEnd e = row_end(l, rk);
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) store_cols(out, t, o[t], e, lane, d);
  store_lse(out, m, l, e, lane);
}

// Part `part` of item `item`'s partials: O^T as rows [16][bucket] of fp32, then m [16], l [16]. Only the item's
// rows of the call are written and read back (a row past them, rk.i < 0, is never stored): with a GQA group of 4 at
// Sq 1, 4 of the 16 rows, a quarter of the bytes (decode_part_row_bytes: what the planner counts per row).
RTC_DEVICE char* part_of(const DecodeParams& p, rtc_i64 item, int part) {
  return (char*)p.workspace + (item * p.splits + part) * kPartBytes;
}

RTC_DEVICE void write_part(char* part, const rtc_f32x4 (&o)[kHdTiles], float m, float l, const RowKeys& rk, int lane) {
  if (rk.i < 0) return;
  const int r = lane & 15, quad = lane >> 4;
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) global_store((rtc_f32x4*)part + (r * kBucket + 16 * t + 4 * quad) / 4, o[t]);
  if (quad == 0) {
    float* ml = (float*)(part + DECODE_ROWS * kBucket * 4);
    global_store(ml + r, m);
    global_store(ml + DECODE_ROWS + r, l);
  }
}

// The merge of one item's parts for one 16-column tile t of O (the merge grid is items x the call's tiles), never with
// atomics, in a fixed order, so every run gives the same bits: an online merge by LSE, M the running max of the parts'
// m, O = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p, the accumulators rescaled by 2^(M_old - M_new) when M grows.
// The lanes are `rows` packed rows (the item's rows of the call rounded up to a power of two, decode_merge_rows) x
// `groups` part groups x 4 column quads: lane (r, g) merges parts g, g + groups, g + 2 groups, ... of row r, loading
// kMergeBatch parts' partials at once (their loads in flight together), so the merge's time is
// ceil(splits / (kMergeBatch x groups)) memory round trips; then the groups' (m, l, O) are combined across lanes
// (xor rows, 2 rows, .. 8: a fixed tree) and group 0 writes the row. A part with no step left has m = -FLT_MAX, l = 0,
// O = 0: it weighs 0 beside any part that saw a score, and a row whose parts all saw none ends with l = 0.
constexpr int kMergeBatch = DECODE_MERGE_BATCH;

// Two (m, l, O) states of one row and column quad, combined.
RTC_DEVICE void merge_state(float& mx, float& l, rtc_f32x4& o, float m2, float l2, rtc_f32x4 o2) {
  const float bm = __builtin_fmaxf(mx, m2);
  const float a1 = exp2_f32(mx - bm), a2 = exp2_f32(m2 - bm);
  l = l * a1 + l2 * a2;
  o = o * a1 + o2 * a2;
  mx = bm;
}

RTC_DEVICE float xor_lane(float x, int addr) { return rtc_bits_f32(ds_bpermute(addr, rtc_f32_bits(x))); }

RTC_DEVICE void merge_tile(const DecodeParams& p, rtc_i64 item, int t, const OutRows& out, const RowKeys& rk, int lane,
                           int rows) {
  const int r = lane & (rows - 1), g = (lane & 15) >> __builtin_ctz(rows), groups = DECODE_ROWS / rows;
  const int quad = lane >> 4;
  const char* first = part_of(p, item, 0);
  float mx = g942::kNegMax, l = 0.0f;
  rtc_f32x4 o = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int g0 = 0; g0 < p.splits; g0 += kMergeBatch * groups) {
    float mv[kMergeBatch], lv[kMergeBatch];
    rtc_f32x4 ov[kMergeBatch];
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      mv[i] = g942::kNegMax;
      lv[i] = 0.0f;
      ov[i] = rtc_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
      const int part = g0 + i * groups + g;
      if (part < p.splits && rk.i >= 0) {  // a row past the call's was never written
        const char* pp = first + part * kPartBytes;
        const float* ml = (const float*)(pp + DECODE_ROWS * kBucket * 4);
        mv[i] = global_load(ml + r);
        lv[i] = global_load(ml + DECODE_ROWS + r);
        ov[i] = global_load((const rtc_f32x4*)pp + (r * kBucket + 16 * t + 4 * quad) / 4);
      }
    }
    float bm = mx;
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) bm = __builtin_fmaxf(bm, mv[i]);
    const float alpha = exp2_f32(mx - bm);
    l *= alpha;
    o *= alpha;
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      const float w = exp2_f32(mv[i] - bm);
      l += w * lv[i];
      o += w * ov[i];
    }
    mx = bm;
  }
  for (int x = rows; x < DECODE_ROWS; x <<= 1) {  // uniform: every lane takes part
    const int addr = (lane ^ x) << 2;
    const rtc_f32x4 o2 = {xor_lane(o[0], addr), xor_lane(o[1], addr), xor_lane(o[2], addr), xor_lane(o[3], addr)};
    merge_state(mx, l, o, xor_lane(mx, addr), xor_lane(l, addr), o2);
  }
  if (rk.i < 0 || g != 0) return;
  const RowEnd e = row_end(l, rk);
  store_cols(out, t, o, e, lane, p.head_dim);
  if (t == 0) store_lse(out, mx, l, e, lane);
}

}  // namespace gdec
