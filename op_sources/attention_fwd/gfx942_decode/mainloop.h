// The gfx942 decode kernel's KV loop: Q into registers, each step's K and V rows straight from memory into registers
// (buffer loads through one resource per (sequence, K/V head), or per page), S^T = K Q^T, the softmax, V^T through a
// small LDS tile, O^T += V^T P^T.
//
// Operand layouts (v_mfma_f32_16x16x16, lane = 16 quad + n): A lane holds A[m = n][k = 4 quad .. 4 quad + 3], B lane
// holds B[k = 4 quad .. +3][n], D lane holds D[m = 4 quad + i][n]. S^T = K Q^T contracts over the head dim, whose
// order is free as long as K and Q agree: quad q of a lane owns the columns [q kQuadCols, (q + 1) kQuadCols) of its
// key or row, k-step ds its columns 4 ds .. 4 ds + 3, so each lane loads its whole share of a K row with
// buffer_load_dwordx4 and every byte of the row is read by exactly one lane. O^T = V^T P^T contracts over keys: the
// S^T fragments are P^T's B fragments as they stand, and V^T's A fragments (4 keys of one column per lane) come from
// an LDS tile the lanes write transposed.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "gfx942/tiles.h"
#include "gfx942/sequences.h"
#include "gfx942/score_mods.h"
#include "gfx942_decode/params.h"
#include "gfx942_decode/scheduler.h"
#include "gfx942_decode/mask.h"
#include "gfx942_decode/softmax.h"
#include "gfx942_decode/kv_cache.h"
#if RTC_KV_FP4_NATIVE
#include "isa_gfx950.h"
#endif

namespace gdec {

constexpr int kDSteps = kBucket / 16;   // k-steps of one S^T MFMA chain
constexpr int kVtPitch = DECODE_VT_PITCH;  // V^T tile row pitch in elements (params.h)

// LDS: one 16-key V^T tile, [bucket columns][kVtPitch].
struct Smem {
  rtc_elem_t vt[kBucket * kVtPitch];
};
static_assert(sizeof(Smem) == decode_lds_bytes(kBucket), "params.h's decode_lds_bytes is the kernel's LDS");

// D = A B + C of the element type.
RTC_DEVICE rtc_f32x4 mma(Frag a, Frag b, rtc_f32x4 c) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return mfma_16x16x16_f16(a, b, c);
#else
  return mfma_16x16x16_bf16(a, b, c);
#endif
}

#if RTC_KV_FP4_NATIVE
// The FP4 cache's native path (gfx950, kv_dtype fp4_e2m1_native, an opt-in): S^T = K Q^T by
// v_mfma_scale_f32_16x16x128_f8f6f4, K's FP4 bytes as its A operand (cbsz 4) with their key's E8M0 scale, Q as FP8
// E4M3 (blgp 0) with its row's. A lane holds 32 k of its row there, k = 32 quad + e: this lane's columns quad
// kQuadCols .. + kQuadCols (the same as above), 32 at a time, so kScaledMfmas MFMAs make S^T (bucket 64: one, its
// upper 16 k zeros; 256: two). K's units are the operand as loaded (element 2i in the low nibble of byte i, the
// MFMA's order); Q's FP8 bytes take the same column order.
constexpr int kScaledMfmas = (kLoads + 3) / 4;
struct QOperand {
  rtc_i32x8 b[kScaledMfmas];  // Q's FP8 codes, 32 columns an MFMA
  rtc_u32 scale;              // the row's E8M0 code (op_sel 0)
};

// An element (bf16 / fp16 bits in the low 16 of h) as fp32.
RTC_DEVICE float elem_f32(rtc_u32 h) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return half_f32(h);
#else
  return rtc_bits_f32((h & 0xFFFFu) << 16);
#endif
}

// Q quantized to FP8 E4M3 per (row, head), as kvquant.quantize_q_fp8 (docs/numerics.md §10, the native path): the
// row's amax over its D columns (the 4 lanes of a row: quads, two exchanges) gives the E8M0 code floor(log2 amax) - 8
// + 127 (E4M3's largest exponent 8; clamped to 0 .. 254; 127 for a row of zeros; 0xFF, NaN, for a row holding a NaN
// or an Inf); each element times 2^(127 - code) in fp32 (exact), saturated at +-448 (NaN kept), to E4M3 to nearest
// even. A row of no query and columns past d are zeros.
RTC_DEVICE void load_q(QOperand& q, rtc_buffer_rsrc qr, rtc_u32 row_byte, bool row_ok, int lane, int d) {
  const int col0 = (lane >> 4) * kQuadCols;
  float x[kLoads][8];
  float amax = 0.0f;
  rtc_u32 finite = 1u;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int col = col0 + 8 * u;
    rtc_u32x4 w = {0u, 0u, 0u, 0u};
    if (row_ok && col < d) w = buffer_load_dwordx4(qr, row_byte + (rtc_u32)(col * 2), 0u);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[u][e] = elem_f32((e & 1) ? w[e >> 1] >> 16 : w[e >> 1]);
      const float a = __builtin_fabsf(x[u][e]);
      finite &= (rtc_u32)(a <= 3.4028234664e38f);  // false for NaN and Inf
      amax = __builtin_fmaxf(amax, a);
    }
  }
