// Runs one gfx950 instruction wrapper (isa_gfx950.h) or format helper (fp8_fp4.h) on one wave, so a test can
// compare every lane's result with the Python reference.
#include "platform.h"
#include "isa_gfx950.h"

// in: 1024 words (kMfmaScale: 1408: A (512 words, lane-major), B (512), C (256), scale_a (64), scale_b (64));
// out: 1024 words. Lane l handles words l, l + 64, ...; kMfmaScale writes D lane-major.
struct Probe950Params {
  const rtc_u32* in;
  rtc_u32* out;
  int op;
  int arg;
};

enum {
  kDecode,      // arg: format
  kEncode,      // arg: format | saturate << 8
  kE8m0,        // out[j]: E8M0 decode of in[j]; out[256 + j]: E8M0 encode of in[256 + j] read as f32
  kFp4Lut,  // words 0..255: E2M1 code -> E4M3 | bf16 << 16; 256..511: packed x4 -> E4M3x4; 512..767: x2 -> bf16x2
  kCvtF32,  // arg: bf8 | byte << 1: v_cvt_f32_fp8 / bf8 of in[j]
  kCvtPkF32,  // arg: bf8 | hi << 1: v_cvt_pk_f32_fp8 / bf8 of in[j] -> out[j], out[j + 512]
  kCvtPk8F32,  // arg: bf8 | hi << 1: v_cvt_pk_fp8 / bf8_f32 (in[j], in[j + 256], old = in[j + 512])
  kMfmaScale,  // arg: 5 * cbsz + blgp (op_sel 0, 0) for 0..24; 25 + 4 * opsel_a + opsel_b with cbsz 0, blgp 4
  kCvtScaleFp4  // arg: byte | f16 << 2: v_cvt_scalef32_pk_bf16_fp4 / _f16_fp4 of (in[j], scale in[256 + j] as f32)
};

RTC_DEVICE float as_f32(rtc_u32 u) { return rtc_lp_f32(u); }
RTC_DEVICE rtc_u32 as_u32(float f) { return rtc_lp_bits(f); }

template <int byte> RTC_DEVICE float probe_cvt_f32(bool bf8, rtc_u32 x) {
  return bf8 ? cvt_f32_bf8<byte>(x) : cvt_f32_fp8<byte>(x);
}
template <bool hi> RTC_DEVICE rtc_f32x2 probe_cvt_pk_f32(bool bf8, rtc_u32 x) {
  return bf8 ? cvt_pk_f32_bf8<hi>(x) : cvt_pk_f32_fp8<hi>(x);
}
template <bool hi> RTC_DEVICE rtc_u32 probe_cvt_pk8(bool bf8, float x, float y, rtc_u32 old) {
  return bf8 ? cvt_pk_bf8_f32<hi>(x, y, old) : cvt_pk_fp8_f32<hi>(x, y, old);
}

template <int byte> RTC_DEVICE rtc_u32 probe_cvt_scale_fp4(bool f16, rtc_u32 x, float scale) {
  return f16 ? cvt_scalef32_pk_f16_fp4<byte>(x, scale) : cvt_scalef32_pk_bf16_fp4<byte>(x, scale);
}

