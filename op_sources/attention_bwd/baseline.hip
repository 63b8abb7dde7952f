// Portable SIMT attention backward (no matrix instructions): the reference implementation on every arch.
//
// Three launches of this kernel per call (BwdParams::stage, bwd_params.h), each a pure function of the inputs, with
// no atomics: the gradients are the same bits run to run (deterministic), whatever the call asks.
//   DELTA  delta_i = sum_c dO_ic O_ic - dlse_i                   one thread a query row   grid (Sq/128, H, B)
//   DKDV   dV_j = sum_h sum_i P_ij dO_i, dK_j = scale sum_h sum_i dS_ij q_i
//                                                                a block per 16 keys      grid (Sk/16, Hk, B)
//   DQ     dQ_i = scale sum_j dS_ij k_j                           a block per 16 rows      grid (Sq/16, H, B)
// with P_ij = exp2(s_ij scale log2(e) - LSE_i log2(e)) recomputed from the forward's LSE, s_ij = q_i . k_j,
// dP_ij = dO_i . v_j and dS_ij = P_ij (dP_ij - delta_i) (docs/numerics.md, the backward). GQA: the query heads h of
// K/V head hk are summed in order; rows, keys and columns are taken in ascending order everywhere.
// Dot products accumulate in fp32 over the elements' exact values; P (for dV) and dS (for dK and dQ) enter their
// products rounded to the element type, bf16 in the variant's mode (RTC_ROUND), fp16 to nearest even, as the
// gradients are when stored. A pair outside its row's window (RTC_MASK), a row that sees no key (LSE -inf) or a row
// or key past its sequence has P = dS = 0: such rows get dQ = 0, keys no row sees dK = dV = 0.
// Packed sequences (RTC_KV varlen): batch counts sequences, blocks past their sequence's rows exit at once.
// Score modifications (RTC_SCORE_MOD): P is recomputed from the modified score (score_mod.h), and dS takes the soft
// cap's derivative before its rounding (bwd_common.h, pair_p_ds_mod_bits).
#include "platform.h"
#include "bwd_common.h"

#ifndef RTC_HEAD_DIM_MAX
#error "RTC_HEAD_DIM_MAX (the head-dim bucket) must be defined"
#endif
#if RTC_HEAD_DIM_MAX % 8 != 0 || RTC_HEAD_DIM_MAX < 8 || RTC_HEAD_DIM_MAX > 256
#error "RTC_HEAD_DIM_MAX must be a multiple of 8 in [8, 256]"
#endif
#if RTC_DTYPE != RTC_DTYPE_BF16 && RTC_DTYPE != RTC_DTYPE_FP16
#error "RTC_DTYPE must be 0 (bf16) or 1 (fp16)"
#endif
#if RTC_KV == RTC_KV_PAGED || RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
#error "the backward takes dense or varlen K / V in q's dtype (a paged or quantized cache takes no gradients)"
#endif

