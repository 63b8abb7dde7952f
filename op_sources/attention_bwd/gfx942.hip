// The attention backward on CDNA3 matrix cores (gfx942; gfx90a and gfx950 compile the same text): the baseline's
// three stages (bwd_common.h: delta, then dK / dV, then dQ), their products as v_mfma_f32_16x16x16 bf16 / f16.
//
// Four waves a block; a wave owns 16 keys (dK, dV) or 16 query rows (dQ) and keeps their operands in registers, and
// the block's waves share one tile of 16 rows (q, dO) or 16 keys (k, v) at a time in LDS. Every product is computed
// so that its result lands in the layout of the next product's B operand (lane l: column l % 16, rows 4 (l / 16) ..
// + 3), and P, dS go from accumulators to operands without leaving the lane:
//   dK / dV:  S = Q K^T, dP = dO V^T          A: q, dO rows from LDS      B: the wave's K, V in registers
//             dV^T += dO^T P, dK^T += Q^T dS  A: dO, q columns from LDS   B: P, dS as computed
//   dQ:       S^T = K Q^T, dP^T = V dO^T      A: k, v rows from LDS       B: the wave's q, dO in registers
//             dQ^T += K^T dS^T                A: k columns from LDS       B: dS^T as computed
// Each pair's P and dS are bwd_common.h's (pair_p_ds): rounded to the element type for the products, fp32
// accumulation; dK / dV sum the query heads of the group in order, as the baseline; no atomics (deterministic).
#include "platform.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "bwd_common.h"

#ifndef RTC_HEAD_DIM_MAX
#error "RTC_HEAD_DIM_MAX (the head-dim bucket) must be defined"
#endif
#if RTC_HEAD_DIM_MAX % 16 != 0 || RTC_HEAD_DIM_MAX < 16 || RTC_HEAD_DIM_MAX > 256
#error "RTC_HEAD_DIM_MAX must be a multiple of 16 in [16, 256] (the MFMAs' k-steps)"
#endif
#if RTC_KV == RTC_KV_PAGED || RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
#error "the backward takes dense or varlen K / V in q's dtype (a paged or quantized cache takes no gradients)"
#endif

namespace {

using namespace bwd;

constexpr int kThreads = 256;
constexpr int kTile = 16;                 // rows or keys of the shared LDS tile; a wave's own rows or keys
constexpr int kBlock = 4 * kTile;         // a block's keys (dK / dV) or query rows (dQ)
constexpr int kD = RTC_HEAD_DIM_MAX;      // the bucket: columns of the tiles, zeros past the call's D
constexpr int kSteps = kD / 16;           // k-steps of the score products, d tiles of the gradient products

#if RTC_DTYPE == RTC_DTYPE_FP16
typedef rtc_f16x4 Frag;
typedef unsigned short FragElem;
RTC_DEVICE rtc_f32x4 mma(Frag a, Frag b, rtc_f32x4 c) { return mfma_16x16x16_f16(a, b, c); }
#else
typedef rtc_bf16x4 Frag;
typedef short FragElem;
RTC_DEVICE rtc_f32x4 mma(Frag a, Frag b, rtc_f32x4 c) { return mfma_16x16x16_bf16(a, b, c); }
#endif

RTC_DEVICE rtc_f32x4 zero4() {
  const rtc_f32x4 z = {0.0f, 0.0f, 0.0f, 0.0f};
  return z;
}

// One LDS tile: 16 rows of kD elements, and (row tiles) their LSE times log2(e) and delta; at, bt: the same rows
// transposed (kD columns of 16 elements), for the operands that run down a column (col_frag: 4 rows of one column
// in one 8-byte read instead of four 2-byte ones).
struct Tile {
  rtc_smem<rtc_elem_t, kTile * kD> a, b;  // q and dO, or k and v
  rtc_smem<rtc_elem_t, kD * kTile> at, bt;
  rtc_smem<float, kTile> lse, delta;
};

// `rows` (>= 1) rows of d elements from base (row stride ss) into a tile, and transposed into dst_t when asked; the
// rest of the tile reads as zeros. A lane takes 8 consecutive columns of one row (d is a multiple of 8: all inside or
// all past it), one address for the 8 loads; every lane loads (a chunk outside reads the tile's first one instead)
// and selects: no branch a load.
template <bool kTransposed>
RTC_DEVICE void stage_rows(rtc_smem<rtc_elem_t, kTile * kD>& dst, rtc_smem<rtc_elem_t, kD * kTile>& dst_t,
                           const rtc_elem_t* base, rtc_i64 ss, int rows, int d) {
  // The stride, opaque at each call: its products with the unrolled rows are not hoisted out of the tile loops and
  // held there (SGPRs past the budget: clang kept scratch for their spills).
  sreg_fence(ss);
  if constexpr (kD > 128) {
    // Past 128, an element a lane at a time (the chunked loads' addresses, held, cost the SGPRs whose spills left
    // clang a private segment at 192).
#pragma unroll
    for (int n = 0; n < kTile * kD / kThreads; ++n) {
      const int i = n * kThreads + threadIdx.x, r = i / kD, c = i - r * kD;
      const bool in = r < rows && c < d;
      const rtc_elem_t x = rtc_gld(base + (in ? (rtc_i64)r * ss + c : 0)), v = in ? x : (rtc_elem_t)0;
      dst.st(i, v);
      if (kTransposed) dst_t.st(c * kTile + r, v);
    }
    return;
  }
  constexpr int kChunks = kTile * kD / 8;
#pragma unroll
  for (int n = 0; n < (kChunks + kThreads - 1) / kThreads; ++n) {
    const int ch = n * kThreads + threadIdx.x, r = ch / (kD / 8), c0 = (ch - r * (kD / 8)) * 8;
    if (kChunks % kThreads != 0 && ch >= kChunks) break;
    const bool in = r < rows && c0 < d;
    const rtc_elem_t* src = base + (in ? (rtc_i64)r * ss + c0 : 0);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const rtc_elem_t x = rtc_gld(src + j), v = in ? x : (rtc_elem_t)0;
      dst.st(r * kD + c0 + j, v);
      if (kTransposed) dst_t.st((c0 + j) * kTile + r, v);
    }
  }
}

