// gfx950 (CDNA4) one-instruction wrappers beyond isa_gfx9.h: the scaled f8f6f4 MFMA and the OCP FP8 converts.
// Builtins on gfx950 only; under the emulator (gfx950-emu) the instructions' semantics, from fp8_fp4.h.
//
// v_mfma_scale_f32_16x16x128_f8f6f4 (wave-wide: every lane of the wave calls it from the same site):
//   A and B: 32 elements per lane in 8 dwords, format by cbsz (A) / blgp (B): RTC_LP_E4M3 0, RTC_LP_E5M2 1,
//   RTC_LP_E2M3 2, RTC_LP_E3M2 3, RTC_LP_E2M1 4. Element e sits at bits [w*e, w*e + w) (w = 8, 6, 4; FP4's low
//   nibble first; FP4 reads dwords 0..3 and FP6 0..5 only).
//   Lane l holds k = 32 * (l / 16) + e of row l % 16 of A and of column l % 16 of B, and their E8M0 scales (one per
//   row or column and 32-element k-block): byte op_sel (0..3) of scale_a / scale_b. 127 = 1.0, 0xFF = NaN.
//   D = C + sum over k-blocks of 2^(sa - 127) * 2^(sb - 127) * (the block's dot product); C/D as the 16x16x16 MFMA.
// The OCP FP8 converts (gfx950's v_cvt_*fp8* / *bf8* read and write OCP E4M3 / E5M2, not gfx942's FNUZ formats):
//   cvt_f32_fp8<byte>(src): byte `byte` of src -> f32, exactly.
//   cvt_pk_f32_fp8<hi>(src): bytes 0,1 (hi: 2,3) -> two f32.
//   cvt_pk_fp8_f32<hi>(x, y, old): x -> byte 0, y -> byte 1 of the low half (hi: of the high half) of old, round to
//   nearest even, not saturating (E4M3: NaN past 448; E5M2: Inf past 57344).
// The same with bf8 (E5M2).
// The scaled FP4 converts (v_cvt_scalef32_pk_bf16_fp4 / _f16_fp4):
//   cvt_scalef32_pk_{bf16,f16}_fp4<byte>(src, scale): byte `byte` of src, its low nibble then its high one, as two
//   elements (the low half first) of the code's value times 2^(e - 127), e the exponent field of the f32 scale (the
//   E8M0 code; 0xFF NaN), rounded to nearest even (fp8_fp4.h's rtc_fp4_scaled_f32).
#pragma once
#include "isa_gfx9.h"
#include "fp8_fp4.h"
#include "fp16_round.h"

typedef RTC_VEC(int, 8) rtc_i32x8;  // one lane's A or B operand of the scaled MFMA
typedef RTC_VEC(float, 2) rtc_f32x2;

#define RTC_MFMA_SCALE_CHECKS                                                                             \
  static_assert(cbsz >= 0 && cbsz <= 4 && blgp >= 0 && blgp <= 4, "cbsz / blgp: 0 E4M3, 1 E5M2, 2 E2M3, " \
                                                                  "3 E3M2, 4 E2M1");                      \
  static_assert(opsel_a >= 0 && opsel_a <= 3 && opsel_b >= 0 && opsel_b <= 3, "op_sel picks a scale byte, 0..3")

#if defined(RTC_EMU)
#if RTC_EMU_ARCH != 0x950
#error "isa_gfx950.h needs the gfx950 emulator target (gfx950-emu)"
#endif
#include "emu/isa_host_gfx950.h"

struct rtc_emu_mfma_scale_in {
  rtc_i32x8 a, b;
  rtc_f32x4 c;
  rtc_u32 sa, sb;  // the bytes op_sel picked
};

template <int cbsz, int blgp, int opsel_a, int opsel_b>
RTC_ISA rtc_f32x4 mfma_scale_16x16x128_f8f6f4(rtc_i32x8 a, rtc_i32x8 b, rtc_f32x4 c, rtc_u32 scale_a, rtc_u32 scale_b) {
  RTC_MFMA_SCALE_CHECKS;
  const rtc_emu_mfma_scale_in in = {a, b, c, (scale_a >> (8 * opsel_a)) & 0xFFu, (scale_b >> (8 * opsel_b)) & 0xFFu};
  return ::rtc_emu::wave_op<rtc_emu_mfma_scale_in, rtc_f32x4>(
      "v_mfma_scale_f32_16x16x128_f8f6f4", in, [](const rtc_emu_mfma_scale_in* x, rtc_f32x4* y, int) {
        uint32_t A[64][8], B[64][8];
        float C[64][4], D[64][4];
        uint8_t SA[64], SB[64];
        for (int l = 0; l < 64; ++l) {
          for (int i = 0; i < 8; ++i) {
            A[l][i] = (uint32_t)x[l].a[i];
            B[l][i] = (uint32_t)x[l].b[i];
          }
          for (int i = 0; i < 4; ++i) C[l][i] = x[l].c[i];
          SA[l] = (uint8_t)x[l].sa;
          SB[l] = (uint8_t)x[l].sb;
        }
        ::rtc_emu::isa::mfma_scale_16x16x128(A, B, C, D, cbsz, blgp, SA, SB);
        for (int l = 0; l < 64; ++l)
          for (int i = 0; i < 4; ++i) y[l][i] = D[l][i];
      });
}