namespace {

using namespace bwd;

constexpr int kThreads = 128;
constexpr int kTile = 16;                       // query rows of a row tile, keys of a key tile
constexpr int kD = RTC_HEAD_DIM_MAX;            // columns of the staged rows (the bucket)
constexpr int kLanes = kThreads / kTile;        // 8 threads share one row's (or key's) accumulators
constexpr int kColsPerLane = kD / kLanes;       // columns lane + kLanes * u of its row

struct Smem {
  rtc_smem<rtc_elem_t, kTile * kD> q, dout, k, v;  // a row tile (q, dO) and a key tile (k, v), zeros past the rows
  rtc_smem<float, kTile> lse, delta;                // the row tile's LSE (times log2(e)) and delta
  rtc_smem<float, kTile * kTile> p, ds;             // the tile's P and dS [row][key], rounded to the element type
};

// `rows` rows of d elements from base (row stride ss) into a tile; the rest of the tile reads as zeros.
RTC_DEVICE void stage_rows(rtc_smem<rtc_elem_t, kTile * kD>& dst, const rtc_elem_t* base, rtc_i64 ss, int rows, int d) {
  for (int i = threadIdx.x; i < kTile * kD; i += kThreads) {
    const int r = i / kD, c = i - r * kD;
    dst.st(i, r < rows && c < d ? rtc_gld(base + (rtc_i64)r * ss + c) : (rtc_elem_t)0);
  }
}

// The row tile's rows [i0, i0 + rows) of query head h: q and dO, their LSE (log2 domain) and delta.
RTC_DEVICE void stage_row_tile(Smem& sm, const BwdParams& bp, const Seq& seq, int b, int h, int i0, int rows) {
  const AttnParams& a = bp.a;
  stage_rows(sm.q, a.q + row_at(a.q_sb, a.q_ss, b, seq.q_row, i0) + (rtc_i64)h * a.q_sh, a.q_ss, rows, a.head_dim);
  stage_rows(sm.dout, bp.dout + row_at(bp.do_sb, bp.do_ss, b, seq.q_row, i0) + (rtc_i64)h * bp.do_sh, bp.do_ss, rows,
             a.head_dim);
  if ((int)threadIdx.x < kTile) {
    const int r = threadIdx.x;
    const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + i0 + r;
    sm.lse.st(r, r < rows ? rtc_gld(a.lse + at) * kLog2e : neg_inf());
    sm.delta.st(r, r < rows ? rtc_gld(bp.delta + at) : 0.0f);
  }
}

// The key tile's keys [j0, j0 + keys) of K/V head hk: k and v.
RTC_DEVICE void stage_key_tile(Smem& sm, const BwdParams& bp, const Seq& seq, int b, int hk, int j0, int keys) {
  const AttnParams& a = bp.a;
  stage_rows(sm.k, a.k + row_at(a.k_sb, a.k_ss, b, seq.k_row, j0) + (rtc_i64)hk * a.k_sh, a.k_ss, keys, a.head_dim);
  stage_rows(sm.v, a.v + row_at(a.v_sb, a.v_ss, b, seq.k_row, j0) + (rtc_i64)hk * a.v_sh, a.v_ss, keys, a.head_dim);
}

// P and dS of the staged tiles' pairs (row i, key j), two a thread. A row whose LSE is -inf sees no key (its P is 0,
// not exp2(+inf)); a NaN LSE or score makes the pair's P and dS NaN. view: the sequence's own lengths (the ALiBi
// distance's diagonal), slope_log2 the query head's ALiBi slope (score_mod.h).
// With dropout, each pair's keep bit is drawn again (dropout.h: the forward's, a function of (b, h, row, key)).
RTC_DEVICE void tile_p_ds(Smem& sm, const Pairs& pairs, int d, const AttnParams& view, float slope_log2, int b, int h) {
  const DropoutState drop = dropout_state(view);
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) {
    const int i = idx / kTile, j = idx - i * kTile;
    float s = 0.0f, dp = 0.0f;
    for (int c = 0; c < d; ++c) {
      s += elem_f32(sm.q.ld(i * kD + c)) * elem_f32(sm.k.ld(j * kD + c));
      dp += elem_f32(sm.dout.ld(i * kD + c)) * elem_f32(sm.v.ld(j * kD + c));
    }
    float p, ds;
    if (RTC_DROPOUT) {
      const rtc_i64 diag = (rtc_i64)pairs.i0 + i + view.seq_k - view.seq_q;
      const bool keep = dropout_keep(drop, view.drop_threshold, view.heads, b, h, pairs.i0 + i, pairs.j0 + j);
      rtc_elem_t pb, db;
      pair_p_ds_drop_bits(modded_score(s, view, slope_log2, pairs.j0 + j, diag, FastExp2{}, IeeeRcp{}), dp,
                          sm.lse.ld(i), sm.delta.ld(i), pairs.seen(i, j), keep, view.drop_scale, pb, db, FastExp2{});
      p = elem_f32(pb);
      ds = elem_f32(db);
    } else if (RTC_SCORE_MOD) {
      const rtc_i64 diag = (rtc_i64)pairs.i0 + i + view.seq_k - view.seq_q;
      rtc_elem_t pb, db;
      pair_p_ds_mod_bits(modded_score(s, view, slope_log2, pairs.j0 + j, diag, FastExp2{}, IeeeRcp{}), dp, sm.lse.ld(i),
                         sm.delta.ld(i), pairs.seen(i, j), pb, db, FastExp2{});
      p = elem_f32(pb);
      ds = elem_f32(db);
    } else {
      pair_p_ds(s, dp, sm.lse.ld(i), sm.delta.ld(i), pairs.seen(i, j), view.scale_log2, p, ds);
    }
    sm.p.st(idx, p);
    sm.ds.st(idx, ds);
  }
}

// A row of d gradients, acc[u] at column lane + kLanes * u, times `scale`, rounded to the element type.
RTC_DEVICE void store_row(rtc_elem_t* dst, const float (&acc)[kColsPerLane], float scale, int lane, int d) {
#pragma unroll
  for (int u = 0; u < kColsPerLane; ++u) {
    const int c = lane + kLanes * u;
    if (c < d) rtc_gst(dst + c, to_elem(acc[u] * scale));
  }
}