// Operands from a tile: 4 elements along a row (columns c0 .. c0 + 3 of row r: an A operand's k-run of a row-major
// product), or along a column (rows r0 .. r0 + 3 of column c: a transposed one).
RTC_DEVICE Frag row_frag(const rtc_smem<rtc_elem_t, kTile * kD>& t, int r, int c0) {
  Frag f;
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = (FragElem)t.ld(r * kD + c0 + i);
  return f;
}
// Up to head dim 128 the column operands come from the transposed copy (kColTiles); past it from the row-major tile,
// 2 bytes a read (the copy's stores and the chunked loads left clang a private segment at 192 on gfx950).
constexpr bool kColTiles = kD <= 128;
RTC_DEVICE Frag col_frag(const rtc_smem<rtc_elem_t, kTile * kD>& t, const rtc_smem<rtc_elem_t, kD * kTile>& tt, int r0,
                         int c) {
  Frag f;
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = (FragElem)(kColTiles ? tt.ld(c * kTile + r0 + i) : t.ld((r0 + i) * kD + c));
  return f;
}

// A row's B-operand fragments from global memory: columns 16 s + 4 quad .. + 3 of step s (zeros past d, or for a row
// outside the sequence: `row` is then the sequence's first row, read and dropped). No branch a load.
RTC_DEVICE void row_operands(Frag (&f)[kSteps], const rtc_elem_t* row, bool in, int quad, int d) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    int dd = d;  // opaque at each step, as in store_columns
    sreg_fence(dd);
    const int c0 = 16 * s + 4 * quad;
    const bool ok = in && c0 < dd;  // a lane's 4 columns: all inside d or all past it
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const rtc_elem_t x = rtc_gld(row + (ok ? c0 + i : 0));
      f[s][i] = (FragElem)(ok ? x : (rtc_elem_t)0);
    }
  }
}

// The four values of an accumulator rounded to the element type, as an operand (P or dS).
RTC_DEVICE Frag to_frag(const float (&x)[4]) {
  Frag f;
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = (FragElem)to_elem(x[i]);
  return f;
}

// Gradient tiles: acc[t] holds rows 16 t + 4 quad .. + 3 (head-dim columns) of one key's or row's gradient,
// times `scale`, rounded, stored at dst (its row of the gradient tensor).
RTC_DEVICE void store_columns(rtc_elem_t* dst, const rtc_f32x4 (&acc)[kSteps], float scale, int quad, int d) {
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
    // A lane's 4 columns are all inside d or all past it (d is a multiple of 8): one test a group. d, opaque here
    // at each group, keeps the compiler from computing every group's lane mask first and holding them all (SGPRs
    // past the budget).
    int dd = d;
    sreg_fence(dd);
    if (16 * t + 4 * quad < dd)
#pragma unroll
      for (int r = 0; r < 4; ++r) rtc_gst(dst + 16 * t + 4 * quad + r, to_elem(acc[t][r] * scale));
  }
}

