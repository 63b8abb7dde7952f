// The score modifications (score_mod.h: the soft cap, ALiBi) as the sm_90a kernels apply them to a fragment's raw
// scores: the prefill (attention_fwd/sm90/mask.h), the decode (attention_fwd/sm90_decode/mask.h) and the backward
// (attention_bwd/sm90/pairs.h). The values are score_mod.h's; the instructions are chosen for the SFU, which the plain
// softmax's exp2 already keeps about half as busy as the tensor cores (one exp2 a score, 16 a clock an SM):
//
// - The soft cap. score_mod.h's form, r = 1 / (e^(2x) + 1) by exp2 and a reciprocal, takes two more SFU instructions a
//   score: three in all, past the tensor cores' time. Here the exponential is of -2|x| (e in (0, 1]), so that the
//   reciprocal is of (1 + e) / 2 in (1/2, 1], which six FMAs on the FP32 pipe give (a linear seed, a cubic and a
//   quadratic Newton step: within 2^-21.9 of 2 / (1 + e)); t = sign(x) C (2 / (1 + e) - 1), C = softcap log2(e), is
//   within C 2^-21.9 of the exact (the exp2's own error aside), not tanh.approx's C 2^-11. kSoftcapSfuOf4 of every 4 scores take the
//   SFU's reciprocal instead (rcp.approx, 1 ulp): one SFU instruction more and five FP32 ones fewer, which balances the
//   two pipes (the issue slots the FMAs take are the other limit).
// - ALiBi. A fragment element's distance key - diag is a base (per row and block) plus a compile-time offset (the
//   fragment's layout): a float add of an immediate, exact below 2^24, and one FMA taking |distance| as its operand;
//   no integer-to-float conversion a score (an SFU-rate instruction too). Without a soft cap the term is folded into
//   the raw score, s' = s - (slope / scale) |distance|, so that the softmax keeps its scale (t = s' scale log2(e)) and
//   its FMA: one FMA a score, not two (kernels whose scale may be 0 take t instead: score_mod_t).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "score_mod.h"
#include "ptx_sm90.h"

