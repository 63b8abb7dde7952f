// The DQ stage of the sm_90a backward: a CTA per 128 query rows of one head, 64 a warpgroup; the keys their windows
// reach stream past, dq_keys a step (dq_keys_masked under a window: sm90/plan.h): per step each warpgroup forms
//   S = Q K^T and dP = dO V^T   (SS: rows x keys, over the head dim)
//   dS                         (sm90/pairs.h)
//   dQ += dS K                 (RS: dS from registers, K read with its head dim contiguous)
// then stores dQ times the scale. K and V come by cp.async into a two-slot ring, the next step's copy in flight under
// this step's GEMMs.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bwd_common.h"
#include "sm90/tiles.h"
#include "sm90/pairs.h"

namespace bwd90 {

constexpr int kDqRows = bwd_sm90_dq_rows(kPlan);
constexpr int kDqKeys = bwd_sm90_dq_keys(kPlan, RTC_MASK != 0, (RTC_SOFTCAP || RTC_ALIBI) && RTC_DROPOUT);
constexpr int kKeyTile = bwd_sm90_tile_bytes(kPlan, kDqKeys);

// This thread's two rows (row0: the warpgroup's first row in the sequence): LSE, delta and key range.
RTC_DEVICE DqRows dq_rows(const BwdParams& bp, const Seq& seq, const Window& w, int h, int row0) {
  DqRows rw;
  const float inf = rtc_bits_f32(0x7F800000u);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + acc_row(i);
    const bool in = r < seq.len_q;
    const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + (in ? r : 0);
    const float lse = rtc_gld(bp.a.lse + at);
    rw.lse2[i] = in && lse != -inf ? lse * bwd::kLog2e : inf;
    rw.delta[i] = in ? rtc_gld(bp.delta + at) : 0.0f;
    const KeyRange kr = key_range(w, r);
    rw.lo[i] = (int)kr.lo;
    rw.hi[i] = kr.hi < kr.lo ? -1 : (int)kr.hi;
  }
#if RTC_SCORE_MOD
  rw.d0 = (float)(acc_col(0, 0) - ((rtc_i64)row0 + acc_row(0) + w.seq_k - w.seq_q));
#endif
  return rw;
}

// The copies of key block n of K/V head hk into a slot (K, then V).
RTC_DEVICE void load_keys(const BwdParams& bp, const Seq& seq, int b, int hk, int n, rtc_u32 slot) {
  const AttnParams& a = bp.a;
  const int n0 = n * kDqKeys, valid = seq.len_k - n0 < kDqKeys ? seq.len_k - n0 : kDqKeys;
  load_tile<kDqKeys>(slot, a.k + bwd::row_at(a.k_sb, a.k_ss, b, seq.k_row, n0) + (rtc_i64)hk * a.k_sh, a.k_ss, valid,
                     a.head_dim);
  load_tile<kDqKeys>(slot + kKeyTile, a.v + bwd::row_at(a.v_sb, a.v_ss, b, seq.k_row, n0) + (rtc_i64)hk * a.v_sh,
                     a.v_ss, valid, a.head_dim);
}

// One step of one warpgroup: its 64 rows (q_rows, do_rows) against the slot's keys.
RTC_DEVICE void dq_step(float (&dq)[kD / 2], rtc_u32 q_rows, rtc_u32 do_rows, rtc_u32 slot, const DqRows& rw,
                        float scale_log2, bool cut, int n0, const PairMods& md, const PairDrop& dr, int row0,
                        const AttnParams& a) {
  float s[kDqKeys / 2], dp[kDqKeys / 2];
  rtc_u32 pd[kDqKeys / 4];
  sm90::wgmma_fence();
  issue_ss<kDqKeys>(s, q_rows, block_stride(kDqRows), slot, block_stride(kDqKeys));
  issue_ss<kDqKeys>(dp, do_rows, block_stride(kDqRows), slot + kKeyTile, block_stride(kDqKeys));
  sm90::wgmma_commit();
  const rtc_u64 keep = dq_keep<kDqKeys>(dr, a, row0, n0);  // under the GEMMs
  sm90::wgmma_wait<0>();
  sm90::fence_regs(s);
  sm90::fence_regs(dp);
  if constexpr (RTC_SCORE_MOD != 0)
    dq_ds_mod<kDqKeys>(s, dp, pd, rw, scale_log2, cut, n0, md, keep, a.drop_scale);
  else
    dq_ds<kDqKeys>(s, dp, pd, rw, scale_log2, cut, n0, keep, a.drop_scale);
  sm90::wgmma_fence();
  issue_rs<kD, kDqKeys>(dq, pd, slot, block_stride(kDqKeys));
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_regs(dq);
}

