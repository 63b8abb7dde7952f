// The sm_90a decode kernel's main loop: per stage of 64 keys (four 16-key blocks), warp w takes row tile
// w / (4 / row_tiles) and the blocks kg, kg + 4 / row_tiles, ... (kg = w % (4 / row_tiles)): one block per warp with one
// row tile, all four with four. Per block it runs S = Q K^T (mma.sync m16n8k16, the tile's 16 packed rows as M), the
// mask, the online softmax, and O += P V with P straight from the score registers; the cp.async ring stays
// kStages - 1 stages ahead. Each warp keeps its own row max, row sum and O over its keys; the epilogue combines the
// warps of a row tile.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"
#include "sm90/softmax.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90_decode/mask.h"
#include "sm90_decode/loads.h"

namespace sm90dec {

constexpr bool kFp16 = RTC_DTYPE == RTC_DTYPE_FP16;
constexpr int kKSteps = kBucket / 16;  // k-steps of Q K^T, and 16-column pairs of n-tiles of P V
constexpr int kAccO = kBucket / 2;  // O accumulators per thread: kBucket / 8 n-tiles of 4
// Up to the 128 bucket the Q fragments stay in registers (kBucket / 4 of them); above, they are read from shared
// memory at every k-step (O's kBucket / 2 accumulators leave no room for them).
constexpr bool kQInRegs = kBucket <= 128;

// A warp's running state for its two rows per thread (rows lane / 4 and lane / 4 + 8 of the item): raw-score max m,
// this thread's share of the row sum l (the quad's four shares are added at the end), and O over the warp's keys.
// The layout of s and o, index 4 j + 2 i + c: n-tile j, row lane / 4 + 8 i, column 8 j + 2 (lane % 4) + c.
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

// Q's A fragment of k-step ks for row tile rt: rows 16 rt + (lane & 7) + 8 ((lane >> 3) & 1), columns 16 ks +
// 8 (lane >> 4).
RTC_DEVICE void q_frag(rtc_u32 (&a)[4], const Smem& sm, int rt, int ks, int lane) {
  const int row = 16 * rt + (lane & 7) + ((lane >> 3) & 1) * 8, col = 16 * ks + (lane >> 4) * 8;
  sm90::ldmatrix_x4(a, sm.q() + row * kRowBytes + 2 * col);
}

// S = Q K^T over 16-key block `block` of the stage in `slot`: n-tile 0 is keys 0-7, n-tile 1 keys 8-15; the K B
// fragments of a k-step come from one ldmatrix (keys (lane & 7) + 8 (lane >> 4), columns 8 ((lane >> 3) & 1)).
RTC_DEVICE void scores(float (&s)[8], const rtc_u32 (&qf)[kQInRegs ? kKSteps : 1][4], const Smem& sm, int slot,
                       int block, int rt, int lane) {
#pragma unroll
  for (int x = 0; x < 8; ++x) s[x] = 0.f;
  const rtc_u32 k_rows = sm.k(slot) + (16 * block + (lane & 7) + ((lane >> 4) << 3)) * kRowBytes;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    rtc_u32 a[4], b[4];
    if (kQInRegs) {
#pragma unroll
      for (int x = 0; x < 4; ++x) a[x] = qf[kQInRegs ? ks : 0][x];
    } else {
      q_frag(a, sm, rt, ks, lane);
    }
    sm90::ldmatrix_x4(b, k_rows + 2 * (16 * ks + ((lane >> 3) & 1) * 8));
    float* s0 = s;
    float* s1 = s + 4;
    sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(s0), a, b[0], b[1]);
    sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(s1), a, b[2], b[3]);
  }
}

// The online softmax of one stage's scores, in the prefill kernel's conventions (sm90/softmax.h): the row max
// scaled rounding down, p = 2^(s c - m c) with one FFMA, a row max of -inf taken as 0; O and l rescaled.
RTC_DEVICE void softmax(float (&s)[8], WarpState& st, float c) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = fmaxf(fmaxf(s[2 * i], s[2 * i + 1]), fmaxf(s[4 + 2 * i], s[4 + 2 * i + 1]));
    mx = fmaxf(mx, st.m[i]);
    mx = fmaxf(mx, sm90::shfl_xor(mx, 1));
    mx = fmaxf(mx, sm90::shfl_xor(mx, 2));
    const float ms = mx == sm90::neg_inf() ? 0.f : sm90::scale_max(mx, c);
    const float rescale = sm90::ex2(sm90::scale_max(st.m[i], c) - ms);
    st.m[i] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float p = sm90::ex2(sm90::scaled_diff(s[4 * j + 2 * i + k], c, ms));
        s[4 * j + 2 * i + k] = p;
        sum += p;
      }
    st.l[i] = st.l[i] * rescale + sum;
