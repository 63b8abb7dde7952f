// FP8 E4M3 and FP4 E2M1 cache bytes expanded exactly into pairs of 16-bit elements (RTC_DTYPE: bf16 or fp16) on
// sm_90a, a few integer operations and one packed FMA or conversion a pair: the sm90 decode kernel's fragments
// (sm90_decode/kv_frag.h) and the sm90 prefill kernel's expansion stage (sm90/expand.h) take them from here.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "ptx_sm90.h"

namespace sm90kv {

constexpr bool kElemFp16 = RTC_DTYPE == RTC_DTYPE_FP16;

// ---- FP8 E4M3 bytes to two pairs of elements, exactly ----
// PRMT selectors: bytes i and j of a word as two sign-extended 16-bit values (a selector nibble with bit 3 set
// replicates the selected byte's sign bit), and as two 16-bit masks of byte i's and j's bit 7.
RTC_HD constexpr rtc_u32 sel_sext(int i, int j) {
  return rtc_u32(i) | rtc_u32(i | 8) << 4 | rtc_u32(j) << 8 | rtc_u32(j | 8) << 12;
}
RTC_HD constexpr rtc_u32 sel_mask(int i, int j) {
  return rtc_u32(i | 8) | rtc_u32(i | 8) << 4 | rtc_u32(j | 8) << 8 | rtc_u32(j | 8) << 12;
}

// Bytes (i, j) of w as an element pair, byte i in the low half. fp16: cvt.rn.f16x2.e4m3x2, exact for every code
// (E4M3's subnormals are fp16 normals; NaN stays NaN). bf16: no instruction converts in one step (through f32: two
// conversions a value), so the bits are placed: sign to bit 15 and the 7 magnitude bits (exponent, mantissa) to bits
// 4 .. 10 is the value times 2^-120, subnormals included (a bf16 subnormal's scale, 2^-126 x 2^-7 x 16, is E4M3's
// 2^-9 x 2^-120); one fma.rn.bf16x2 by 2^120 (bf16 0x7B80; the addend -0 keeps -0) gives the value exactly, as the
// bf16 FMA takes and gives subnormals (PTX: no .ftz for bf16) and the result is a bf16 normal or zero. The 2^-120
// values never reach the MMA. A NaN code (magnitude 0x7F) comes out as +-480: fixed by the caller.
template <int I, int J>
RTC_DEVICE rtc_u32 fp8_pair(rtc_u32 w) {
  if (kElemFp16) {
    const rtc_u32 x = (I == 0 && J == 1) ? w : (I == 2 && J == 3) ? (w >> 16) : sm90::prmt(w, 0u, rtc_u32(I | J << 4));
    return sm90::cvt_f16x2_e4m3x2(x);
  }
  const rtc_u32 x = sm90::prmt(w, 0u, sel_sext(I, J));  // each byte sign-extended to 16 bits
  return sm90::fma_bf16x2((x << 4) & 0x87F087F0u, 0x7B807B80u, 0x80008000u);
}

// The four bytes of w as pairs p0 = bytes (I0, J0), p1 = bytes (I1, J1). bf16: a byte with magnitude 0x7F (E4M3's
// NaN) is the only one with bit 7 set in (w & 0x7F7F7F7F) + 0x01010101 (no other magnitude carries into it, none
// carries across bytes); PRMT spreads that bit over the element's 16 bits, and the element ORed with 0x7FFF there is
// a NaN. Branch-free: a branch around the rare fix-up made ptxas spill (D 64 and 96).
template <int I0, int J0, int I1, int J1>
RTC_DEVICE void fp8x4_elems(rtc_u32 w, rtc_u32& p0, rtc_u32& p1) {
  p0 = fp8_pair<I0, J0>(w);
  p1 = fp8_pair<I1, J1>(w);
  if (!kElemFp16) {
    const rtc_u32 nan = (w & 0x7F7F7F7Fu) + 0x01010101u;
    p0 |= sm90::prmt(nan, 0u, sel_mask(I0, J0)) & 0x7FFF7FFFu;
    p1 |= sm90::prmt(nan, 0u, sel_mask(I1, J1)) & 0x7FFF7FFFu;
  }
}

// ---- FP4 E2M1 nibbles to element pairs, exactly ----
// The eight codes of w as byte-sized values code << 4 (sign in bit 7): the even elements' (low nibbles) in e, the odd
// ones' in o; fp4_pair<A, B> takes bytes A and B of {o, e} (e: 0-3, o: 4-7), sign-extended to 16 bits by PRMT.
// bf16: (x << 2) & 0x81C0 puts the sign at bit 15 and the magnitude (exponent, mantissa) at bits 6 .. 8, the value
// times 2^-126 (0.5, the only subnormal code, becomes bf16's 2^-127); fp16: (x << 5) & 0x8E00, bits 9 .. 11, times
// 2^-14. One FMA by 2^126 (bf16 0x7E80) or 2^14 (fp16 0x7400), + -0, gives the value exactly (both FMAs keep
// subnormal inputs). E2M1 has no NaN.
// kF16: the pair's type (the variant's element by default; the prefill's expansion takes bf16 pairs to fp32).
template <int A, int B, bool kF16 = kElemFp16>
RTC_DEVICE rtc_u32 fp4_pair(rtc_u32 e, rtc_u32 o) {
  const rtc_u32 x = sm90::prmt(e, o, sel_sext(A, B));
  if (kF16) return sm90::fma_f16x2((x << 5) & 0x8E008E00u, 0x74007400u, 0x80008000u);
  return sm90::fma_bf16x2((x << 2) & 0x81C081C0u, 0x7E807E80u, 0x80008000u);
}
// The eight codes of w as four pairs: p[x] = bytes (A_x, B_x) of {o, e}.
template <int A0, int B0, int A1, int B1, int A2, int B2, int A3, int B3, bool kF16 = kElemFp16>
RTC_DEVICE void fp4x8_elems(rtc_u32 w, rtc_u32 (&p)[4]) {
  const rtc_u32 e = (w << 4) & 0xF0F0F0F0u, o = w & 0xF0F0F0F0u;
  p[0] = fp4_pair<A0, B0, kF16>(e, o);
  p[1] = fp4_pair<A1, B1, kF16>(e, o);
  p[2] = fp4_pair<A2, B2, kF16>(e, o);
  p[3] = fp4_pair<A3, B3, kF16>(e, o);
}

}  // namespace sm90kv
