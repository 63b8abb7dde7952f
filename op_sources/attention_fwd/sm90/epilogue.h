// The sm_90a kernel's epilogue: a consumer warpgroup's rows of O normalised by their row sums,
// packed to the element type (bf16 in the rounding mode, fp16 to nearest even) and stored from registers, and the rows' LSE; a row whose sum
// is 0 writes the zero-sum row (sm90/softmax.h).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "sm90/pipeline.h"
#include "sm90/scheduler.h"
#include "sm90/mask.h"
#include "sm90/softmax.h"

namespace sm90 {

// Warpgroup wg's 64 rows of tile t: O / l and the LSE (rows past the sequence are skipped).
// keys: this thread's two rows' key windows, read under RTC_MASK (unmasked, a row sees a key iff its
// sequence has one).
RTC_DEVICE void store_tile(const Sm90AttnParams& p, const Tile& t, int wg, float (&o)[kAccO], RowState& st,
                           const KeyWindow& keys) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const AttnParams& a = p.a;
  // FP8 cache: the tile's scales carry k_descale (sm90/scheduler.h), and O = (sum p v) v_descale / l. The row max is of
  // the softmax's scores (sm90/mask.h: t where a score modification makes them so).
  const AttnParams& sa = RTC_KV_FP8 ? t.view : a;
  const float scale = lse_scale(sa), scale_log2 = softmax_scale_log2(sa);
  const float v_scale = RTC_KV_FP8 ? kv_descale(a.v_descale, a.vd_sb, a.vd_sh, t.batch, kv_head(a, t.head)) : 1.f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = st.l[i];
    l += shfl_xor(l, 1);
    l += shfl_xor(l, 2);
    l = final_row_sum(l, st.m[i], scale_log2);
    // l == 0: every score the row saw was -inf; it writes ZeroSumRow's row: 0 and LSE -inf when it sees
    // no key (even where O holds 0 * NaN from a V NaN under a zero weight), NaN when it sees keys.
    // A NaN l keeps the row NaN.
    const bool empty = l == 0.f;
    // Dropout: P V took the kept probabilities unscaled (sm90/drop.h); their 1 / (1 - p) goes into 1 / l.
    float num = RTC_KV_FP8 ? v_scale : 1.f;
    if constexpr (RTC_DROPOUT != 0) num *= a.drop_scale;
    const float inv = empty ? 0.f : (RTC_KV_FP8 || RTC_DROPOUT ? num / l : 1.f / l);
    const ZeroSumRow blank = ZeroSumRow::of(RTC_MASK ? keys.sees_a_key(i) : !kPacked || t.view.seq_k > 0);
    const int row = t.row0 + wg * 64 + warp * 16 + lane / 4 + 8 * i;
    if (row < 0 || row >= t.view.seq_q) continue;
    rtc_elem_t* dst = a.o + t.seq.o_off + (rtc_i64)row * a.o_ss + (rtc_i64)t.head * a.o_sh + 2 * (lane % 4);
    // Columns past the call's head dim (a D below the bucket) are zeros of the tiles: not stored.
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      if (8 * j < kDMin || 8 * j < a.head_dim)
        *reinterpret_cast<rtc_u32*>(dst + 8 * j) =
            empty ? blank.o : pack2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    if (a.lse != nullptr && lane % 4 == 0)
      a.lse[t.seq.lse_off + (rtc_i64)t.head * t.seq.lse_head_stride + row] =
          empty ? blank.lse : st.m[i] * scale + logf(l);
  }
}

// A tile no row of which sees a key (every row's window past the keys, a sequence without keys): rows of zeros and
// LSE -inf (numerics §8), what store_tile writes for such rows, from a rolled loop and no accumulators: the rare
// path keeps its code small (the full epilogue again cost 6-9% of a masked variant's compile).
RTC_DEVICE void store_empty_tile(const Sm90AttnParams& p, const Tile& t, int wg) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const AttnParams& a = p.a;
#pragma unroll 1
  for (int i = 0; i < 2; ++i) {
    const int row = t.row0 + wg * 64 + warp * 16 + lane / 4 + 8 * i;
    if (row < 0 || row >= t.view.seq_q) continue;
    rtc_elem_t* dst = a.o + t.seq.o_off + (rtc_i64)row * a.o_ss + (rtc_i64)t.head * a.o_sh + 2 * (lane % 4);
#pragma unroll 1
    for (int j = 0; 8 * j < a.head_dim; ++j) *reinterpret_cast<rtc_u32*>(dst + 8 * j) = 0u;
    if (a.lse != nullptr && lane % 4 == 0)
      a.lse[t.seq.lse_off + (rtc_i64)t.head * t.seq.lse_head_stride + row] = neg_inf();
  }
}

}  // namespace sm90
