// Runs one wrapped instruction of isa_gfx9.h on one wave so a test can compare every lane.
#include "platform.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"

// in: 64 words for kExp2, kCvtF16, kReadFirst, kVote, kBufStore; 192 for the DPP ops, kPerm and kBpermute
// (x, y, z below); 1536 for the MFMA ops; num_records (arg) bytes for kBufLoad/kBufLds/kBufUbyte.
// out: 1024 words. Every global access goes through rtc_gld/rtc_gst, so the launch's ranges check it.
struct ProbeParams {
  const rtc_u32* in;
  rtc_u32* out;
  int op;
  int arg;
};

enum {
  kMfma16,
  kMfma32,
  kExp2,
  kRowShr,
  kRowRor,
  kQuadPerm,
  kRowMirror,
  kBcast15,
  kPerm,
  kReadFirst,
  kBpermute,
  kSwizzleXor,
  kSwizzleQuad,
  kVote,
  kBufLoad,
  kBufLds,
  kBufStore,
  kMfma16F16,
  kMfma32F16,
  kCvtF16,
  kCvtPkFnuz,  // arg: hi; out[l], out[64 + l]: v_cvt_pk_f32_fp8 (gfx942's FNUZ) of in[l]; gfx90a has none: nothing
  kCvtPkrtz,   // v_cvt_pkrtz_f16_f32 of in[l] (low half) and in[64 + l]
  kBufUbyte    // out[l]: buffer_load_ubyte of in's byte 7 l, num_records arg bytes
};

struct ProbeLds {
  rtc_smem<rtc_u32, 64> words;
};

