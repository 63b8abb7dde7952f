// The sm_90a decode kernel's epilogue and merge: the (m, l, O) of a row tile's warps combined through shared memory in
// warp order, then either a row's O / l in the rounding mode and its LSE, or a split part's partial (O, m, l) in the
// workspace; and the merge stage, which combines an item's parts the same way, in part order. No atomics: every run
// gives the same bits.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"
#include "sm90/softmax.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90_decode/mask.h"
#include "sm90_decode/mainloop.h"

namespace sm90dec {

// In the combine and the merge, row tile by row tile, thread t owns row t / 8 of the tile and the column pairs
// 2 (t % 8) + 16 x.
constexpr int kPairs = kBucket / 16;
constexpr int kCombineStride = kBucket + 4;  // floats per row of a warp's O in shared memory

// A combination of partial results (m, l, O) of one row, each with its p taken relative to its own scaled max
// sm(m) = m c rounded down (0 when m = -inf, as the softmax takes it): the sum is kept relative to sm(M), M the
// largest m so far, so the part holding the row's max element enters with weight 2^0 = 1 exactly (final_row_sum's
// premise). A source with m = -inf saw no score: it adds nothing (its O may hold 0 * NaN from a V NaN under a zero
// weight, which the prefill kernel never adds either).
// P: the column pairs a thread holds (all kPairs in the warps' combine; kMergePairs in the merge).
template <int P>
struct RowSumOf {
  float m, l;
  float o[2 * P];
  RTC_DEVICE void init() {
    m = sm90::neg_inf();
    l = 0.f;
#pragma unroll
    for (int x = 0; x < 2 * P; ++x) o[x] = 0.f;
  }
  RTC_DEVICE static float scaled(float m, float c) { return m == sm90::neg_inf() ? 0.f : sm90::scale_max(m, c); }
  RTC_DEVICE void add(float ms, float ls, const float (&os)[2 * P], float c) {
    if (ms == sm90::neg_inf()) return;
    const float mn = fmaxf(m, ms), sn = scaled(mn, c);
    const float a = m == sm90::neg_inf() ? 0.f : sm90::ex2(scaled(m, c) - sn), b = sm90::ex2(scaled(ms, c) - sn);
    l = l * a + ls * b;
#pragma unroll
    for (int x = 0; x < 2 * P; ++x) o[x] = o[x] * a + os[x] * b;
    m = mn;
  }
};
using RowSum = RowSumOf<kPairs>;

// Warps' partials in shared memory over the ring, by combine slot (Role::slot: one per row tile and key group; the
// warps of a column split fill one slot's columns together): O [slot][16][kCombineStride], then m [slot][16],
// l [slot][16].
RTC_DEVICE rtc_u32 combine_o(const Smem& sm, int slot, int row) {
  return sm.ring() + ((slot * DECODE_ROWS + row) * kCombineStride) * 4;
}
RTC_DEVICE rtc_u32 combine_ml(const Smem& sm, int slot, int row, int which) {
  return sm.ring() +
         (SM90_DECODE_WARPS * DECODE_ROWS * kCombineStride + (which * SM90_DECODE_WARPS + slot) * 16 + row) * 4;
}

RTC_DEVICE void st_shared_f32(rtc_u32 addr, float v) { sm90::st_shared_u32(addr, __float_as_uint(v)); }
RTC_DEVICE float ld_shared_f32(rtc_u32 addr) { return __uint_as_float(sm90::ld_shared_u32(addr)); }

// Each warp's state into shared memory (its row sums reduced over the quad): its slot holds the 16 rows of its row
// tile, its columns those of its share. The warps of a column split hold the same m and l (the same S, the same
// softmax): the first one writes them.
RTC_DEVICE void stash_warp(const Smem& sm, WarpState& st, int row_tiles, int tid) {
  const int lane = tid % 32;
  const Role role = Role::of(tid / 32, row_tiles);
  const int slot = role.slot(), col0 = role.ch * kWarpCols;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = lane / 4 + 8 * i;
    float l = st.l[i];
    l += sm90::shfl_xor(l, 1);
    l += sm90::shfl_xor(l, 2);
    if (lane % 4 == 0 && role.ch == 0) {
      st_shared_f32(combine_ml(sm, slot, row, 0), st.m[i]);
      st_shared_f32(combine_ml(sm, slot, row, 1), l);
    }
#pragma unroll
    for (int j = 0; j < kAccO / 4; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k)
        st_shared_f32(combine_o(sm, slot, row) + 4 * (col0 + o_col(j, k, lane)), st.o[4 * j + 2 * i + k]);
  }
}

// Thread t's row of row tile rt combined over the tile's key groups (slots rt * groups ..), in key-group order.
RTC_DEVICE void combine_tile(const Smem& sm, int rt, int groups, RowSum& acc, float c, int tid) {
  const int row = tid / 8, sub = tid % 8;
  acc.init();
  for (int w = rt * groups; w < (rt + 1) * groups; ++w) {
    float os[2 * kPairs];
#pragma unroll
    for (int x = 0; x < kPairs; ++x)
#pragma unroll
      for (int k = 0; k < 2; ++k) os[2 * x + k] = ld_shared_f32(combine_o(sm, w, row) + 4 * (2 * sub + 16 * x + k));
    acc.add(ld_shared_f32(combine_ml(sm, w, row, 0)), ld_shared_f32(combine_ml(sm, w, row, 1)), os, c);
  }
}