#pragma unroll
  for (int x_or = 16; x_or <= 32; x_or *= 2) {  // the row's four lanes: lane ^ 16, lane ^ 32
    amax = __builtin_fmaxf(amax, rtc_bits_f32(ds_bpermute((lane ^ x_or) << 2, rtc_f32_bits(amax))));
    finite &= ds_bpermute((lane ^ x_or) << 2, finite);
  }
  const int field = (int)((rtc_f32_bits(amax) >> 23) & 0xFFu) - 8;
  const rtc_u32 code = !finite ? 0xFFu : amax == 0.0f ? 127u : (rtc_u32)(field < 0 ? 0 : field > 254 ? 254 : field);
  q.scale = code;
  // 2^(127 - code): code 254 is 2^-127, an fp32 subnormal
  const float f = code == 0xFFu ? 1.0f : rtc_bits_f32(code == 254u ? 0x00400000u : (254u - code) << 23);
  rtc_u32 dw[4 * kScaledMfmas * 2];
#pragma unroll
  for (int i = 0; i < 4 * kScaledMfmas * 2; ++i) dw[i] = 0u;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float t = x[u][4 * h + e] * f;
        y[e] = t > 448.0f ? 448.0f : t < -448.0f ? -448.0f : t;  // NaN fails both: kept
      }
      dw[2 * u + h] = cvt_pk_fp8_f32<true>(y[2], y[3], cvt_pk_fp8_f32<false>(y[0], y[1], 0u));
    }
  }
#pragma unroll
  for (int j = 0; j < kScaledMfmas; ++j)
    q.b[j] = rtc_i32x8{(int)dw[8 * j],     (int)dw[8 * j + 1], (int)dw[8 * j + 2], (int)dw[8 * j + 3],
                       (int)dw[8 * j + 4], (int)dw[8 * j + 5], (int)dw[8 * j + 6], (int)dw[8 * j + 7]};
}

// S^T of one 16-key sub-tile: K's units (one dword each, 8 FP4 codes) as the A operands, their key's scale.
RTC_DEVICE rtc_f32x4 native_scores(const KvRegs& k, const QOperand& q) {
  rtc_f32x4 s = {0.0f, 0.0f, 0.0f, 0.0f};
  const rtc_u32 ks = k.scale;  // the key's E8M0 code as load_rows loaded it (0, 2^-127, for a key that reads zeros)
#pragma unroll
  for (int j = 0; j < kScaledMfmas; ++j) {
    rtc_u32 a[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) a[t] = 4 * j + t < kLoads ? (rtc_u32)k.u[4 * j + t < kLoads ? 4 * j + t : 0] : 0u;
    const rtc_i32x8 av = {(int)a[0], (int)a[1], (int)a[2], (int)a[3], 0, 0, 0, 0};  // FP4 reads dwords 0..3
    s = mfma_scale_16x16x128_f8f6f4<RTC_LP_E2M1, RTC_LP_E4M3, 0, 0>(av, q.b[j], s, ks, q.scale);
  }
  return s;
}
#else
struct QOperand {
  Frag f[kDSteps];
};

// Q as S^T's B fragments, k-step ds = 2u (+1): this lane's row (rk), columns quad kQuadCols + 8u .. +7 in the order
// K's unit_elems gives its unit (q_unit_order, kv_cache.h). A row of no query and columns past d are zeros.
RTC_DEVICE void load_q(QOperand& q, rtc_buffer_rsrc qr, rtc_u32 row_byte, bool row_ok, int lane, int d) {
  const int col0 = (lane >> 4) * kQuadCols;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int col = col0 + 8 * u;
    rtc_u32x4 w = {0u, 0u, 0u, 0u};
    if (row_ok && col < d) w = q_unit_order(buffer_load_dwordx4(qr, row_byte + (rtc_u32)(col * 2), 0u));
    q.f[2 * u] = g942::as_frag(w[0], w[1]);
    q.f[2 * u + 1] = g942::as_frag(w[2], w[3]);
  }
}
#endif

