// Score modifications of the attention kernels, the manifest's score_mod axis (RTC_SCORE_MOD): FlashAttention's soft
// cap and ALiBi, applied to the scaled score in the log2 domain every kernel's softmax works in (docs/numerics.md,
// "Soft cap and ALiBi"). One definition for every kernel, forward and backward; each kernel passes its own exp2 and
// reciprocal instructions.
//
//   plain:    t = s * scale * log2(e)                                  (s = q . k in fp32)
//   softcap:  t = softcap * tanh(s * scale / softcap) * log2(e)
//   ALiBi:    t += -slope * |j - (i + Sk - Sq)| * log2(e)               (row i, key j of the sequence; after the cap)
//
// A key the mask hides is -inf whatever t would be: the kernels apply their masks after these.
#pragma once
#include "attn_params.h"

#ifndef RTC_SCORE_MOD
#define RTC_SCORE_MOD 0  // the manifest's score_mod axis: a bit for each modification below (0: plain)
#endif
#define RTC_SCORE_SOFTCAP 1
#define RTC_SCORE_ALIBI 2
#define RTC_SOFTCAP ((RTC_SCORE_MOD & RTC_SCORE_SOFTCAP) != 0)
#define RTC_ALIBI ((RTC_SCORE_MOD & RTC_SCORE_ALIBI) != 0)

#define RTC_LOG2E_F 1.4426950408889634f
#if defined(RTC_NVIDIA)
#define RTC_FMAF(a, b, c) __fmaf_rn(a, b, c)
#else
#define RTC_FMAF(a, b, c) __builtin_fmaf(a, b, c)
#endif

// The soft cap of a raw score s, in the log2 domain: t = softcap log2(e) tanh(x), x = s scale / softcap, with
// tanh(x) = 1 - 2 r, r = 1 / (e^(2x) + 1) (the kernel's exp2 and reciprocal: exp2(+inf) = inf and rcp(inf) = 0, so a
// score of +-inf caps to +-softcap, NaN stays NaN). r is what the backward's derivative needs:
// d tanh / dx = 1 - tanh^2 = 4 r (1 - r).
struct SoftcapScore {
  float t, r;
};
template <class Exp2, class Rcp>
RTC_HD SoftcapScore softcap_score(float s, const AttnParams& p, Exp2 exp2, Rcp rcp) {
  const float r = rcp(exp2(s * p.softcap_exp2) + 1.0f);
  return SoftcapScore{RTC_FMAF(-2.0f * p.softcap_log2, r, p.softcap_log2), r};
}

// The slope of (sequence or batch b, query head h) is read at this offset of p.alibi_slopes; the kernels take it to
// the log2 domain with alibi_log2.
RTC_HD rtc_i64 alibi_offset(const AttnParams& p, int b, int h) {
  return (rtc_i64)b * p.alibi_sb + (rtc_i64)h * p.alibi_sh;
}
RTC_HD float alibi_log2(float slope) { return slope * RTC_LOG2E_F; }

// ALiBi's term added to t: -slope log2(e) |key - diag|, diag = the row's position among the keys (i + Sk - Sq of
// its sequence). The distance is exact in fp32 up to 2^24 keys.
RTC_HD float alibi_add(float t, float slope_log2, rtc_i64 key, rtc_i64 diag) {
  const rtc_i64 dist = key > diag ? key - diag : diag - key;
  return RTC_FMAF(-slope_log2, (float)dist, t);
}

// The modified score t of raw score s (every modification of the variant; plain: s scale log2(e)), and with a soft
// cap its r (SoftcapScore; 0 without one).
template <class Exp2, class Rcp>
RTC_HD SoftcapScore modded_score(float s, const AttnParams& p, float slope_log2, rtc_i64 key, rtc_i64 diag, Exp2 exp2,
                                 Rcp rcp) {
  SoftcapScore out = {s * p.scale_log2, 0.0f};
  if (RTC_SOFTCAP) out = softcap_score(s, p, exp2, rcp);
  if (RTC_ALIBI) out.t = alibi_add(out.t, slope_log2, key, diag);
  return out;
}
