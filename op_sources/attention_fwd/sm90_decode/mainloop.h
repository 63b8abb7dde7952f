// The sm_90a decode kernel's main loop: per stage of kStageKeys keys (16-key blocks in TMA's swizzled tiles: 64 keys,
// 128 below 96, 32 at 256), each warp takes a row tile, every groups-th block of the stage from its key group kg on, and its share of O's
// columns (Role). Per block it runs S = Q K^T (mma.sync m16n8k16, the tile's 16 packed rows as M; with a column
// split both warps of a block compute all of S), the mask, the online softmax, and O += P V over its columns with P
// straight from the score registers; the TMA ring stays kStages - 1 stages ahead. Each warp keeps its own row max,
// row sum and O over its keys; the epilogue combines a row tile's key groups.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"
#include "sm90/softmax.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90_decode/mask.h"
#include "sm90_decode/loads.h"
#include "sm90_decode/kv_frag.h"
#include "kv_quant.h"  // kv_descale

namespace sm90dec {

// While a warp holds at most 128 of O's columns the Q fragments stay in registers (kBucket / 4 of them); above, they
// are read from shared memory at every k-step (O's accumulators leave no room for them).
constexpr bool kQInRegs = kWarpCols <= 128;

// A warp's place in the CTA: row tile rt, key group kg of `groups` (it takes the stage's blocks kg, kg + groups, ...)
// and column share ch (columns [ch kWarpCols, (ch + 1) kWarpCols) of O). Warps of one (row tile, key group) are
// adjacent; slot = rt groups + kg indexes the epilogue's combine.
struct Role {
  int rt, kg, ch, groups;
  RTC_DEVICE static Role of(int warp, int row_tiles) {
    Role r;
    r.groups = SM90_DECODE_WARPS / (row_tiles * kColSplit);
    const int per_tile = r.groups * kColSplit;
    r.rt = warp / per_tile;
    r.kg = (warp - r.rt * per_tile) / kColSplit;
    r.ch = warp % kColSplit;
    return r;
  }
  RTC_DEVICE int slot() const { return rt * groups + kg; }
};

// A warp's running state for its two rows per thread (rows lane / 4 and lane / 4 + 8 of the item): raw-score max m,
// this thread's share of the row sum l (the quad's four shares are added at the end), and O over the warp's keys.
// The layout of s and o, index 4 j + 2 i + c: n-tile j, row lane / 4 + 8 i; s's column 8 j + 2 (lane % 4) + c, o's
// o_col(j, c, lane) of the warp's columns (kv_frag.h: FP8's V fragments permute them).
struct WarpState {
  float m[2], l[2];
  float o[kAccO];
  RTC_DEVICE void init() {
#pragma unroll
    for (int i = 0; i < 2; ++i) m[i] = sm90::neg_inf(), l[i] = 0.f;
#pragma unroll
    for (int x = 0; x < kAccO; ++x) o[x] = 0.f;
  }
};

// A warp's blocks of a stage are taken NB at a time (Blocks): their scores side by side, one softmax over them
// (one max, one rescale of O), then their P V. Up to the 128 bucket two at a time (a warp with two or four blocks a
// stage: row tiles 2 or 4), which puts two independent chains of MMAs in flight where one block's S waits on its
// previous k-step; above, one (O's registers leave no room for two blocks' scores).
constexpr int kJoint = kBucket <= 128 ? 2 : 1;

// NB 16-key blocks of the stage in `slot`: block0, block0 + stride, ...; scores index 8 nb + 4 j + 2 i + c (block nb,
// n-tile j, row lane / 4 + 8 i, column 8 j + 2 (lane % 4) + c).
template <int NB>
struct Blocks {
  int block0, stride;
  RTC_DEVICE int block(int nb) const { return block0 + nb * stride; }
};

// S = Q K^T over the blocks: n-tile 0 of a block is its keys 0-7, n-tile 1 keys 8-15; the K B fragments of kKGroup
// k-steps come from one ldmatrix per block (k_frags: keys (lane & 7) + 8 (lane >> 4)).
template <int NB>
RTC_DEVICE void scores(float (&s)[8 * NB], const rtc_u32 (&qf)[kQInRegs ? kKSteps : 1][4], const Smem& sm, int slot,
                       const Blocks<NB>& bl, int rt, int lane) {
#pragma unroll
  for (int x = 0; x < 8 * NB; ++x) s[x] = 0.f;
  int key[NB];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) key[nb] = 16 * bl.block(nb) + (lane & 7) + ((lane >> 4) << 3);
  // Q from shared memory (above the 128 bucket): four k-steps at a time keep their addresses out of O's registers.
#pragma unroll(kQInRegs ? kKLoads : (4 + kKGroup - 1) / kKGroup)
  for (int kq = 0; kq < kKLoads; ++kq) {
    rtc_u32 b[NB][kKGroup][2][2];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) k_frags(b[nb], sm.k(slot), key[nb], kq, lane);
#pragma unroll
    for (int h = 0; h < kKGroup; ++h) {
      const int ks = kKGroup * kq + h;
      if (ks >= kKSteps) break;  // FP4 at D 32, 96, 160: the load's last k-steps are past the bucket
      rtc_u32 a[4];
      if (kQInRegs) {
#pragma unroll
        for (int x = 0; x < 4; ++x) a[x] = qf[kQInRegs ? ks : 0][x];
      } else {
        q_frag(a, sm, rt, ks, lane);
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(s + 8 * nb), a, b[nb][h][0][0], b[nb][h][0][1]);
        sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(s + 8 * nb + 4), a, b[nb][h][1][0], b[nb][h][1][1]);
      }
    }
  }
}

