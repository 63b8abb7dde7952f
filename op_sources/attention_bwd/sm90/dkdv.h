// The DKDV stage of the sm_90a backward: a CTA per key block of one K/V head (sm90/plan.h), the rows of every query
// head of its group streaming past: per step of 64 rows, each warpgroup forms
//   S^T = K Q^T and dP^T = V dO^T   (SS: keys x rows, over the head dim)
//   P^T, dS^T                      (sm90/pairs.h)
//   dV += P^T dO, dK += dS^T Q      (RS: P^T and dS^T from registers)
// then stores dK (times the scale) and dV. Q, dO and the rows' LSE and delta come by cp.async into a two-slot ring,
// the next step's copy in flight under this step's GEMMs. Without `deterministic` (bp.dq_accum set) each step also adds
// dQ of its rows into the fp32 sums (sm90/dq_accum.h).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bwd_common.h"
#include "sm90/tiles.h"
#include "sm90/pairs.h"
#include "sm90/dq_accum.h"

namespace bwd90 {

constexpr int kKvKeys = bwd_sm90_kv_keys(kPlan);
constexpr int kRows = BWD_SM90_ROWS;
constexpr int kRowTile = bwd_sm90_tile_bytes(kPlan, kRows);  // bytes of a 64-row tile
constexpr int kSlotBytes = bwd_sm90_dkdv_slot_bytes(kPlan);
static_assert(kSlotBytes % 1024 == 0 && kRowTile % 1024 == 0 && bwd_sm90_tile_bytes(kPlan, kKvKeys) % 1024 == 0,
              "every tile starts on a 1024-byte period (the 128-byte swizzle's)");

// The stage's shared memory (sm90/plan.h): K and V, the row ring's slots, the dS slots, the two rings' barriers.
struct DkdvSmem {
  rtc_u32 k, v, slots, ds, bars;
  RTC_DEVICE explicit DkdvSmem(rtc_u32 base) {
    k = base;
    v = k + bwd_sm90_tile_bytes(kPlan, kKvKeys);
    slots = v + bwd_sm90_tile_bytes(kPlan, kKvKeys);
    ds = slots + 2 * kSlotBytes;
    bars = ds + 2 * kDsSlot;
  }
  RTC_DEVICE Ring rows() const { return Ring{bars}; }
  RTC_DEVICE Ring ds_ring() const { return Ring{bars + 32}; }
};
static_assert(BWD_SM90_BAR_BYTES >= 64, "two rings of four 8-byte barriers");

// One slot of the row ring: Q, dO, then the LSE and delta vectors.
struct RowSlot {
  rtc_u32 q, dout, lse, delta;
  RTC_DEVICE static RowSlot at(rtc_u32 slots, int s) {
    RowSlot r;
    r.q = slots + s * kSlotBytes;
    r.dout = r.q + kRowTile;
    r.lse = r.dout + kRowTile;
    r.delta = r.lse + kRows * 4;
    return r;
  }
};

// The first index in [lo, hi) where a predicate that turns true once (monotone) is true; hi when none.
template <class F> RTC_DEVICE int first_true(int lo, int hi, const F& f) {
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (f(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// The row blocks of 64 whose rows see some key of [k_lo, k_hi]: [begin, end). Windows move right with the row, so
// both bounds are monotone in the block.
RTC_DEVICE void row_blocks(const Window& w, int k_lo, int k_hi, int& begin, int& end) {
  const int nmb = (w.seq_q + kRows - 1) / kRows;
  begin = 0;
  end = nmb;
  if (!RTC_MASK) return;
  auto last_row = [&](int m) { return (m + 1) * kRows - 1 < w.seq_q - 1 ? (m + 1) * kRows - 1 : w.seq_q - 1; };
  begin = first_true(0, nmb, [&](int m) { return key_range(w, last_row(m)).hi >= k_lo; });
  end = first_true(begin, nmb, [&](int m) { return key_range(w, (rtc_i64)m * kRows).lo > k_hi; });
}

// What one warpgroup accumulates: dV and dK of its 64 keys over kCols head-dim columns from col0.
template <int kCols> struct KvAcc {
  float dv[kCols / 2], dk[kCols / 2];
};

// The copies of step s: query head h's rows [m0, m0 + 64) into a slot.
RTC_DEVICE void load_rows(const BwdParams& bp, const Seq& seq, int b, int h, int m0, const RowSlot& sl) {
  const AttnParams& a = bp.a;
  const int valid = seq.len_q - m0 < kRows ? seq.len_q - m0 : kRows;
  load_tile<kRows>(sl.q, a.q + bwd::row_at(a.q_sb, a.q_ss, b, seq.q_row, m0) + (rtc_i64)h * a.q_sh, a.q_ss, valid,
                   a.head_dim);
  load_tile<kRows>(sl.dout, bp.dout + bwd::row_at(bp.do_sb, bp.do_ss, b, seq.q_row, m0) + (rtc_i64)h * bp.do_sh,
                   bp.do_ss, valid, a.head_dim);
  const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + m0;
  load_row_vecs(sl.lse, sl.delta, a.lse + at, bp.delta + at, valid);
}

// Where a step's dS^T goes (the buckets that fuse dQ): the dS ring (whether it runs: when the other warpgroup reads
// this one's rows, for the fused dQ), the step, the slot, the keys' range, the warpgroup.
struct DsOut {
  Ring ring;
  bool ring_on;
  int step;
  rtc_u32 slot;
  int key0, keys, wg;
};

// One step of one warpgroup: its 64 keys (k_rows in the K and V tiles) against the slot's 64 rows. At the buckets that
// fuse dQ, dS^T goes through the step's dS slot (the fused dQ's A operand, sm90/dq_accum.h) and is the dK GEMM's A from
// there, with or without `deterministic` (one code path: two spilled at D 128): dp and its packed words end at the
// store, not under the GEMM; the warpgroup's own rows of the slot are its A (its 128 threads' stores: a warpgroup
// barrier). Elsewhere dK's A is dS^T from registers.
template <int kCols>
RTC_DEVICE void kv_step(KvAcc<kCols>& acc, rtc_u32 k_rows, rtc_u32 v_rows, const RowSlot& sl, int col_blk,
                        float scale_log2, bool cut, const KvCut& kc, const DsOut& ds, const PairMods& md,
                        const PairDrop& dr, const AttnParams& a) {
  float s[32], dp[32];
  rtc_u32 pp[16], pd[16];
  sm90::wgmma_fence();
  issue_ss<kRows>(s, k_rows, block_stride(kKvKeys), sl.q, block_stride(kRows));
  sm90::wgmma_commit();
  issue_ss<kRows>(dp, v_rows, block_stride(kKvKeys), sl.dout, block_stride(kRows));
  sm90::wgmma_commit();
  const rtc_u32 keep = kv_keep(dr, a, kc.m0, kc.k0);  // under the GEMMs
  const float z = a.drop_scale;
  float cols[16];
  if constexpr (RTC_SCORE_MOD != 0) {
    sm90::wgmma_wait<1>();
    sm90::fence_regs(s);
    kv_p_mod(s, pp, sl.lse, scale_log2, cut, kc, md, keep);  // s: P^T times the cap's derivative, for kv_ds
  } else {
    kv_cols(cols, sl.lse);
    sm90::wgmma_wait<1>();
    sm90::fence_regs(s);
    kv_p(s, pp, cols, scale_log2, cut, kc, keep);
  }
  sm90::wgmma_fence();
  issue_rs<kCols, kRows>(acc.dv, pp, sl.dout + col_blk * block_stride(kRows), block_stride(kRows));
  sm90::wgmma_commit();
  kv_cols(cols, sl.delta);
  sm90::wgmma_wait<1>();
  sm90::fence_regs(dp);
  kv_ds(s, dp, pd, cols, keep, z);
  if constexpr (bwd_sm90_dq_fused(kPlan)) {
    if (ds.ring_on) ds.ring.acquire(ds.step);  // else: the slot's last reader was this warpgroup's dK GEMM, done
    store_ds(ds.slot, pd, ds.key0, ds.keys);
    if (ds.ring_on)
      ds.ring.stored(ds.step);
    else
      sm90::fence_proxy_async_smem();
    sm90::named_sync(1 + ds.wg, 128);  // the warpgroup's rows of the slot stored: its dK GEMM's A
    sm90::wgmma_fence();
    issue_ss_bmn<kCols, kRows>(acc.dk, ds.slot + ds.key0 * 128, sl.q + col_blk * block_stride(kRows),
                               block_stride(kRows));
  } else {
    sm90::wgmma_fence();
    issue_rs<kCols, kRows>(acc.dk, pd, sl.q + col_blk * block_stride(kRows), block_stride(kRows));
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_regs(acc.dv);
  sm90::fence_regs(acc.dk);
}

// The stage for warpgroup wg's share: keys [key0, key0 + 64) of the CTA's block, head-dim columns from col_blk * 64;
// with bp.dq_accum set, its dQ GEMMs of each step.
template <int kCols>
RTC_DEVICE void dkdv_run(const BwdParams& bp, rtc_u32 base, int wg, int key0, int col_blk) {
  const AttnParams& a = bp.a;
  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * kKvKeys;
  const Seq seq = seq_of(a, b);
  const AttnParams view = seq_view(a, seq);
  const Window w = window_of(view);
  const int keys = view.seq_k - n0 < kKvKeys ? view.seq_k - n0 : kKvKeys;
  const DkdvSmem sm(base);
  const rtc_u32 k_tile = sm.k, v_tile = sm.v, slots = sm.slots;
  load_tile<kKvKeys>(k_tile, a.k + bwd::row_at(a.k_sb, a.k_ss, b, seq.k_row, n0) + (rtc_i64)hk * a.k_sh, a.k_ss, keys,
                     a.head_dim);
  load_tile<kKvKeys>(v_tile, a.v + bwd::row_at(a.v_sb, a.v_ss, b, seq.k_row, n0) + (rtc_i64)hk * a.v_sh, a.v_ss, keys,
                     a.head_dim);
  int mb_begin, mb_end;
  row_blocks(w, n0, n0 + keys - 1, mb_begin, mb_end);
  const int group = view.heads / view.heads_k, per_head = mb_end - mb_begin, steps = group * per_head;
  KvAcc<kCols> acc;
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) acc.dv[i] = acc.dk[i] = 0.0f;
  auto head_of = [&](int s) { return hk * group + s / per_head; };
  auto row0_of = [&](int s) { return (mb_begin + s % per_head) * kRows; };
  const Ring ring = sm.rows(), ds_ring = sm.ds_ring();  // initialised by dkdv_stage, before the warpgroups part
  const bool fused = bwd_sm90_dq_fused(kPlan) && bp.dq_accum;
  if (steps > 0) load_rows(bp, seq, b, head_of(0), row0_of(0), RowSlot::at(slots, 0));
  ring.filled(0);  // K and V land with step 0's rows
  if (steps == 0) ring.wait(0);  // no row sees the keys: dK = dV = 0, stored once the copies are done
  for (int s = 0; s < steps; ++s) {
    const RowSlot sl = RowSlot::at(slots, s & 1);
    const int m0 = row0_of(s);
    if (s + 1 < steps) {
      ring.acquire(s + 1);
      load_rows(bp, seq, b, head_of(s + 1), row0_of(s + 1), RowSlot::at(slots, (s + 1) & 1));
      ring.filled(s + 1);
    }
    ring.wait(s);
    // Cut by the window: not every row of the step sees every key of the block.
    const int r_last = seq.len_q - 1 < m0 + kRows - 1 ? seq.len_q - 1 : m0 + kRows - 1;
    const bool cut = RTC_MASK && (key_range(w, r_last).lo > n0 || key_range(w, m0).hi < n0 + keys - 1);
    const DsOut ds{ds_ring, fused, s, sm.ds + (s & 1) * kDsSlot, key0, keys, wg};
    kv_step<kCols>(acc, k_tile + key0 * 128, v_tile + key0 * 128, sl, col_blk, view.scale_log2, cut,
                   KvCut{w, m0, n0 + key0}, ds, PairMods::of(a, b, head_of(s)), PairDrop::of(a, b, head_of(s)), a);
    ring.release(s);
    if (fused) dq_step_sums(ds_ring, s, wg, ds.slot, k_tile, dq_tile(bp, seq, b, head_of(s), m0));
  }
  const int valid = keys - key0;
  store_acc<kCols>(bp.dk + bwd::row_at(bp.dk_sb, bp.dk_ss, b, seq.k_row, n0 + key0) + (rtc_i64)hk * bp.dk_sh, bp.dk_ss,
                   acc.dk, valid, col_blk * 64, a.head_dim, a.scale);
  store_acc<kCols>(bp.dv + bwd::row_at(bp.dv_sb, bp.dv_ss, b, seq.k_row, n0 + key0) + (rtc_i64)hk * bp.dv_sh, bp.dv_ss,
                   acc.dv, valid, col_blk * 64, a.head_dim, RTC_DROPOUT ? a.drop_scale : 1.0f);
}

// The stage: each warpgroup its share of the key block (sm90/plan.h's kv_split).
// Inlined beside the DQ stage, ptxas spills about 90 bytes in the 256 bucket's packed window variant (each stage alone
// compiles without); that variant alone calls the stage as a function, which costs its wgmma pipelining there (ptxas
// C7510: serialized at the call boundary; tests/cpu/test_backward_compile.py lists it, docs/NOTES.md).
#if RTC_HEAD_DIM_MAX > 192 && RTC_MASK && RTC_KV != RTC_KV_DENSE
#define BWD90_DKDV_STAGE __device__ __noinline__
#else
#define BWD90_DKDV_STAGE RTC_DEVICE
#endif
BWD90_DKDV_STAGE void dkdv_stage(const BwdParams& bp, rtc_u32 base) {
  const int n0 = blockIdx.x * kKvKeys;
  if (n0 >= seq_of(bp.a, blockIdx.z).len_k) return;
  // The rings' barriers, initialised behind the CTA barriers of the stage, outside the warpgroups' branches below.
  const DkdvSmem sm(base);
  sm.rows().init();
  sm.ds_ring().init();
  const int wg = sm90::warp_uniform(threadIdx.x / 128);
  if constexpr (kPlan.kv_split == 1) {
    dkdv_run<kD>(bp, base, wg, 64 * wg, 0);
  } else {
    constexpr int kFirst = bwd_sm90_split_cols(kPlan);
    if constexpr (kFirst == kD - kFirst)  // even shares: one copy of the code, the columns by warpgroup
      dkdv_run<kFirst>(bp, base, wg, 0, wg * (kFirst / 64));
    else if (wg == 0)
      dkdv_run<kFirst>(bp, base, 0, 0, 0);
    else
      dkdv_run<kD - kFirst>(bp, base, 1, 0, kFirst / 64);
  }
}

}  // namespace bwd90