template <int byte> RTC_ISA float cvt_f32_fp8(rtc_u32 src) { return rtc_lp_decode(RTC_LP_E4M3, src >> (8 * byte)); }
template <int byte> RTC_ISA float cvt_f32_bf8(rtc_u32 src) { return rtc_lp_decode(RTC_LP_E5M2, src >> (8 * byte)); }
template <bool hi> RTC_ISA rtc_f32x2 rtc_emu_cvt_pk_f32(int fmt, rtc_u32 src) {
  const rtc_u32 h = hi ? src >> 16 : src;
  const rtc_f32x2 r = {rtc_lp_decode(fmt, h), rtc_lp_decode(fmt, h >> 8)};
  return r;
}
template <bool hi> RTC_ISA rtc_f32x2 cvt_pk_f32_fp8(rtc_u32 src) { return rtc_emu_cvt_pk_f32<hi>(RTC_LP_E4M3, src); }
template <bool hi> RTC_ISA rtc_f32x2 cvt_pk_f32_bf8(rtc_u32 src) { return rtc_emu_cvt_pk_f32<hi>(RTC_LP_E5M2, src); }
template <bool hi> RTC_ISA rtc_u32 rtc_emu_cvt_pk_8_f32(int fmt, float x, float y, rtc_u32 old) {
  const rtc_u32 pk = rtc_lp_encode(fmt, x, false) | (rtc_lp_encode(fmt, y, false) << 8);
  return hi ? (old & 0xFFFFu) | (pk << 16) : (old & 0xFFFF0000u) | pk;
}
template <bool hi> RTC_ISA rtc_u32 cvt_pk_fp8_f32(float x, float y, rtc_u32 old) {
  return rtc_emu_cvt_pk_8_f32<hi>(RTC_LP_E4M3, x, y, old);
}
template <bool hi> RTC_ISA rtc_u32 cvt_pk_bf8_f32(float x, float y, rtc_u32 old) {
  return rtc_emu_cvt_pk_8_f32<hi>(RTC_LP_E5M2, x, y, old);
}
template <int byte> RTC_ISA rtc_u32 cvt_scalef32_pk_bf16_fp4(rtc_u32 src, float scale) {
  static_assert(byte >= 0 && byte <= 3, "byte: 0..3");
  const rtc_u32 b = src >> (8 * byte), e = rtc_lp_bits(scale);
  return (rtc_lp_bits(rtc_fp4_scaled_f32(b, e)) >> 16) | (rtc_lp_bits(rtc_fp4_scaled_f32(b >> 4, e)) & 0xFFFF0000u);
}
template <int byte> RTC_ISA rtc_u32 cvt_scalef32_pk_f16_fp4(rtc_u32 src, float scale) {
  static_assert(byte >= 0 && byte <= 3, "byte: 0..3");
  const rtc_u32 b = src >> (8 * byte), e = rtc_lp_bits(scale);
  const auto h = [](float x) {  // a NaN keeps the code's sign
    const rtc_u32 u = rtc_lp_bits(x);
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) & 0x8000u) | RTC_FP16_NAN : (rtc_u32)rtc_f32_to_fp16_rtne(x);
  };
  return h(rtc_fp4_scaled_f32(b, e)) | (h(rtc_fp4_scaled_f32(b >> 4, e)) << 16);
}
#else
#if !defined(__gfx950__)
#error "isa_gfx950.h is for gfx950 kernels only"
#endif
template <int cbsz, int blgp, int opsel_a, int opsel_b>
RTC_ISA rtc_f32x4 mfma_scale_16x16x128_f8f6f4(rtc_i32x8 a, rtc_i32x8 b, rtc_f32x4 c, rtc_u32 scale_a, rtc_u32 scale_b) {
  RTC_MFMA_SCALE_CHECKS;
  return __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, cbsz, blgp, opsel_a, (int)scale_a, opsel_b,
                                                          (int)scale_b);
}
template <int byte> RTC_ISA float cvt_f32_fp8(rtc_u32 src) { return __builtin_amdgcn_cvt_f32_fp8((int)src, byte); }
template <int byte> RTC_ISA float cvt_f32_bf8(rtc_u32 src) { return __builtin_amdgcn_cvt_f32_bf8((int)src, byte); }
template <bool hi> RTC_ISA rtc_f32x2 cvt_pk_f32_fp8(rtc_u32 src) {
  return __builtin_amdgcn_cvt_pk_f32_fp8((int)src, hi);
}
template <bool hi> RTC_ISA rtc_f32x2 cvt_pk_f32_bf8(rtc_u32 src) {
  return __builtin_amdgcn_cvt_pk_f32_bf8((int)src, hi);
}
template <bool hi> RTC_ISA rtc_u32 cvt_pk_fp8_f32(float x, float y, rtc_u32 old) {
  return (rtc_u32)__builtin_amdgcn_cvt_pk_fp8_f32(x, y, (int)old, hi);
}
template <bool hi> RTC_ISA rtc_u32 cvt_pk_bf8_f32(float x, float y, rtc_u32 old) {
  return (rtc_u32)__builtin_amdgcn_cvt_pk_bf8_f32(x, y, (int)old, hi);
}
template <int byte> RTC_ISA rtc_u32 cvt_scalef32_pk_bf16_fp4(rtc_u32 src, float scale) {
  return __builtin_bit_cast(rtc_u32, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, scale, byte));
}
template <int byte> RTC_ISA rtc_u32 cvt_scalef32_pk_f16_fp4(rtc_u32 src, float scale) {
  return __builtin_bit_cast(rtc_u32, __builtin_amdgcn_cvt_scalef32_pk_f16_fp4(src, scale, byte));
}
#endif
#undef RTC_MFMA_SCALE_CHECKS