// The online softmax of the blocks' scores, in the prefill kernel's conventions (sm90/softmax.h): the row max
// scaled rounding down, p = 2^(s c - m c) with one FFMA, a row max of -inf taken as 0; O and l rescaled.
template <int NB>
RTC_DEVICE void softmax(float (&s)[8 * NB], WarpState& st, float c) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = st.m[i];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
      mx = fmaxf(mx, fmaxf(fmaxf(s[8 * nb + 2 * i], s[8 * nb + 2 * i + 1]),
                           fmaxf(s[8 * nb + 4 + 2 * i], s[8 * nb + 4 + 2 * i + 1])));
    mx = fmaxf(mx, sm90::shfl_xor(mx, 1));
    mx = fmaxf(mx, sm90::shfl_xor(mx, 2));
    const float ms = mx == sm90::neg_inf() ? 0.f : sm90::scale_max(mx, c);
    const float rescale = sm90::ex2(sm90::scale_max(st.m[i], c) - ms);
    st.m[i] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float& x = s[8 * nb + 4 * j + 2 * i + k];
          x = sm90::ex2(sm90::scaled_diff(x, c, ms));
          sum += x;
        }
    st.l[i] = st.l[i] * rescale + sum;
#pragma unroll
    for (int j = 0; j < kAccO / 4; ++j) {
      st.o[4 * j + 2 * i] *= rescale;
      st.o[4 * j + 2 * i + 1] *= rescale;
    }
  }
}

// O += P V over the blocks, the warp's columns (share ch): a block's P A fragment is its scores' registers packed in
// pairs (the raw form: a NaN p keeps its row sum NaN, sm90/softmax.h); V's B fragments through ldmatrix.trans, kVTiles
// n-tiles per call (v_frags: keys (lane & 7) + 8 ((lane >> 3) & 1), 16-byte pieces 2 (ch kVLoads + dp) + (lane >> 4)).
// FP4: p times its key's V scale (vs, as row_scales gives it) before the rounding: a power of two, so exact where the
// product stays in the element's normal range (always for bf16; docs/numerics.md §10).
template <int NB>
RTC_DEVICE void accumulate(const float (&s)[8 * NB], const float (&vs)[kKvFp4 ? 4 * NB : 1], WarpState& st,
                           const Smem& sm, int slot, const Blocks<NB>& bl, int ch, int lane) {
  rtc_u32 a[NB][4];
  int key[NB];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      float p0 = s[8 * nb + 2 * x], p1 = s[8 * nb + 2 * x + 1];
      if (kKvFp4) {  // x = 2 j + i: n-tile j, keys 8 j + 2t + c
        p0 *= vs[kKvFp4 ? 4 * nb + 2 * (x / 2) : 0];
        p1 *= vs[kKvFp4 ? 4 * nb + 2 * (x / 2) + 1 : 0];
      }
      a[nb][x] = sm90::pack2_raw(p0, p1);
    }
    key[nb] = 16 * bl.block(nb) + (lane & 7) + ((lane >> 3) & 1) * 8;
  }