namespace sm90 {

// The constants here are enumerators and macros, not constexpr variables: NVRTC keeps those as named globals in the
// code object, which would change a plain variant's bytes (sm90/pipeline.h).
// Of every 4 scores (fragment index % 4), how many take the SFU's reciprocal in the soft cap (0: none, 4: all).
enum : int { kSoftcapSfuOf4 = 1 };
#define RTC_LN2_F 0.693147180559945309f

// Whether a variant's softmax takes t itself (log2 domain: its scale 1, the LSE's factor ln 2) rather than the raw
// score (plain) or s' (ALiBi alone, above): with a soft cap; with ALiBi alone where the softmax's scale may be 0 (the
// prefill folds an FP8 cache's k_descale into it: s' would divide by it).
RTC_HD constexpr bool score_mod_t(bool scale_may_be_zero) { return RTC_SOFTCAP || (RTC_ALIBI && scale_may_be_zero); }

// 1 / h for h in [1/2, 1] on the FP32 pipe: the minimax line (relative error within 1/17), a cubic Newton step (e + e^2:
// (1/17)^3), a quadratic one; within 2^-21.9 of it in fp32. A NaN h gives NaN.
RTC_DEVICE float rcp_half_1(float h) {
  float r = fmaf(h, -32.0f / 17.0f, 48.0f / 17.0f);
  float e = fmaf(-h, r, 1.0f);
  r = fmaf(r, fmaf(e, e, e), r);
  e = fmaf(-h, r, 1.0f);
  return fmaf(r, e, r);
}

// A capped score: t (log2 domain) and d tanh / dx, the backward's factor of dS.
struct CapScore {
  float t, dt;
};

// The soft cap of raw scores: k = softcap_exp2 (the prefill's FP8 tiles: times |k_descale|), c = softcap_log2. Read
// from the kernel's parameter block where it can be: its values are then operands of the instructions, not registers.
struct Softcap {
  float k, c;
  RTC_DEVICE static Softcap of(const AttnParams& a) { return Softcap{a.softcap_exp2, a.softcap_log2}; }
  // sfu: the reciprocal on the SFU (a compile-time choice once unrolled). With e = e^(-2x), h = (1 + e) / 2 and
  // R = 1 / h: tanh x = R - 1, and d tanh / dx = 1 - tanh^2 = R (2 - R), within 2^-20.9 absolute (like score_mod.h's
  // 4 r (1 - r) where r nears 1; e R^2 would keep e's register live through the reciprocal, which the backward has
  // not). The SFU's reciprocal takes e of the signed score, R in [0, 2] (rcp(inf) = 0): s dies at the first FMA. The
  // FP32 pipe's, of h in [1/2, 1] only, takes e of -|x| and the sign back (copysign). e / 2 is the exp2 of one less
  // (an FMA, not an FMUL: no register for a 0.5 beside the FMA's immediate). s = +-inf caps to +-C, NaN stays NaN;
  // k = 0 (a zero descale) gives 0.
  RTC_DEVICE CapScore operator()(float s, bool sfu) const {
    if (sfu) {
      const float r2 = r_sfu(s);
      return CapScore{t_of(r2), dt_of(r2)};
    }
    const float r2 = rcp_half_1(ex2(fmaf(-fabsf(s), k, -1.0f)) + 0.5f);
    return CapScore{copysignf(t_of(r2), s), dt_of(r2)};
  }
  // The steps of the SFU's form, for code that keeps R in the score's register between them (the backward):
  // R = 2 / (1 + e^(-2x)) in [0, 2], then t = C (R - 1) and d tanh / dx = R (2 - R).
  RTC_DEVICE float r_sfu(float s) const { return rcp_approx(ex2(fmaf(s, -k, -1.0f)) + 0.5f); }
  RTC_DEVICE float t_of(float r2) const { return fmaf(c, r2, -c); }
  RTC_DEVICE static float dt_of(float r2) { return r2 * (2.0f - r2); }
};

// A query head's ALiBi slope (score_mod.h's alibi_offset), once per row or tile.
RTC_DEVICE float alibi_slope(const AttnParams& a, int b, int h) {
  return __ldg(a.alibi_slopes + alibi_offset(a, b, h));
}
// The factor of |distance| in what the softmax takes: -slope log2(e) added to t (kT), or -slope / scale added to s' (by
// the SFU's reciprocal, within 2^-22: IEEE division's slow path is a call, which would serialize the wgmma pipeline
// where it lands between GEMMs).
RTC_DEVICE float alibi_factor(float slope, float scale, bool kT) {
  return kT ? -alibi_log2(slope) : -slope * rcp_approx(scale);
}

// What the softmax takes for raw score s (dequantized) at fragment index e (kSfuOf4: the soft cap's share of SFU
// reciprocals, by e % 4): kT, t = the capped s (a soft cap) or s sc
// (sc: the scale log2(e)), then + alibi_k |dist| (ALiBi); else s' = s + alibi_k |dist| (ALiBi alone). dist = key -
// diag, an integer as a float (exact below 2^24). dt: the soft cap's d tanh / dx (1 without one).
template <bool kT, int kSfuOf4 = kSoftcapSfuOf4>
RTC_DEVICE float modded(float s, int e, const Softcap& cap, float sc, float alibi_k, float dist, float& dt) {
  float t = s;
  dt = 1.0f;
  if constexpr (RTC_SOFTCAP) {
    const CapScore o = cap(s, e % 4 < kSfuOf4);
    t = o.t;
    dt = o.dt;
  } else if constexpr (kT) {
    t = s * sc;
  }
  if constexpr (RTC_ALIBI) t = fmaf(fabsf(dist), alibi_k, t);
  return t;
}

}  // namespace sm90