RTC_DEVICE float as_f32(rtc_u32 u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
RTC_DEVICE rtc_u32 as_u32(float f) {
  rtc_u32 u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

// The operands' bits as bf16 (kMfma16, kMfma32) or fp16 (kMfma16F16, kMfma32F16).
RTC_DEVICE void probe_mfma16(const ProbeParams& p, int l) {
  rtc_bf16x4 a, b;
  rtc_f32x4 c;
  for (int i = 0; i < 4; ++i) {
    a[i] = (short)rtc_gld(p.in + l * 4 + i);
    b[i] = (short)rtc_gld(p.in + 256 + l * 4 + i);
    c[i] = as_f32(rtc_gld(p.in + 512 + l * 4 + i));
  }
  rtc_f32x4 d;
  if (p.op == kMfma16F16)
    d = mfma_16x16x16_f16(__builtin_bit_cast(rtc_f16x4, a), __builtin_bit_cast(rtc_f16x4, b), c);
  else
    d = mfma_16x16x16_bf16(a, b, c);
  for (int i = 0; i < 4; ++i) rtc_gst(p.out + l * 4 + i, as_u32(d[i]));
}

RTC_DEVICE void probe_mfma32(const ProbeParams& p, int l) {
  rtc_bf16x4 a, b;
  rtc_f32x16 c;
  for (int i = 0; i < 4; ++i) {
    a[i] = (short)rtc_gld(p.in + l * 4 + i);
    b[i] = (short)rtc_gld(p.in + 256 + l * 4 + i);
  }
  for (int r = 0; r < 16; ++r) c[r] = as_f32(rtc_gld(p.in + 512 + l * 16 + r));
  rtc_f32x16 d;
  if (p.op == kMfma32F16)
    d = mfma_32x32x8_f16(__builtin_bit_cast(rtc_f16x4, a), __builtin_bit_cast(rtc_f16x4, b), c);
  else
    d = mfma_32x32x8_bf16(a, b, c);
  for (int r = 0; r < 16; ++r) rtc_gst(p.out + l * 16 + r, as_u32(d[r]));
}

RTC_DEVICE void probe_buffers(const ProbeParams& p, int l) {
  const rtc_buffer_rsrc r = make_buffer_rsrc(p.in, (rtc_u32)p.arg);
  if (p.op == kBufUbyte) {
    rtc_gst(p.out + l, (rtc_u32)buffer_load_ubyte(r, (rtc_u32)l * 7u, 0u));
  } else if (p.op == kBufLoad) {
    const rtc_u32x4 v = buffer_load_dwordx4(r, (rtc_u32)l * 16u, 0u);
    for (int i = 0; i < 4; ++i) rtc_gst(p.out + l * 4 + i, (rtc_u32)v[i]);
  } else if (p.op == kBufStore) {
    const rtc_buffer_rsrc w = make_buffer_rsrc(p.out, (rtc_u32)p.arg);
    buffer_store_dword(w, (rtc_u32)l * 4u, 0u, rtc_gld(p.in + l));
  } else {
    RTC_SHARED(ProbeLds, sm);
    buffer_load_dword_lds(r, (rtc_u32)l * 4u, 4u, &sm.words.data[0]);
    s_waitcnt_vmcnt<0>();
    s_barrier();
    rtc_gst(p.out + l, sm.words.ld(63 - l));
  }
}

RTC_DEVICE rtc_u32 probe_one(const ProbeParams& p, int l) {  // the ops with one result per lane
  const rtc_u32 x = rtc_gld(p.in + l);
  switch (p.op) {
    case kExp2: return as_u32(exp2_f32(as_f32(x)));
    case kCvtF16: return cvt_f16_f32(as_f32(x));
    case kReadFirst: return readfirstlane(x);
    case kSwizzleXor: return ds_swizzle<0x401F>(x);      // lane ^ 16
    case kSwizzleQuad: return ds_swizzle<0x801B>(x);     // quad perm [3,2,1,0]
  }
  const rtc_u32 y = rtc_gld(p.in + 64 + l);
  switch (p.op) {
    case kCvtPkrtz: return cvt_pkrtz_f16_f32(as_f32(x), as_f32(y));
    case kRowShr: return dpp_mov<0x111>(y, x);            // row_shr:1, bound_ctrl
    case kRowRor: return dpp_mov<0x123>(y, x);            // row_ror:3
    case kQuadPerm: return dpp_mov<0x1B>(y, x);           // quad_perm:[3,2,1,0]
    case kRowMirror: return dpp_mov<0x140>(y, x);
    case kBcast15: return dpp_mov<0x142, 0xA, 0xF, false>(y, x);
    case kBpermute: return ds_bpermute((int)y, x);
  }
  return perm_b32(x, y, rtc_gld(p.in + 128 + l));         // kPerm
}

RTC_KERNEL(64) isa_probe(ProbeParams p) {
  const int l = (int)threadIdx.x;
  switch (p.op) {
    case kMfma16:
    case kMfma16F16: probe_mfma16(p, l); break;
    case kMfma32:
    case kMfma32F16: probe_mfma32(p, l); break;
    case kVote: {
      const rtc_u32 x = rtc_gld(p.in + l);
      const rtc_u64 m = ballot((x & 1u) != 0);
      rtc_gst(p.out + l, (rtc_u32)m);
      rtc_gst(p.out + 64 + l, (rtc_u32)(m >> 32));
      rtc_gst(p.out + 128 + l, (wave_all(x < (rtc_u32)p.arg) ? 1u : 0u) | (wave_any(x == (rtc_u32)p.arg) ? 2u : 0u));
      break;
    }
    case kBufLoad:
    case kBufLds:
    case kBufStore:
    case kBufUbyte: probe_buffers(p, l); break;
    case kCvtPkFnuz: {
#if RTC_HAS_CVT_FP8_FNUZ
      const rtc_u32 x = rtc_gld(p.in + l);
      const rtc_f32x2 f = p.arg ? cvt_pk_f32_fp8_fnuz<true>(x) : cvt_pk_f32_fp8_fnuz<false>(x);
      rtc_gst(p.out + l, as_u32(f[0]));
      rtc_gst(p.out + 64 + l, as_u32(f[1]));
#endif
      break;
    }
    default: rtc_gst(p.out + l, probe_one(p, l)); break;
  }
}
RTC_EXPORT_KERNEL(isa_probe, ProbeParams)