// Row tile rt of part `part` of item `item`'s partials: per row tile, O as rows [16][bucket] of fp32, then m [16],
// l [16] (decode_part_bytes); an item's part holds row_tiles of them.
RTC_DEVICE float* part_of(const Sm90DecodeParams& p, rtc_i64 item, int part, int rt) {
  return (float*)((char*)p.workspace + ((item * p.splits + part) * p.row_tiles + rt) * decode_part_bytes(kBucket));
}

RTC_DEVICE void write_part(float* part, const RowSum& acc, int tid) {
  const int row = tid / 8, sub = tid % 8;
#pragma unroll
  for (int x = 0; x < kPairs; ++x)
    *reinterpret_cast<float2*>(part + row * kBucket + 2 * sub + 16 * x) = make_float2(acc.o[2 * x], acc.o[2 * x + 1]);
  if (sub == 0) {
    part[DECODE_ROWS * kBucket + row] = acc.m;
    part[DECODE_ROWS * kBucket + DECODE_ROWS + row] = acc.l;
  }
}

// A row's final O / l in the variant's element type (the thread's pairs x0, x0 + 1, ...: columns 2 sub + 16 x) and,
// with the first pairs, its LSE (natural log). l = 0 writes ZeroSumRow's row: 0 and LSE -inf when the row sees no
// key, NaN when it saw keys (numerics §4, §8).
template <int P>
RTC_DEVICE void write_row(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const RowKeys& rk,
                          const RowSumOf<P>& acc, int sub, int x0) {
  if (rk.i < 0) return;
  const float l = sm90::final_row_sum(acc.l, acc.m, softmax_scale_log2(p));
  const bool empty = l == 0.f;
  const float inv = empty ? 0.f : 1.f / l;
  const sm90::ZeroSumRow blank = sm90::ZeroSumRow::of(rk.lo <= rk.hi);
  const int h = w.hk * p.group + rk.g;
  rtc_elem_t* dst = p.o + seq.o_off + (rtc_i64)rk.i * p.o_ss + (rtc_i64)h * p.o_sh;
#pragma unroll
  for (int x = 0; x < P; ++x) {
    const int col = 2 * sub + 16 * (x0 + x);
    if (col < p.head_dim)
      *reinterpret_cast<rtc_u32*>(dst + col) =
          empty ? blank.o : sm90::pack2(acc.o[2 * x] * inv, acc.o[2 * x + 1] * inv);
  }
  if (p.lse != nullptr && sub == 0 && x0 == 0)
    p.lse[seq.lse_off + (rtc_i64)h * seq.lse_head_stride + rk.i] = empty ? blank.lse : acc.m * lse_scale(p) + logf(l);
}

// The merge of one item's parts for row tile rt, thread t's row and the column pairs x0 .. x0 + kMergePairs - 1 of
// its slice (sm90_decode_merge_slices: a CTA per 32 columns, so an item's partials are read by as many CTAs), in part
// order: kMergeBatch parts' partials are loaded before they are added, so their loads are in flight together.
constexpr int kMergePairs = kPairs / sm90_decode_merge_slices(kBucket);
constexpr int kMergeBatch = 8;
static_assert(kMergePairs * sm90_decode_merge_slices(kBucket) == kPairs, "merge slices split the column pairs evenly");
using MergeSum = RowSumOf<kMergePairs>;

RTC_DEVICE void merge_parts(const Sm90DecodeParams& p, rtc_i64 item, int rt, int x0, MergeSum& acc, int tid) {
  const int row = tid / 8, sub = tid % 8;
  acc.init();
  for (int g0 = 0; g0 < p.splits; g0 += kMergeBatch) {
    float mv[kMergeBatch], lv[kMergeBatch], ov[kMergeBatch][2 * kMergePairs];
#pragma unroll
    for (int g = 0; g < kMergeBatch; ++g) {
      mv[g] = sm90::neg_inf();
      lv[g] = 0.f;
      if (g0 + g < p.splits) {
        const float* part = part_of(p, item, g0 + g, rt);
        mv[g] = part[DECODE_ROWS * kBucket + row];
        lv[g] = part[DECODE_ROWS * kBucket + DECODE_ROWS + row];
#pragma unroll
        for (int x = 0; x < kMergePairs; ++x) {
          const float2 v = *reinterpret_cast<const float2*>(part + row * kBucket + 2 * sub + 16 * (x0 + x));
          ov[g][2 * x] = v.x;
          ov[g][2 * x + 1] = v.y;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMergeBatch; ++g) acc.add(mv[g], lv[g], ov[g], softmax_scale_log2(p));
  }
}

}  // namespace sm90dec