RTC_DEVICE void dq_stage(const BwdParams& bp, rtc_u32 base) {
  const AttnParams& a = bp.a;
  const int b = blockIdx.z, h = blockIdx.y;
  // Under a mask the last row blocks reach the most keys: they go first.
  const int mb = RTC_MASK ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x, m0 = mb * kDqRows;
  const Seq seq = seq_of(a, b);
  if (m0 >= seq.len_q) return;
  const AttnParams view = seq_view(a, seq);
  const Window w = window_of(view);
  const int rows = seq.len_q - m0 < kDqRows ? seq.len_q - m0 : kDqRows, hk = kv_head(view, h);
  const int wg = sm90::warp_uniform(threadIdx.x / 128);
  const rtc_u32 q_tile = base, do_tile = base + bwd_sm90_tile_bytes(kPlan, kDqRows);
  const rtc_u32 slots = do_tile + bwd_sm90_tile_bytes(kPlan, kDqRows);
  load_tile<kDqRows>(q_tile, a.q + bwd::row_at(a.q_sb, a.q_ss, b, seq.q_row, m0) + (rtc_i64)h * a.q_sh, a.q_ss, rows,
                     a.head_dim);
  load_tile<kDqRows>(do_tile, bp.dout + bwd::row_at(bp.do_sb, bp.do_ss, b, seq.q_row, m0) + (rtc_i64)h * bp.do_sh,
                     bp.do_ss, rows, a.head_dim);
  const KvSpan sp = kv_span(view, m0, rows, kDqKeys, RTC_MASK);
  const Ring ring{slots + 4 * kKeyTile};
  ring.init();
  if (sp.begin < sp.end) load_keys(bp, seq, b, hk, sp.begin, slots);
  ring.filled(0);  // Q and dO land with the first key block
  const DqRows rw = dq_rows(bp, seq, w, h, m0 + 64 * wg);
  const PairMods md = PairMods::of(a, b, h);
  const PairDrop dr = PairDrop::of(a, b, h);
  float dq[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dq[i] = 0.0f;
  if (sp.begin >= sp.end) ring.wait(0);  // no key: dQ is 0, stored once the copies are done
  for (int n = sp.begin; n < sp.end; ++n) {
    const int s = n - sp.begin;
    if (n + 1 < sp.end) {
      ring.acquire(s + 1);
      load_keys(bp, seq, b, hk, n + 1, slots + ((s + 1) & 1) * 2 * kKeyTile);
      ring.filled(s + 1);
    }
    ring.wait(s);
    const bool cut = n < sp.full_begin || n >= sp.full_end;
    dq_step(dq, q_tile + 64 * wg * 128, do_tile + 64 * wg * 128, slots + (s & 1) * 2 * kKeyTile, rw, view.scale_log2,
            cut, n * kDqKeys, md, dr, m0 + 64 * wg, a);
    ring.release(s);
  }
  const int row0 = 64 * wg;
  store_acc<kD>(bp.dq + bwd::row_at(bp.dq_sb, bp.dq_ss, b, seq.q_row, m0 + row0) + (rtc_i64)h * bp.dq_sh, bp.dq_ss, dq,
                rows - row0, 0, a.head_dim, a.scale);
}

}  // namespace bwd90