#pragma unroll
  for (int dp = 0; dp < kVLoads; ++dp) {
    const int piece = 2 * (ch * kVLoads + dp) + (lane >> 4);
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      rtc_u32 b[kVTiles][2];
      v_frags(b, sm.v(slot), key[nb], piece);
#pragma unroll
      for (int j = 0; j < kVTiles; ++j) {
        if (kVTiles * dp + j >= kWarpCols / 8) break;  // FP4 at D 32, 96, 160: n-tiles past the bucket
        sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(st.o + 4 * (kVTiles * dp + j)), a[nb], b[j][0], b[j][1]);
      }
    }
  }
}

// FP4: the scales 2^(e - 127) of this thread's keys of the blocks, K's (ks) and V's (vs), index 4 nb + 2 j + c: key
// 16 block(nb) + 8 j + 2 (lane % 4) + c of the stage, from the slot's scale bytes (ScaleGather). E8M0 0 is 2^-127 (an
// fp32 subnormal), 0xFF NaN.
RTC_DEVICE float e8m0_value(rtc_u32 e) {
  return __uint_as_float(e == 0u ? 0x00400000u : e == 0xFFu ? 0x7FC00000u : e << 23);
}
template <int NB>
RTC_DEVICE void row_scales(float (&ks)[4 * NB], float (&vs)[4 * NB], const Smem& sm, int slot, const Blocks<NB>& bl,
                           int lane) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int key = 16 * bl.block(nb) + 8 * j + 2 * (lane % 4);
      const rtc_u32 k2 = sm90::ld_shared_u16(sm.scales(slot, 0) + key),
                    v2 = sm90::ld_shared_u16(sm.scales(slot, 1) + key);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        ks[4 * nb + 2 * j + c] = e8m0_value((k2 >> (8 * c)) & 0xFFu);
        vs[4 * nb + 2 * j + c] = e8m0_value((v2 >> (8 * c)) & 0xFFu);
      }
    }
}

// One step of a warp over NB of its blocks of the stage n in `slot`: S (an FP8 cache's k_descale on each score, an FP4
// cache's K scale on its key's), the score modifications (RTC_SCORE_MOD), the mask where the stage needs it, the
// softmax, P V (FP4: p times its V scale).
template <int NB>
RTC_DEVICE void step(const Sm90DecodeParams& p, const Smem& sm, const rtc_u32 (&qf)[kQInRegs ? kKSteps : 1][4],
                     const RowKeys (&rk)[2], const RowMods& md, WarpState& st, const Role& role, int slot, int n,
                     bool edge, const Blocks<NB>& bl, float k_descale, int lane) {
  float s[8 * NB], ks[kKvFp4 ? 4 * NB : 1], vs[kKvFp4 ? 4 * NB : 1];
  if (kKvFp4)
    row_scales<NB>(*reinterpret_cast<float(*)[4 * NB]>(ks), *reinterpret_cast<float(*)[4 * NB]>(vs), sm, slot, bl,
                   lane);
  scores<NB>(s, qf, sm, slot, bl, role.rt, lane);
  if (kKvFp8)  // the stored keys stand for k8 x k_descale: each score once, in fp32 (docs/numerics.md §10)
#pragma unroll
    for (int x = 0; x < 8 * NB; ++x) s[x] *= k_descale;
  if (kKvFp4)  // s[8 nb + 4 j + 2 i + c]: key 8 j + 2t + c of block nb
#pragma unroll
    for (int x = 0; x < 8 * NB; ++x) s[x] *= ks[kKvFp4 ? 4 * (x / 8) + 2 * ((x / 4) % 2) + x % 2 : 0];
  if constexpr (RTC_SCORE_MOD != 0)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
      modify_scores(*reinterpret_cast<float(*)[8]>(s + 8 * nb), md, n * kStageKeys + 16 * bl.block(nb));
  if (edge)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
      mask_scores(*reinterpret_cast<float(*)[8]>(s + 8 * nb), rk, (rtc_i64)n * kStageKeys + 16 * bl.block(nb), lane);
  softmax<NB>(s, st, softmax_scale_log2(p));
  accumulate<NB>(s, vs, st, sm, slot, bl, role.ch, lane);
}

