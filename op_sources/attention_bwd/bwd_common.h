// What every attention_bwd kernel shares: the element conversions and roundings, a sequence's tensor rows, which
// (row, key) pairs a call sees, the arithmetic of one pair (P and dS), and the delta stage. The kernels differ in how
// they form the products (baseline.hip: SIMT dot products; gfx942.hip: the matrix cores), not in these.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "bwd_params.h"
#include "bf16_round.h"
#include "fp16_round.h"
#include "score_mod.h"
#include "dropout.h"

namespace bwd {

// The element's exact fp32 value, and an fp32 value rounded to the element type (as its bits, or back to fp32):
// bf16 with the variant's mode (RTC_ROUND), fp16 to nearest even.
RTC_DEVICE float elem_f32(rtc_elem_t e) {
  return RTC_DTYPE == RTC_DTYPE_FP16 ? rtc_fp16_to_f32(e) : rtc_bf16_to_f32(e);
}
RTC_DEVICE rtc_elem_t to_elem(float x) {
  return RTC_DTYPE == RTC_DTYPE_FP16 ? rtc_f32_to_fp16_rtne(x) : rtc_f32_to_bf16(x);
}
RTC_DEVICE float round_elem(float x) { return elem_f32(to_elem(x)); }
RTC_DEVICE float neg_inf() { return rtc_bits_f32(0xFF800000u); }
constexpr float kLog2e = 1.44269504088896341f;

RTC_DEVICE float fast_exp2(float x) {
#if defined(RTC_NVIDIA)
  return exp2f(x);
#else
  return __builtin_exp2f(x);
#endif
}

// Tensor rows of sequence b: dense, b's slice (sb) and row `row`; packed, the sequence's first row `first` plus row.
RTC_DEVICE rtc_i64 row_at(rtc_i64 sb, rtc_i64 ss, int b, int first, int row) {
  return RTC_KV == RTC_KV_DENSE ? (rtc_i64)b * sb + (rtc_i64)row * ss : (rtc_i64)(first + row) * ss;
}

// Whether row i0 + i sees key j0 + j: inside the sequence, and inside the row's window (RTC_MASK). By value: the
// sequence's lengths and the window (key_range's inputs), not the parameter block.
struct Pairs {
  Window w;  // the sequence's own lengths (window_of(seq_view(...)))
  int i0, j0;
  RTC_DEVICE bool seen(int i, int j) const {
    const int row = i0 + i, key = j0 + j;
    if (row >= w.seq_q || key >= w.seq_k) return false;
    if (!RTC_MASK) return true;
    const KeyRange kr = key_range(w, row);
    return key >= kr.lo && key <= kr.hi;
  }
};

// One pair's P (for dV) and dS (for dK and dQ), each rounded to the element type (as its bits), from its score
// s = q.k and dP = dO.v (fp32), its row's LSE times log2(e) and delta, exp2 the kernel's (fast_exp2, or the
// hardware's instruction). A row whose LSE is -inf sees no key (P = 0, not exp2(+inf)); a NaN LSE or score makes P
// and dS NaN.
template <class Exp2>
RTC_DEVICE void pair_p_ds_bits(float s, float dp, float lse2, float delta, bool seen, float scale_log2, rtc_elem_t& p,
                               rtc_elem_t& ds, Exp2 exp2) {
  const bool on = seen && lse2 != neg_inf();
  const float e = exp2(s * scale_log2 - lse2);  // every pair's (no branch around the instruction), kept where on
  const float pe = on ? e : 0.0f;
  p = to_elem(pe);
  ds = to_elem(on ? pe * (dp - delta) : 0.0f);
}
// The same for a variant with score modifications (score_mod.h): the pair's modified score t (log2 domain) and, with a
// soft cap, its r: dS is taken through the cap's derivative d(capped)/d(s scale) = 4 r (1 - r) before its rounding.
template <class Exp2>
RTC_DEVICE void pair_p_ds_mod_bits(SoftcapScore t, float dp, float lse2, float delta, bool seen, rtc_elem_t& p,
                                   rtc_elem_t& ds, Exp2 exp2) {
  const bool on = seen && lse2 != neg_inf();
  const float e = exp2(t.t - lse2);
  const float pe = on ? e : 0.0f;
  p = to_elem(pe);
  float g = pe * (dp - delta);
  if (RTC_SOFTCAP) g *= 4.0f * t.r * (1.0f - t.r);
  ds = to_elem(on ? g : 0.0f);
}
// The same with dropout (dropout.h): the forward's O is (P Z) V with Z = keep / (1 - p), so dV takes P Z (the kept p
// times drop_scale, rounded once; 0 when dropped) and dS = P (dP Z - delta) (delta = rowsum(dO O) is unchanged: O is
// the dropped output), times the cap's derivative with a soft cap.
template <class Exp2>
RTC_DEVICE void pair_p_ds_drop_bits(SoftcapScore t, float dp, float lse2, float delta, bool seen, bool keep,
                                    float drop_scale, rtc_elem_t& p, rtc_elem_t& ds, Exp2 exp2) {
  const bool on = seen && lse2 != neg_inf();
  const float e = exp2(t.t - lse2);
  const float pe = on ? e : 0.0f;
  p = to_elem(keep ? pe * drop_scale : 0.0f);
  float g = pe * ((keep ? dp * drop_scale : 0.0f) - delta);
  if (RTC_SOFTCAP) g *= 4.0f * t.r * (1.0f - t.r);
  ds = to_elem(on ? g : 0.0f);
}
// The call's dropout generator state (dropout.h), read once.
RTC_DEVICE DropoutState dropout_state(const AttnParams& a) {
  return RTC_DROPOUT ? DropoutState{(rtc_u64)rtc_gld(a.rng_state), (rtc_u64)rtc_gld(a.rng_state + 1)}
                     : DropoutState{0, 0};
}

// The soft cap's reciprocal on the portable path: IEEE division; exp2 fast_exp2's.
struct IeeeRcp {
  RTC_DEVICE float operator()(float x) const { return 1.0f / x; }
};
struct FastExp2 {
  RTC_DEVICE float operator()(float x) const { return fast_exp2(x); }
};
// A query head's ALiBi slope (log2 domain) for sequence or batch row b; 0 for a variant without ALiBi.
RTC_DEVICE float head_slope_log2(const AttnParams& a, int b, int h) {
  return RTC_ALIBI ? alibi_log2(rtc_gld(a.alibi_slopes + alibi_offset(a, b, h))) : 0.0f;
}

// The same as fp32 values (exact: the elements' own), exp2 fast_exp2's.
RTC_DEVICE void pair_p_ds(float s, float dp, float lse2, float delta, bool seen, float scale_log2, float& p,
                          float& ds) {
  rtc_elem_t pb, db;
  pair_p_ds_bits(s, dp, lse2, delta, seen, scale_log2, pb, db, fast_exp2);
  p = elem_f32(pb);
  ds = elem_f32(db);
}

// delta_i = sum_c dO_ic O_ic - dlse_i (fp32, columns in order): one thread a query row, grid (Sq / threads, H, B).
RTC_DEVICE void delta_stage(const BwdParams& bp, int threads) {
  const AttnParams& a = bp.a;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * threads + threadIdx.x;
  const Seq seq = seq_of(a, b);
  if (i >= seq.len_q) return;
  const rtc_elem_t* o = a.o + row_at(a.o_sb, a.o_ss, b, seq.q_row, i) + (rtc_i64)h * a.o_sh;
  const rtc_elem_t* dout = bp.dout + row_at(bp.do_sb, bp.do_ss, b, seq.q_row, i) + (rtc_i64)h * bp.do_sh;
  float sum = 0.0f;
  for (int c = 0; c < a.head_dim; ++c) sum += elem_f32(rtc_gld(dout + c)) * elem_f32(rtc_gld(o + c));
  const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + i;
  rtc_gst(bp.delta + at, bp.dlse ? sum - rtc_gld(bp.dlse + at) : sum);
}

}  // namespace bwd