// O^T += V^T P^T for one 16-key sub-tile: the lanes write their V columns into the LDS tile transposed (column-major
// keys), then read V^T's A fragments, 4 keys of one column per lane. Wave-private LDS: a wave sync orders the
// writes before the reads, and the MFMAs, which every lane reaches after its reads, order them before the next
// sub-tile's writes. Once written, the V registers are free: the V rows of this sub-tile of the step kAhead on
// (j_next, page id_next) are requested into them, to arrive by the time that step comes.
RTC_DEVICE void pv_sub(Smem& sm, KvRegs& v, Frag pf, rtc_f32x4 (&o)[kHdTiles], int lane, const KvRows& vr, int j_next,
                       int id_next, int d) {
  const int key = lane & 15, col0 = (lane >> 4) * kQuadCols;
  rtc_u32x4 x[kLoads];
  rtc_u32 nans = 0u;
  const auto map = v_map(key_scale(v));
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    x[u] = unit_elems(v.u[u], map);
    nans |= unit_nan_codes(v.u[u]);
  }
  if (__builtin_expect(nans != 0u, 0)) {  // rare: the lanes whose V row holds an FP8 NaN code
    rare_block();
#pragma unroll
    for (int u = 0; u < kLoads; ++u) fix_nan_elems(x[u]);
  }
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const rtc_u32 w = x[u][e >> 1];
      ds_write<rtc_elem_t>(&sm.vt[(col0 + 8 * u + kUnitCol[e]) * kVtPitch + key],
                           (rtc_elem_t)((e & 1) ? w >> 16 : w & 0xFFFFu));
    }
  }
  load_rows(vr, j_next, id_next, lane, d, v);
  wave_barrier();
#pragma unroll
  for (int t = 0; t < kHdTiles; ++t) {
    const Frag a = ds_read<Frag>(&sm.vt[(16 * t + (lane & 15)) * kVtPitch + 4 * (lane >> 4)]);
    o[t] = mma(a, pf, o[t]);
  }
}

// A quantized cache's K scale on a sub-tile's scores, in fp32 before the softmax scale (numerics §10): FP8 the
// descale; FP4 each key's E8M0 scale, which lane k % 16 loaded with key k's row (this lane's scores are keys
// 4 quad .. 4 quad + 3). Nothing for a cache in q's dtype.
RTC_DEVICE void key_scales(rtc_f32x4& s, float key_scale, float k_descale, int quad) {
#if RTC_KV_FP8
  (void)key_scale;
  (void)quad;
  s *= k_descale;
#elif RTC_KV_FP4
  (void)k_descale;
  const rtc_u32 bits = rtc_f32_bits(key_scale);
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] *= rtc_bits_f32(ds_bpermute((4 * quad + i) << 2, bits));
#else
  (void)s;
  (void)key_scale;
  (void)k_descale;
  (void)quad;
#endif
}

// FP8 NaN codes in K (this lane's key row holds one: nan_row): a NaN element makes every score of its key NaN, so
// the keys of the sub-tile that hold one (a ballot, uniform, one branch, rarely taken) get NaN scores, the lanes of
// key k's scores being quad k / 4's element k % 4.
RTC_DEVICE void key_nans(rtc_f32x4& s, bool nan_row, int quad) {
  const rtc_u64 rows = ballot(nan_row);
  if (__builtin_expect(rows != 0u, 0)) {
    rare_block();
    const rtc_u32 keys = (rtc_u32)(rows | rows >> 16 | rows >> 32 | rows >> 48);  // bit k % 16: key k's row
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if ((keys >> (4 * quad + i)) & 1u) s[i] = rtc_bits_f32(0x7FC00000u);
  }
}

// One step's K and V registers, kSub sub-tiles each.
struct StepRegs {
  KvRegs k[kSub], v[kSub];
};
constexpr int kAhead = decode_ahead(kBucket, RTC_KV_DTYPE, RTC_GFX);  // steps in flight (params.h)

struct LoopState {
  rtc_f32x4 o[kHdTiles];  // O^T[column 16 t + 4 quad + i][row lane % 16], unnormalised
  float m, l;             // running max (log2 units, scale folded in) and this lane's share of the row's sum
#if RTC_SCORE_MOD
  // The score modifications' constants (gfx942/score_mods.h), this lane's row's ALiBi slope (its q head's, log2
  // domain) and its diagonal key (i + Sk - Sq of its sequence).
  g942::ModParams mods;
  float slope_log2;
  int diag;
#endif
};