#pragma unroll
    for (int j = 0; j < kAccO / 4; ++j) {
      st.o[4 * j + 2 * i] *= rescale;
      st.o[4 * j + 2 * i + 1] *= rescale;
    }
  }
}

// O += P V over 16-key block `block`: P's A fragment is the scores' registers packed in pairs (the raw form: a NaN p
// keeps its row sum NaN, sm90/softmax.h); V's B fragments through ldmatrix.trans, two n-tiles per call (keys
// (lane & 7) + 8 ((lane >> 3) & 1), columns 16 dp + 8 (lane >> 4)).
RTC_DEVICE void accumulate(const float (&s)[8], WarpState& st, const Smem& sm, int slot, int block, int lane) {
  const rtc_u32 a[4] = {sm90::pack2_raw(s[0], s[1]), sm90::pack2_raw(s[2], s[3]), sm90::pack2_raw(s[4], s[5]),
                        sm90::pack2_raw(s[6], s[7])};
  const rtc_u32 v_rows = sm.v(slot) + (16 * block + (lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes;
#pragma unroll
  for (int dp = 0; dp < kKSteps; ++dp) {
    rtc_u32 b[4];
    sm90::ldmatrix_x4_trans(b, v_rows + 2 * (16 * dp + (lane >> 4) * 8));
    sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(st.o + 8 * dp), a, b[0], b[1]);
    sm90::mma_16816<kFp16>(*reinterpret_cast<float(*)[4]>(st.o + 8 * dp + 4), a, b[2], b[3]);
  }
}

// The KV loop over stages [kb0, kb1): kStages - 1 stages in flight ahead of the one computed. Q came with the first
// stage's cp.async group (load_q before the prologue). rk: this thread's two rows of the warp's row tile.
RTC_DEVICE void kv_loop(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const Smem& sm,
                        const RowKeys (&rk)[2], WarpState& st, int tid) {
  const int lane = tid % 32, warp = tid / 32;
  const int groups = SM90_DECODE_WARPS / p.row_tiles, rt = warp / groups, kg = warp - rt * groups;
  const KvRows kt = {seq.k_off, p.k_sb, p.k_ss, p.k_sh}, vt = {seq.v_off, p.v_sb, p.v_ss, p.v_sh};
  const int page_shift = RTC_KV == RTC_KV_PAGED ? __ffs(p.page_size) - 1 : 0;
#pragma unroll
  for (int x = 0; x < kStages - 1; ++x) {
    if (w.kb0 + x < w.kb1) load_stage(p, w, seq, sm, kt, vt, page_shift, x, w.kb0 + x, tid);
    sm90::cp_async_commit();
  }
  rtc_u32 qf[kQInRegs ? kKSteps : 1][4];
  for (int n = w.kb0; n < w.kb1; ++n) {
    const int slot = (n - w.kb0) % kStages;
    sm90::cp_async_wait_group<kStages - 2>();
    __syncthreads();  // stage n is in for every thread, and every warp is done with the slot refilled next
    if (n + kStages - 1 < w.kb1)
      load_stage(p, w, seq, sm, kt, vt, page_shift, (slot + kStages - 1) % kStages, n + kStages - 1, tid);
    sm90::cp_async_commit();
    if (kQInRegs && n == w.kb0)
#pragma unroll
      for (int ks = 0; ks < (kQInRegs ? kKSteps : 1); ++ks) q_frag(qf[ks], sm, rt, ks, lane);
    const bool edge = RTC_MASK || (rtc_i64)(n + 1) * SM90_DECODE_STAGE_KEYS > seq.len_k;
#pragma unroll 1
    for (int block = kg; block < SM90_DECODE_WARPS; block += groups) {
      float s[8];
      scores(s, qf, sm, slot, block, rt, lane);
      if (edge) mask_scores(s, rk, (rtc_i64)n * SM90_DECODE_STAGE_KEYS + 16 * block, lane);
      softmax(s, st, p.scale_log2);
      accumulate(s, st, sm, slot, block, lane);
    }
  }
  sm90::cp_async_wait_all();
  __syncthreads();  // the ring is free for the epilogue's combine
}

}  // namespace sm90dec