RTC_DEVICE void probe_elementwise(const Probe950Params& p, int l) {
  const bool bf8 = (p.arg & 1) != 0, hi = (p.arg & 2) != 0;
  for (int j = l; j < 256; j += 64) {
    const rtc_u32 x = rtc_gld(p.in + j);
    switch (p.op) {
      case kDecode: rtc_gst(p.out + j, as_u32(rtc_lp_decode(p.arg, x))); break;
      case kE8m0:
        rtc_gst(p.out + j, as_u32(rtc_e8m0_decode(x)));
        rtc_gst(p.out + 256 + j, rtc_e8m0_encode(as_f32(rtc_gld(p.in + 256 + j))));
        break;
      case kFp4Lut:
        rtc_gst(p.out + j, rtc_fp4_to_e4m3(x) | (rtc_fp4_to_bf16(x) << 16));
        rtc_gst(p.out + 256 + j, rtc_fp4x4_to_e4m3x4(rtc_gld(p.in + 256 + j)));
        rtc_gst(p.out + 512 + j, rtc_fp4x2_to_bf16x2(rtc_gld(p.in + 512 + j)));
        break;
      case kCvtF32: {
        const int byte = (p.arg >> 1) & 3;
        const float f = byte == 0   ? probe_cvt_f32<0>(bf8, x)
                        : byte == 1 ? probe_cvt_f32<1>(bf8, x)
                        : byte == 2 ? probe_cvt_f32<2>(bf8, x)
                                    : probe_cvt_f32<3>(bf8, x);
        rtc_gst(p.out + j, as_u32(f));
        break;
      }
      case kCvtPkF32: {
        const rtc_f32x2 v = hi ? probe_cvt_pk_f32<true>(bf8, x) : probe_cvt_pk_f32<false>(bf8, x);
        rtc_gst(p.out + j, as_u32(v[0]));
        rtc_gst(p.out + 512 + j, as_u32(v[1]));
        break;
      }
      case kCvtScaleFp4: {
        const bool f16 = (p.arg >> 2) != 0;
        const float s = as_f32(rtc_gld(p.in + 256 + j));
        const int byte = p.arg & 3;
        rtc_gst(p.out + j, byte == 0   ? probe_cvt_scale_fp4<0>(f16, x, s)
                           : byte == 1 ? probe_cvt_scale_fp4<1>(f16, x, s)
                           : byte == 2 ? probe_cvt_scale_fp4<2>(f16, x, s)
                                       : probe_cvt_scale_fp4<3>(f16, x, s));
        break;
      }
      case kCvtPk8F32: {
        const float y = as_f32(rtc_gld(p.in + 256 + j));
        const rtc_u32 old = rtc_gld(p.in + 512 + j);
        rtc_gst(p.out + j,
                hi ? probe_cvt_pk8<true>(bf8, as_f32(x), y, old) : probe_cvt_pk8<false>(bf8, as_f32(x), y, old));
        break;
      }
    }
  }
}

RTC_DEVICE void probe_encode(const Probe950Params& p, int l) {
  for (int j = l; j < 1024; j += 64)
    rtc_gst(p.out + j, rtc_lp_encode(p.arg & 0xFF, as_f32(rtc_gld(p.in + j)), (p.arg >> 8) != 0));
}

template <int cbsz, int blgp, int opsel_a, int opsel_b>
RTC_DEVICE void probe_mfma(const Probe950Params& p, int l) {
  rtc_i32x8 a, b;
  rtc_f32x4 c;
  for (int i = 0; i < 8; ++i) {
    a[i] = (int)rtc_gld(p.in + l * 8 + i);
    b[i] = (int)rtc_gld(p.in + 512 + l * 8 + i);
  }
  for (int i = 0; i < 4; ++i) c[i] = as_f32(rtc_gld(p.in + 1024 + l * 4 + i));
  const rtc_f32x4 d = mfma_scale_16x16x128_f8f6f4<cbsz, blgp, opsel_a, opsel_b>(a, b, c, rtc_gld(p.in + 1280 + l),
                                                                                rtc_gld(p.in + 1344 + l));
  for (int i = 0; i < 4; ++i) rtc_gst(p.out + l * 4 + i, as_u32(d[i]));
}

// The combination numbered I (see kMfmaScale), found by recursion over I.
template <int I>
RTC_DEVICE void probe_mfma_case(const Probe950Params& p, int l) {
  if (p.arg == I) {
    if (I < 25)
      probe_mfma<(I < 25 ? I / 5 : 0), (I < 25 ? I % 5 : 4), 0, 0>(p, l);
    else
      probe_mfma<0, 4, (I < 25 ? 0 : (I - 25) / 4), (I < 25 ? 0 : (I - 25) % 4)>(p, l);
  } else if constexpr (I < 40) {
    probe_mfma_case<I + 1>(p, l);
  }
}

RTC_KERNEL(64) isa950_probe(Probe950Params p) {
  const int l = (int)threadIdx.x;
  if (p.op == kEncode)
    probe_encode(p, l);
  else if (p.op == kMfmaScale)
    probe_mfma_case<0>(p, l);
  else
    probe_elementwise(p, l);
}
RTC_EXPORT_KERNEL(isa950_probe, Probe950Params)