// One KV step kb of the item from its registers r: S^T from the K registers, the softmax, then PV sub-tile by
// sub-tile from the V registers. Each register set is refilled as soon as it is consumed (K after the S^T MFMAs, V
// after its LDS write) with the rows of step `refill`, kAhead steps on (its pages pg, read a step earlier), so those
// loads fly during the math of the steps in between. Unconditionally (no branch around the loads): a refill past the
// item's steps names a step of no key, whose loads read zeros and move nothing.
RTC_DEVICE void kv_step(Smem& sm, const KvRows& kr, const KvRows& vr, const QOperand& q, LoopState& st, StepRegs& r,
                        int kb, int refill, const StepPages& pg, int d, float c, float k_descale, int lo, int hi,
                        int lane) {
  const int quad = lane >> 4, xaddr = (lane ^ 32) << 2;
  const int key0 = (int)readfirstlane((rtc_u32)(kb * kStepKeys));
  const int next = (int)readfirstlane((rtc_u32)(refill * kStepKeys));
  rtc_f32x4 sc[kSub];
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
#if RTC_KV_FP4_NATIVE
    sc[s] = native_scores(r.k[s], q);  // the key scales are the MFMA's
    (void)k_descale;
#else
    sc[s] = rtc_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
    rtc_u32 nans = 0u;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const rtc_u32x4 w = unit_elems(r.k[s].u[u], k_map());
      nans |= unit_nan_codes(r.k[s].u[u]);
      sc[s] = mma(g942::as_frag(w[0], w[1]), q.f[2 * u], sc[s]);
      sc[s] = mma(g942::as_frag(w[2], w[3]), q.f[2 * u + 1], sc[s]);
    }
    key_scales(sc[s], key_scale(r.k[s]), k_descale, quad);
    if (RTC_KV_NAN_CODES) key_nans(sc[s], nans != 0u, quad);
#endif
  }
#pragma unroll
  for (int s = 0; s < kSub; ++s) load_rows(kr, next + 16 * s, pg.id[s], lane, d, r.k[s]);
  Frag pf[kSub];
#if RTC_SCORE_MOD
  // The modified scores (of the dequantized ones), before the softmax masks them; from fenced values, so that what
  // they give is derived per step, not held across the loop.
  int diag = st.diag, lane_f = lane;
  reg_fence(diag);
  reg_fence(lane_f);
  g942::modify_scores(sc, g942::step_mod_params(st.mods), st.slope_log2,
                      g942::key_distance(key0 + 4 * (lane_f >> 4), diag));
#endif
  softmax_step(sc, st.o, pf, st.m, st.l, g942::softmax_scale_of(c), quad, key0, lo, hi, xaddr);
#pragma unroll
  for (int s = 0; s < kSub; ++s) pv_sub(sm, r.v[s], pf[s], st.o, lane, vr, next + 16 * s, pg.id[s], d);
}

// Steps [kb0, kb1) of the item, kAhead register sets in a ring: set a holds the steps kb0 + a + n kAhead. The loop
// goes round the ring once an iteration (so that each set is named statically: registers), each step refilling its
// set with the step kAhead on. kAhead 1: one set, each refilled with the next step's rows. The refills' page ids are
// read one step before the refill (pg, carried in SGPRs), so a step never waits for its table reads. The loads have
// no branch around them (params.h decode_no_row), so clang waits for each step's own loads where they are used, not
// for every load in flight: a step waits for loads issued kAhead steps before (the static model replays the loop's
// own waits: decode_model.py).
RTC_DEVICE void kv_loop(Smem& sm, const KvRows& kr, const KvRows& vr, const QOperand& q, LoopState& st, int kb0,
                        int kb1, int d, float c, float k_descale, int lo, int hi, int lane) {
  if (kb0 >= kb1) return;
  const int past = (kr.len + kStepKeys - 1) / kStepKeys;  // a step of no key: its loads read zeros
  // the step whose rows refill step kb's registers
  auto refill_of = [&](int kb) { return (int)readfirstlane((rtc_u32)(kb + kAhead < kb1 ? kb + kAhead : past)); };
  StepRegs ring[kAhead];
#pragma unroll
  for (int a = 0; a < kAhead; ++a) {
    if (a > 0 && kb0 + a >= kb1) break;
    const int first = (int)readfirstlane((rtc_u32)((kb0 + a) * kStepKeys));
    const StepPages pg = step_pages(kr, first);
#pragma unroll
    for (int s = 0; s < kSub; ++s) load_rows(kr, first + 16 * s, pg.id[s], lane, d, ring[a].k[s]);
#pragma unroll
    for (int s = 0; s < kSub; ++s) load_rows(vr, first + 16 * s, pg.id[s], lane, d, ring[a].v[s]);
  }
  StepPages pg = step_pages(kr, refill_of(kb0) * kStepKeys);
  // Once an item, for the loads so far (q's and the ring's): left in flight into the loop, clang would merge them
  // into its wait at the loop's head and wait there for every load, each iteration (vmcnt(0)).
  s_waitcnt_vmcnt<0>();
  for (int kb = kb0; kb < kb1; kb += kAhead) {
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (a > 0 && kb + a >= kb1) break;
      const StepPages pg_next = step_pages(kr, refill_of(kb + a + 1) * kStepKeys);  // the next step's refill
      kv_step(sm, kr, vr, q, st, ring[a], kb + a, refill_of(kb + a), pg, d, c, k_descale, lo, hi, lane);
      pg = pg_next;
    }
  }
}

}  // namespace gdec