// 16 keys of K/V head hk: every row tile of every query head of its group that reaches them.
RTC_DEVICE void dkdv_stage(Smem& sm, const BwdParams& bp) {
  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kTile;
  const Seq seq = seq_of(bp.a, b);
  if (j0 >= seq.len_k) return;
  const AttnParams view = seq_view(bp.a, seq);
  const int keys = view.seq_k - j0 < kTile ? view.seq_k - j0 : kTile, d = view.head_dim;
  const int j = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  float dk[kColsPerLane], dv[kColsPerLane];
#pragma unroll
  for (int u = 0; u < kColsPerLane; ++u) dk[u] = dv[u] = 0.0f;
  stage_key_tile(sm, bp, seq, b, hk, j0, keys);
  const int group = view.heads / view.heads_k;
  for (int gi = 0; gi < group; ++gi)
    for (int i0 = 0; i0 < view.seq_q; i0 += kTile) {
      const int h = hk * group + gi;
      const int rows = view.seq_q - i0 < kTile ? view.seq_q - i0 : kTile;
      // Windows move right with the row: a tile whose last row ends before the keys, or whose first row starts
      // after them, sees none of them.
      if (RTC_MASK && (key_range(view, i0 + rows - 1).hi < j0 || key_range(view, i0).lo > j0 + keys - 1)) continue;
      __syncthreads();  // the previous row tile is no longer read
      stage_row_tile(sm, bp, seq, b, h, i0, rows);
      __syncthreads();
      tile_p_ds(sm, Pairs{window_of(view), i0, j0}, d, view, head_slope_log2(view, b, h), b, h);
      __syncthreads();
      for (int i = 0; i < kTile; ++i) {
        const float p = sm.p.ld(i * kTile + j), ds = sm.ds.ld(i * kTile + j);
#pragma unroll
        for (int u = 0; u < kColsPerLane; ++u) {  // columns past d are zeros of the tiles: no test, no branch
          const int c = lane + kLanes * u;
          dv[u] += p * elem_f32(sm.dout.ld(i * kD + c));
          dk[u] += ds * elem_f32(sm.q.ld(i * kD + c));
        }
      }
    }
  if (j >= keys) return;
  const AttnParams& a = bp.a;
  store_row(bp.dk + row_at(bp.dk_sb, bp.dk_ss, b, seq.k_row, j0 + j) + (rtc_i64)hk * bp.dk_sh, dk, a.scale, lane, d);
  store_row(bp.dv + row_at(bp.dv_sb, bp.dv_ss, b, seq.k_row, j0 + j) + (rtc_i64)hk * bp.dv_sh, dv, 1.0f, lane, d);
}

// 16 rows of query head h: every key tile their windows reach.
RTC_DEVICE void dq_stage(Smem& sm, const BwdParams& bp) {
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kTile;
  const Seq seq = seq_of(bp.a, b);
  if (i0 >= seq.len_q) return;
  const AttnParams view = seq_view(bp.a, seq);
  const int rows = view.seq_q - i0 < kTile ? view.seq_q - i0 : kTile, d = view.head_dim;
  const int i = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  int kv_begin = 0, kv_end = view.seq_k;
  if (RTC_MASK) {
    const KeyRange first = key_range(view, i0), last = key_range(view, i0 + rows - 1);
    kv_begin = (int)(first.lo / kTile) * kTile;
    kv_end = last.hi < first.lo ? kv_begin : (int)last.hi + 1;  // no row sees a key: no tile
  }
  float dq[kColsPerLane];
#pragma unroll
  for (int u = 0; u < kColsPerLane; ++u) dq[u] = 0.0f;
  stage_row_tile(sm, bp, seq, b, h, i0, rows);
  const int hk = kv_head(view, h);
  const float slope_log2 = head_slope_log2(view, b, h);
  for (int j0 = kv_begin; j0 < kv_end; j0 += kTile) {
    const int keys = view.seq_k - j0 < kTile ? view.seq_k - j0 : kTile;
    __syncthreads();  // the previous key tile is no longer read
    stage_key_tile(sm, bp, seq, b, hk, j0, keys);
    __syncthreads();
    tile_p_ds(sm, Pairs{window_of(view), i0, j0}, d, view, slope_log2, b, h);
    __syncthreads();
    for (int j = 0; j < kTile; ++j) {
      const float ds = sm.ds.ld(i * kTile + j);
#pragma unroll
      for (int u = 0; u < kColsPerLane; ++u) dq[u] += ds * elem_f32(sm.k.ld(j * kD + lane + kLanes * u));
    }
  }
  if (i >= rows) return;
  store_row(bp.dq + row_at(bp.dq_sb, bp.dq_ss, b, seq.q_row, i0 + i) + (rtc_i64)h * bp.dq_sh, dq, view.scale, lane, d);
}

}  // namespace

// One block resident at the launch bound: with 128 threads and no minimum, ptxas capped the registers near 64 and
// spilled a few bytes at some buckets.
RTC_KERNEL_ONE_BLOCK(128) attention_bwd_baseline(BwdParams bp) {
  RTC_SHARED(Smem, sm);
  if (bp.stage == BWD_STAGE_DELTA)
    delta_stage(bp, kThreads);
  else if (bp.stage == BWD_STAGE_DKDV)
    dkdv_stage(sm, bp);
  else
    dq_stage(sm, bp);
}
RTC_EXPORT_KERNEL(attention_bwd_baseline, BwdParams)