// The KV loop over stages [kb0, kb1): warp 0 keeps kStages - 1 stages in flight ahead of the one computed; a stage
// is in when its slot's mbarrier completes its phase (use u of a slot: parity u & 1). rk: this thread's two rows of
// the warp's row tile. Q's cp.async was issued before (load_q) and lands under the first stages' copies.
RTC_DEVICE void kv_loop(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const Smem& sm,
                        const RowKeys (&rk)[2], WarpState& st, int tid) {
  const int lane = tid % 32, warp = tid / 32;
  const Role role = Role::of(warp, p.row_tiles);
  Gather ga;
  ga.boxes = kStageKeys / p.kv_box * kColBlocks;
  if (warp == 0 && w.kb0 < w.kb1) {
    ga.look_up(p, w, seq, w.kb0, lane);
#pragma unroll 1
    for (int x = 0; x < kStages - 1 && w.kb0 + x < w.kb1; ++x)
      ga.issue(p, w, seq, sm, x, w.kb0 + x, w.kb0 + x + 1, w.kb1, lane);
  }
  ScaleGather sg;
  if (kKvScales)
#pragma unroll 1
    for (int x = 0; x < kStages - 1 && w.kb0 + x < w.kb1; ++x) {
      sg.look_up(p, w, seq, w.kb0 + x, tid);
      sg.store(sm, x, tid);
    }
  // An FP8 cache's descales of the item's (sequence, K/V head): K's on the scores, V's on O at the end.
  const float kd = kKvFp8 ? kv_descale(p.k_descale, p.kd_sb, p.kd_sh, w.b, w.hk) : 1.f;
  const float vd = kKvFp8 ? kv_descale(p.v_descale, p.vd_sb, p.vd_sh, w.b, w.hk) : 1.f;
  const RowMods md = RowMods::of(p, w, seq, rk, lane);
  sm90::cp_async_wait_all();  // this thread's Q pieces (the loop's first barrier publishes everyone's)
  rtc_u32 qf[kQInRegs ? kKSteps : 1][4];
  for (int n = w.kb0; n < w.kb1; ++n) {
    const int u = n - w.kb0, slot = u % kStages;
    sm90::mbar_wait(sm.bar(slot), (rtc_u32)(u / kStages) & 1u);
    const bool edge = RTC_MASK || (rtc_i64)(n + 1) * kStageKeys > seq.len_k;
    if (edge) zero_v_tail(sm, slot, n, seq, tid);
    __syncthreads();  // every warp is done with the slot refilled next, the tail is zero (and, first, Q is in)
    const int ahead = n + kStages - 1;
    if (warp == 0 && ahead < w.kb1)
      ga.issue(p, w, seq, sm, (slot + kStages - 1) % kStages, ahead, ahead + 1, w.kb1, lane);
    if (kKvScales && ahead < w.kb1) sg.look_up(p, w, seq, ahead, tid);  // stored below, after the stage's work
    if (kQInRegs && n == w.kb0)
#pragma unroll
      for (int ks = 0; ks < (kQInRegs ? kKSteps : 1); ++ks) q_frag(qf[ks], sm, role.rt, ks, lane);
    // The warp's blocks of the stage: kg, kg + groups, ..., kJoint at a time where it has that many.
    const int blocks = kStageKeys / 16 / role.groups;
    if (kJoint > 1 && blocks >= kJoint) {
#pragma unroll 1
      for (int x = 0; x < blocks; x += kJoint)
        step<kJoint>(p, sm, qf, rk, md, st, role, slot, n, edge, Blocks<kJoint>{role.kg + x * role.groups, role.groups},
                     kd, lane);
    } else {
#pragma unroll 1
      for (int x = 0; x < blocks; ++x)
        step<1>(p, sm, qf, rk, md, st, role, slot, n, edge, Blocks<1>{role.kg + x * role.groups, role.groups}, kd,
                lane);
    }
    // The slot of stage `ahead` was freed by this stage's barrier; the next barrier publishes its scales.
    if (kKvScales && ahead < w.kb1) sg.store(sm, (slot + kStages - 1) % kStages, tid);
  }
  // O (sum p v8) x v_descale, once, before the division by l (the warps' combine and the merge are linear in O).
  if (kKvFp8)
#pragma unroll
    for (int x = 0; x < kAccO; ++x) st.o[x] *= vd;
  __syncthreads();  // the ring is free for the epilogue's combine
}

}  // namespace sm90dec
