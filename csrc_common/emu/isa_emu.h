// The isa_gfx9.h wrappers under the emulator: wave collectives over the fibers of one wave.
#pragma once
#include <string.h>
#include "isa_host.h"
#include "lds_check.h"
#include "global_ranges.h"
#include "fp16_round.h"

// ---- matrix core -------------------------------------------------------------------------------
template <class V>
struct rtc_emu_mfma16_in {
  V a, b;
  rtc_f32x4 c;
};
template <class V>
struct rtc_emu_mfma32_in {
  V a, b;
  rtc_f32x16 c;
};

// One 16x16x16 / 32x32x8 block over the wave's operands; kF16: the operands are fp16 bits, else bf16.
template <bool kF16, class V>
inline void rtc_emu_mfma16_block(const rtc_emu_mfma16_in<V>* x, rtc_f32x4* y) {
  uint16_t A[64][4], B[64][4];
  float C[64][4], D[64][4];
  for (int l = 0; l < 64; ++l)
    for (int i = 0; i < 4; ++i) {
      A[l][i] = (uint16_t)x[l].a[i];
      B[l][i] = (uint16_t)x[l].b[i];
      C[l][i] = x[l].c[i];
    }
  ::rtc_emu::isa::mfma_16x16x16(A, B, C, D, kF16 ? ::rtc_emu::isa::f16_to_f32 : ::rtc_emu::isa::bf16_to_f32);
  for (int l = 0; l < 64; ++l)
    for (int i = 0; i < 4; ++i) y[l][i] = D[l][i];
}
template <bool kF16, class V>
inline void rtc_emu_mfma32_block(const rtc_emu_mfma32_in<V>* x, rtc_f32x16* y) {
  uint16_t A[64][4], B[64][4];
  float C[64][16], D[64][16];
  for (int l = 0; l < 64; ++l) {
    for (int i = 0; i < 4; ++i) {
      A[l][i] = (uint16_t)x[l].a[i];
      B[l][i] = (uint16_t)x[l].b[i];
    }
    for (int r = 0; r < 16; ++r) C[l][r] = x[l].c[r];
  }
  ::rtc_emu::isa::mfma_32x32x8(A, B, C, D, kF16 ? ::rtc_emu::isa::f16_to_f32 : ::rtc_emu::isa::bf16_to_f32);
  for (int l = 0; l < 64; ++l)
    for (int r = 0; r < 16; ++r) y[l][r] = D[l][r];
}

RTC_ISA rtc_f32x4 mfma_16x16x16_bf16(rtc_bf16x4 a, rtc_bf16x4 b, rtc_f32x4 c) {
  const rtc_emu_mfma16_in<rtc_bf16x4> in = {a, b, c};
  return ::rtc_emu::wave_op<rtc_emu_mfma16_in<rtc_bf16x4>, rtc_f32x4>(
      RTC_EMU_ARCH == 0x90a ? "v_mfma_f32_16x16x16bf16_1k" : "v_mfma_f32_16x16x16_bf16", in,
      [](const rtc_emu_mfma16_in<rtc_bf16x4>* x, rtc_f32x4* y, int) { rtc_emu_mfma16_block<false>(x, y); });
}
RTC_ISA rtc_f32x4 mfma_16x16x16_f16(rtc_f16x4 a, rtc_f16x4 b, rtc_f32x4 c) {
  const rtc_emu_mfma16_in<rtc_f16x4> in = {a, b, c};
  return ::rtc_emu::wave_op<rtc_emu_mfma16_in<rtc_f16x4>, rtc_f32x4>(
      RTC_EMU_ARCH == 0x90a ? "v_mfma_f32_16x16x16f16" : "v_mfma_f32_16x16x16_f16", in,
      [](const rtc_emu_mfma16_in<rtc_f16x4>* x, rtc_f32x4* y, int) { rtc_emu_mfma16_block<true>(x, y); });
}

RTC_ISA rtc_f32x16 mfma_32x32x8_bf16(rtc_bf16x4 a, rtc_bf16x4 b, rtc_f32x16 c) {
  const rtc_emu_mfma32_in<rtc_bf16x4> in = {a, b, c};
  return ::rtc_emu::wave_op<rtc_emu_mfma32_in<rtc_bf16x4>, rtc_f32x16>(
      RTC_EMU_ARCH == 0x90a ? "v_mfma_f32_32x32x8bf16_1k" : "v_mfma_f32_32x32x8_bf16", in,
      [](const rtc_emu_mfma32_in<rtc_bf16x4>* x, rtc_f32x16* y, int) { rtc_emu_mfma32_block<false>(x, y); });
}
RTC_ISA rtc_f32x16 mfma_32x32x8_f16(rtc_f16x4 a, rtc_f16x4 b, rtc_f32x16 c) {
  const rtc_emu_mfma32_in<rtc_f16x4> in = {a, b, c};
  return ::rtc_emu::wave_op<rtc_emu_mfma32_in<rtc_f16x4>, rtc_f32x16>(
      RTC_EMU_ARCH == 0x90a ? "v_mfma_f32_32x32x8f16" : "v_mfma_f32_32x32x8_f16", in,
      [](const rtc_emu_mfma32_in<rtc_f16x4>* x, rtc_f32x16* y, int) { rtc_emu_mfma32_block<true>(x, y); });
}

