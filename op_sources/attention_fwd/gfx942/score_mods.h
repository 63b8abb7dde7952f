// The gfx942 kernels' score modifications (RTC_SCORE_MOD: the soft cap, ALiBi; score_mod.h) on a lane's scores, with
// the hardware's exp2 and reciprocal (v_exp_f32, v_rcp_f32). The prefill and decode forwards call modify_scores on
// a tile's raw scores (q . k, fp32) just before their softmax, which then takes them with a unit scale and masks
// them as it does a plain variant's (the mask after the modification: a hidden key stays -Inf). Plain variants call
// none of this.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"  // sreg_fence
#include "score_mod.h"

namespace g942 {

struct HwExp2 {
  RTC_DEVICE float operator()(float x) const { return exp2_f32(x); }
};
struct HwRcp {
  RTC_DEVICE float operator()(float x) const { return rcp_f32(x); }
};

// The signed distance key - diag of two positions of one sequence (each in [-2^31, 2^31)): exact in 32 bits, since
// keys lie in [0, Sk + 64) and diagonals in (-Sq, Sk) (unsigned arithmetic: wraps where a lane of no row or key
// computes on anything, defined). ALiBi's |distance| then converts from 32 bits, not 64 (a few VALU ops, not a
// 64-bit conversion sequence per score).
RTC_DEVICE int key_distance(int key, int diag) { return (int)((rtc_u32)key - (rtc_u32)diag); }

// The modified score t (log2 domain) and the soft cap's r of raw score x, key - diag = dist: score_mod.h's
// modded_score on the hardware's instructions.
RTC_DEVICE SoftcapScore hw_modded_score(float x, const AttnParams& p, float slope_log2, int dist) {
  return modded_score(x, p, slope_log2, (rtc_i64)dist, 0, HwExp2{}, HwRcp{});
}

// The scores of one lane's row, kSubs sub-tiles of 4 keys (score i of sub-tile sub is key dist0 + 16 sub + i away
// from the row's diagonal), raw scores (dequantized) modified in place by hw_modded_score. slope_log2: the row's ALiBi
// slope (alibi_log2).
template <int kSubs>
RTC_DEVICE void modify_scores(rtc_f32x4 (&s)[kSubs], const AttnParams& p, float slope_log2, int dist0) {
#pragma unroll
  for (int sub = 0; sub < kSubs; ++sub)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[sub][i] = hw_modded_score(s[sub][i], p, slope_log2, (int)((rtc_u32)dist0 + (rtc_u32)(16 * sub + i))).t;
}

// The scale a tile's softmax takes: a plain variant's c (the softmax scale, with a quantized cache's factors), or 1
// for scores modify_scores has already taken to the log2 domain.
template <class Scale>
RTC_DEVICE auto softmax_scale_of(Scale c) {
#if RTC_SCORE_MOD
  (void)c;
  return 1.0f;
#else
  return c;
#endif
}

// What modded_score reads of the parameter block, as values: a kernel holds them in registers through its loop.
struct ModParams {
  float scale_log2, softcap_exp2, softcap_log2;
};
RTC_DEVICE ModParams mod_params(const AttnParams& p) { return ModParams{p.scale_log2, p.softcap_exp2, p.softcap_log2}; }

// Pins a loop constant of the modifications in an SGPR, or with kVgpr in a VGPR (a kernel with no SGPR to spare and
// VGPRs to spare: the prefill at 64 and 256).
template <bool kVgpr, class T>
RTC_DEVICE void hold(T& x) {
  if (kVgpr)
    reg_fence(x);
  else
    sreg_fence(x);
}
template <bool kVgpr>
RTC_DEVICE void hold(ModParams& m) {
  hold<kVgpr>(m.scale_log2);
  hold<kVgpr>(m.softcap_exp2);
  hold<kVgpr>(m.softcap_log2);
}

// A parameter block holding them (modded_score's argument; the other fields zero, never read, so that nothing but the
// three values is kept). Fenced per call: what the loop derives from them (the cap's -2 softcap log2(e), on the VALU
// for want of scalar float arithmetic) is derived per step instead of being held in VGPRs across it.
template <bool kVgpr = false>
RTC_DEVICE AttnParams step_mod_params(ModParams m) {
  hold<kVgpr>(m);
  AttnParams p = {};
  p.scale_log2 = m.scale_log2;
  p.softcap_exp2 = m.softcap_exp2;
  p.softcap_log2 = m.softcap_log2;
  return p;
}

// A row's ALiBi slope in the log2 domain, 0 without ALiBi: the slope of (sequence or batch row b, query head h), each
// lane its own (a vector load); uniform_slope_log2 for a (b, h) of the workgroup (a scalar load, into an SGPR).
RTC_DEVICE float row_slope_log2(const AttnParams& p, int b, int h) {
  return RTC_ALIBI ? alibi_log2(rtc_gld(p.alibi_slopes + alibi_offset(p, b, h))) : 0.0f;
}
RTC_DEVICE float uniform_slope_log2(const AttnParams& p, int b, int h) {
  return RTC_ALIBI ? alibi_log2(scalar_load(p.alibi_slopes + alibi_offset(p, b, h))) : 0.0f;
}

}  // namespace g942