// 64 keys of K/V head hk, 16 a wave: every row tile of every query head of the group that reaches them.
RTC_DEVICE void dkdv_stage(Tile& sm, const BwdParams& bp) {
  const AttnParams& a = bp.a;
  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kBlock;
  const Seq seq = seq_of(a, b);
  if (j0 >= seq.len_k) return;  // the block's, uniform
  const AttnParams view = seq_view(a, seq);
  const int lane = threadIdx.x % 64, wave = threadIdx.x / 64, col = lane % 16, quad = lane / 16;
  const int d = view.head_dim, wj0 = j0 + kTile * wave, key = wj0 + col;  // this lane's key: its column of S, P, dS
  const bool key_in = key < view.seq_k;
  Frag kf[kSteps], vf[kSteps];
  const int key_row = key_in ? key : 0;  // a key past the sequence reads key 0's row (dropped)
  row_operands(kf, a.k + row_at(a.k_sb, a.k_ss, b, seq.k_row, key_row) + (rtc_i64)hk * a.k_sh, key_in, quad, d);
  row_operands(vf, a.v + row_at(a.v_sb, a.v_ss, b, seq.k_row, key_row) + (rtc_i64)hk * a.v_sh, key_in, quad, d);
  rtc_f32x4 dk[kSteps], dv[kSteps];
#pragma unroll
  for (int t = 0; t < kSteps; ++t) dk[t] = dv[t] = zero4();
  const int group = view.heads / view.heads_k, j_last = (view.seq_k < j0 + kBlock ? view.seq_k : j0 + kBlock) - 1;
  for (int gi = 0; gi < group; ++gi)
    for (int i0 = 0; i0 < view.seq_q; i0 += kTile) {
      const int h = hk * group + gi, rows = view.seq_q - i0 < kTile ? view.seq_q - i0 : kTile;
      // Windows move right with the row: a tile whose last row ends before the block's keys, or whose first row
      // starts after them, sees none of them.
      if (RTC_MASK && (key_range(view, i0 + rows - 1).hi < j0 || key_range(view, i0).lo > j_last)) continue;
      __syncthreads();  // the previous row tile is no longer read
      stage_rows<kColTiles>(sm.a, sm.at, a.q + row_at(a.q_sb, a.q_ss, b, seq.q_row, i0) + (rtc_i64)h * a.q_sh, a.q_ss,
                            rows, d);
      stage_rows<kColTiles>(sm.b, sm.bt, bp.dout + row_at(bp.do_sb, bp.do_ss, b, seq.q_row, i0) + (rtc_i64)h * bp.do_sh,
                            bp.do_ss, rows, d);
      if ((int)threadIdx.x < kTile) {
        const int r = threadIdx.x;
        const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + i0 + r;
        sm.lse.st(r, r < rows ? rtc_gld(a.lse + at) * kLog2e : neg_inf());
        sm.delta.st(r, r < rows ? rtc_gld(bp.delta + at) : 0.0f);
      }
      __syncthreads();
      rtc_f32x4 s = zero4(), dp = zero4();
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        s = mma(row_frag(sm.a, col, 16 * st + 4 * quad), kf[st], s);
        dp = mma(row_frag(sm.b, col, 16 * st + 4 * quad), vf[st], dp);
      }
      // Lane l holds rows 4 quad + r of its key's column.
      const Pairs pairs{window_of(view), i0, wj0};
      float p[4], ds[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        pair_p_ds(s[r], dp[r], sm.lse.ld(4 * quad + r), sm.delta.ld(4 * quad + r), pairs.seen(4 * quad + r, col),
                  view.scale_log2, p[r], ds[r]);
      const Frag pf = to_frag(p), dsf = to_frag(ds);
#pragma unroll
      for (int t = 0; t < kSteps; ++t) {
        dv[t] = mma(col_frag(sm.b, sm.bt, 4 * quad, 16 * t + col), pf, dv[t]);
        dk[t] = mma(col_frag(sm.a, sm.at, 4 * quad, 16 * t + col), dsf, dk[t]);
      }
    }
  if (!key_in) return;
  store_columns(bp.dk + row_at(bp.dk_sb, bp.dk_ss, b, seq.k_row, key) + (rtc_i64)hk * bp.dk_sh, dk, view.scale, quad,
                d);
  store_columns(bp.dv + row_at(bp.dv_sb, bp.dv_ss, b, seq.k_row, key) + (rtc_i64)hk * bp.dv_sh, dv, 1.0f, quad, d);
}