// ---- transcendental VALU ops: exact libm results; hardware is within 1 ULP of these -----------
RTC_ISA float exp2_f32(float x) { return exp2f(x); }       // v_exp_f32
RTC_ISA float log2_f32(float x) { return log2f(x); }       // v_log_f32
RTC_ISA float rcp_f32(float x) { return 1.0f / x; }        // v_rcp_f32
// v_cvt_f16_f32: to nearest even, subnormals kept, past 65520 to Inf; a NaN becomes the quiet 0x7E00 here (hardware
// keeps some quiet NaN: callers that store one canonicalise it).
RTC_ISA rtc_u32 cvt_f16_f32(float x) { return rtc_f32_to_fp16_rtne(x); }
// v_cvt_pkrtz_f16_f32: toward zero; a NaN becomes the quiet 0x7E00 here, as above.
RTC_ISA rtc_u32 cvt_pkrtz_f16_f32(float a, float b) {
  return ::rtc_emu::isa::f32_to_f16_rtz(a) | (::rtc_emu::isa::f32_to_f16_rtz(b) << 16);
}

RTC_ISA rtc_u32 perm_b32(rtc_u32 src0, rtc_u32 src1, rtc_u32 sel) {  // v_perm_b32
  return ::rtc_emu::isa::perm_b32(src0, src1, sel);
}

RTC_ISA rtc_u32 lane_id() { return (rtc_u32)::rtc_emu::t_cur->lane; }  // v_mbcnt_lo/hi

// ---- cross-lane ---------------------------------------------------------------------------------
template <int ctrl, int row_mask = 0xF, int bank_mask = 0xF, bool bound_ctrl = true>
RTC_ISA rtc_u32 dpp_mov(rtc_u32 old, rtc_u32 src) {  // v_mov_b32_dpp
  const rtc_u32x2 in = {old, src};
  return ::rtc_emu::wave_op<rtc_u32x2, rtc_u32>("v_mov_b32_dpp", in, [](const rtc_u32x2* x, rtc_u32* y, int) {
    rtc_u32 o[64], s[64];
    for (int l = 0; l < 64; ++l) {
      o[l] = x[l][0];
      s[l] = x[l][1];
    }
    if (!::rtc_emu::isa::dpp_mov(o, s, y, ctrl, row_mask, bank_mask, bound_ctrl))
      ::rtc_emu::fail("DPP control 0x%x is not a gfx9 DPP control", ctrl);
  });
}

RTC_ISA rtc_u32 readfirstlane(rtc_u32 v) {  // v_readfirstlane_b32
  return ::rtc_emu::wave_op<rtc_u32, rtc_u32>("v_readfirstlane_b32", v, [](const rtc_u32* x, rtc_u32* y, int) {
    for (int l = 0; l < 64; ++l) y[l] = x[0];
  });
}

// ds_bpermute_b32: lane l receives src of lane (byte_addr[l] / 4) mod 64.
RTC_ISA rtc_u32 ds_bpermute(int byte_addr, rtc_u32 src) {
  const rtc_u32x2 in = {(rtc_u32)byte_addr, src};
  return ::rtc_emu::wave_op<rtc_u32x2, rtc_u32>("ds_bpermute_b32", in, [](const rtc_u32x2* x, rtc_u32* y, int) {
    for (int l = 0; l < 64; ++l) y[l] = x[(x[l][0] >> 2) & 63][1];
  });
}

template <int pattern>
RTC_ISA rtc_u32 ds_swizzle(rtc_u32 src) {  // ds_swizzle_b32 offset:pattern
  return ::rtc_emu::wave_op<rtc_u32, rtc_u32>("ds_swizzle_b32", src, [](const rtc_u32* x, rtc_u32* y, int) {
    for (int l = 0; l < 64; ++l) {
      int s = 0;
      if (!::rtc_emu::isa::ds_swizzle_source(pattern, l, &s))
        ::rtc_emu::fail("ds_swizzle offset 0x%x: rotate/FFT modes are not emulated", pattern);
      y[l] = x[s];
    }
  });
}

RTC_ISA rtc_u64 ballot(bool p) {  // v_cmp_ne_u32 into an SGPR pair: bit l = lane l's predicate
  return ::rtc_emu::wave_op<int, rtc_u64>("ballot", p ? 1 : 0, [](const int* x, rtc_u64* y, int lanes) {
    rtc_u64 m = 0;
    for (int l = 0; l < lanes; ++l) m |= (rtc_u64)(x[l] != 0) << l;
    for (int l = 0; l < 64; ++l) y[l] = m;
  });
}

RTC_ISA rtc_u64 exec_mask() {  // live lanes of this wave (a partial last wave has fewer)
  const int n = ::rtc_emu::t_cur->wg->waves[::rtc_emu::t_cur->wave].lanes;
  return n >= 64 ? ~0ull : ((1ull << n) - 1);
}
RTC_ISA bool wave_all(bool p) { return ballot(p) == exec_mask(); }
RTC_ISA bool wave_any(bool p) { return ballot(p) != 0; }

// ---- synchronisation: memory operations complete eagerly, so waits only order the lanes ------
RTC_ISA void rtc_emu_wave_sync(const char* name) {
  ::rtc_emu::wave_op<int, int>(name, 0, [](const int*, int*, int) {});
}
template <int n> RTC_ISA void s_waitcnt_vmcnt() { rtc_emu_wave_sync("s_waitcnt vmcnt"); }
template <int n> RTC_ISA void s_waitcnt_lgkmcnt() { rtc_emu_wave_sync("s_waitcnt lgkmcnt"); }
RTC_ISA void wave_barrier() { rtc_emu_wave_sync("wave_barrier"); }
RTC_ISA void s_barrier() { ::rtc_emu::barrier(); }
template <int prio> RTC_ISA void s_setprio() {}
RTC_ISA void rare_block() {}
template <int mask> RTC_ISA void sched_barrier() {}
template <int mask, int size, int group> RTC_ISA void sched_group_barrier() {}

#include "isa_emu_mem.h"