// 64 query rows of head h, 16 a wave: every key tile their windows reach.
RTC_DEVICE void dq_stage(Tile& sm, const BwdParams& bp) {
  const AttnParams& a = bp.a;
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlock;
  const Seq seq = seq_of(a, b);
  if (i0 >= seq.len_q) return;  // the block's, uniform
  const AttnParams view = seq_view(a, seq);
  const int lane = threadIdx.x % 64, wave = threadIdx.x / 64, col = lane % 16, quad = lane / 16;
  const int d = view.head_dim, wi0 = i0 + kTile * wave, row = wi0 + col;  // this lane's row: its column of S^T
  const bool row_in = row < view.seq_q;
  Frag qf[kSteps], df[kSteps];
  const int q_row = row_in ? row : 0;  // a row past the sequence reads row 0 (dropped)
  row_operands(qf, a.q + row_at(a.q_sb, a.q_ss, b, seq.q_row, q_row) + (rtc_i64)h * a.q_sh, row_in, quad, d);
  row_operands(df, bp.dout + row_at(bp.do_sb, bp.do_ss, b, seq.q_row, q_row) + (rtc_i64)h * bp.do_sh, row_in, quad, d);
  const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + row;
  const float lse2 = row_in ? rtc_gld(a.lse + at) * kLog2e : neg_inf(), delta = row_in ? rtc_gld(bp.delta + at) : 0.0f;
  rtc_f32x4 dq[kSteps];
#pragma unroll
  for (int t = 0; t < kSteps; ++t) dq[t] = zero4();
  const int rows = view.seq_q - i0 < kBlock ? view.seq_q - i0 : kBlock, hk = kv_head(view, h);
  int kv_begin = 0, kv_end = view.seq_k;
  if (RTC_MASK) {
    const KeyRange first = key_range(view, i0), last = key_range(view, i0 + rows - 1);
    kv_begin = (int)(first.lo / kTile) * kTile;
    kv_end = last.hi < first.lo ? kv_begin : (int)last.hi + 1;  // no row sees a key: no tile
  }
  for (int j0 = kv_begin; j0 < kv_end; j0 += kTile) {
    const int keys = view.seq_k - j0 < kTile ? view.seq_k - j0 : kTile;
    __syncthreads();  // the previous key tile is no longer read
    stage_rows<kColTiles>(sm.a, sm.at, a.k + row_at(a.k_sb, a.k_ss, b, seq.k_row, j0) + (rtc_i64)hk * a.k_sh, a.k_ss,
                          keys, d);
    stage_rows<false>(sm.b, sm.bt, a.v + row_at(a.v_sb, a.v_ss, b, seq.k_row, j0) + (rtc_i64)hk * a.v_sh, a.v_ss, keys,
                      d);
    __syncthreads();
    rtc_f32x4 st = zero4(), dpt = zero4();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      st = mma(row_frag(sm.a, col, 16 * s + 4 * quad), qf[s], st);
      dpt = mma(row_frag(sm.b, col, 16 * s + 4 * quad), df[s], dpt);
    }
    // Lane l holds keys 4 quad + r of its row's column.
    const Pairs pairs{window_of(view), wi0, j0};
    float p[4], ds[4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pair_p_ds(st[r], dpt[r], lse2, delta, pairs.seen(col, 4 * quad + r), view.scale_log2, p[r], ds[r]);
    const Frag dsf = to_frag(ds);
#pragma unroll
    for (int t = 0; t < kSteps; ++t) dq[t] = mma(col_frag(sm.a, sm.at, 4 * quad, 16 * t + col), dsf, dq[t]);
  }
  if (!row_in) return;
  store_columns(bp.dq + row_at(bp.dq_sb, bp.dq_ss, b, seq.q_row, row) + (rtc_i64)h * bp.dq_sh, dq, view.scale, quad, d);
}

}  // namespace

// Up to head dim 128, at least two waves a SIMD (blocks a CU): the bound keeps a wave's registers to 256 (no AGPR
// copies of the accumulators either), and another wave issues while one waits (the static model: one wave alone is
// bound by its own instruction issue, python -m rtcattn isa --backward-model). At 192 the bound left clang a 36-byte
// private segment (gfx942, gfx950): one wave there.
#if defined(RTC_EMU) || RTC_HEAD_DIM_MAX > 128
#define BWD_OCCUPANCY
#else
#define BWD_OCCUPANCY __attribute__((amdgpu_waves_per_eu(2)))
#endif
RTC_KERNEL(256) BWD_OCCUPANCY attention_bwd_gfx942(BwdParams bp) {
  RTC_SHARED(Tile, sm);
  if (bp.stage == BWD_STAGE_DELTA)
    delta_stage(bp, kThreads);
  else if (bp.stage == BWD_STAGE_DKDV)
    dkdv_stage(sm, bp);
  else
    dq_stage(sm, bp);
}
RTC_EXPORT_KERNEL(attention_bwd_gfx942, BwdParams)
