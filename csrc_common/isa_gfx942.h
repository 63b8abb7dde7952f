// gfx942/gfx950/gfx90a one-instruction extras the fast kernel needs beyond isa_gfx9.h: zero-C MFMA, MFMA hazard fences, L1
// prefetch, gfx90a register-pressure helpers, and CDNA3's FNUZ FP8 convert (gfx942 only: RTC_HAS_CVT_FP8_FNUZ).
//
// Wait-state rule (LLVM's hazard recognizer does not see MFMAs written as inline asm, so we own it):
//   * an XDL MFMA result may be read or overwritten by VALU, DS or VMEM only after N+3 wait states
//     (N = passes): 7 for 16x16x16 bf16 or f16 on gfx942, 11 on gfx90a; gfx950 asks one more, 8
//     (clang-22 puts s_nop 7 after its own 16x16x16 builtin there, s_nop 6 on gfx942);
//   * a VALU write of a VGPR that an MFMA then reads needs 2 wait states;
//   * MFMAs chaining the same accumulator need none.
// The kernel pins the operands of every run of MFMAs with reg_fence below (an empty asm taking the
// registers as "+v", so no producer or consumer can be scheduled across it) and issues the s_nop the
// rule asks for with mfma_wait_read / mfma_wait_result. Nothing else touches MFMA operands.
#pragma once
#include "platform.h"
#include "isa_gfx9.h"

#if defined(RTC_EMU)
// C = 0 without a register: the first MFMA of a chain needs no zeroed accumulator.
RTC_ISA rtc_f32x4 mfma_16x16x16_bf16_zc(rtc_bf16x4 a, rtc_bf16x4 b) {
  const rtc_f32x4 z = {0.0f, 0.0f, 0.0f, 0.0f};
  return mfma_16x16x16_bf16(a, b, z);
}
RTC_ISA rtc_f32x4 mfma_16x16x16_f16_zc(rtc_f16x4 a, rtc_f16x4 b) {
  const rtc_f32x4 z = {0.0f, 0.0f, 0.0f, 0.0f};
  return mfma_16x16x16_f16(a, b, z);
}
RTC_ISA void mfma_acc(rtc_f32x4& acc, rtc_bf16x4 a, rtc_bf16x4 b) { acc = mfma_16x16x16_bf16(a, b, acc); }
RTC_ISA void mfma_acc(rtc_f32x4& acc, rtc_f16x4 a, rtc_f16x4 b) { acc = mfma_16x16x16_f16(a, b, acc); }
template <class T> RTC_ISA void reg_fence(T&) {}  // ordering only: nothing to emulate
template <class T> RTC_ISA void sreg_fence(T&) {}
RTC_ISA void mfma_wait_read() {}  // wait states are a timing matter
RTC_ISA void mfma_wait_result() {}
template <class T> RTC_ISA void keep_alive(const T&) {}  // the L1 prefetch value is unused
RTC_ISA int uniform_i32(int x) { return x; }
template <class T> RTC_ISA void sreg_fence_gfx90a(T&) {}
#else
RTC_ISA rtc_f32x4 mfma_16x16x16_bf16_zc(rtc_bf16x4 a, rtc_bf16x4 b) {
  rtc_f32x4 d;
  // Early clobber: the result must not overlap the sources.
  asm volatile(RTC_MFMA16_OP " %0, %1, %2, 0" : "=&v"(d) : "v"(a), "v"(b));
  return d;
}
RTC_ISA rtc_f32x4 mfma_16x16x16_f16_zc(rtc_f16x4 a, rtc_f16x4 b) {
  rtc_f32x4 d;
  asm volatile(RTC_MFMA16_F16_OP " %0, %1, %2, 0" : "=&v"(d) : "v"(a), "v"(b));
  return d;
}
// In/out tied to the same VGPRs: no accumulator copy, the compiler still allocates.
RTC_ISA void mfma_acc(rtc_f32x4& acc, rtc_bf16x4 a, rtc_bf16x4 b) { mfma_16x16x16_bf16_asm(acc, a, b); }
RTC_ISA void mfma_acc(rtc_f32x4& acc, rtc_f16x4 a, rtc_f16x4 b) { mfma_16x16x16_f16_asm(acc, a, b); }
// Pins a register group: producers before, consumers after, in program order with other fences.
template <class T> RTC_ISA void reg_fence(T& x) { asm volatile("" : "+v"(x)); }
// The same for a uniform value. Fencing a value inside a loop also stops the compiler from
// hoisting everything derived from it out of the loop and holding it in registers throughout.
template <class T> RTC_ISA void sreg_fence(T& x) { asm volatile("" : "+s"(x)); }
// 2 wait states: VALU write -> MFMA read.
RTC_ISA void mfma_wait_read() { asm volatile("s_nop 1"); }
// MFMA result -> VALU/DS/VMEM access: 7 wait states on gfx942, 8 on gfx950, 11 on gfx90a (s_nop n = n+1).
#if defined(__gfx90a__)
RTC_ISA void mfma_wait_result() { asm volatile("s_nop 7\n\ts_nop 2"); }
#elif defined(__gfx950__)
RTC_ISA void mfma_wait_result() { asm volatile("s_nop 7"); }
#else
RTC_ISA void mfma_wait_result() { asm volatile("s_nop 6"); }
#endif
// The loaded value is never read: the load only warms L1. Tying it to an empty asm keeps the load
// alive without a fixed, clobbered register (an async write into a reused register would be a bug).
template <class T> RTC_ISA void keep_alive(const T& x) { asm volatile("" ::"v"(x)); }
// gfx90a-only register-pressure helpers, identities on gfx942 (whose code they leave unchanged).
// gfx90a has no SGPR to spare at the kv loop's peak, so one spill there costs a VGPR, and with
// 256 VGPRs in use that VGPR goes to scratch.
#if defined(__gfx90a__)
// A value the kernel knows to be wave-uniform, in an SGPR: hipRTC 5.2 (clang 15) leaves the results
// of uniform integer divisions (expanded into VALU float ops) in VGPRs, and held them across the loop.
RTC_ISA int uniform_i32(int x) { return (int)readfirstlane((rtc_u32)x); }
// sreg_fence, per call: stops clang 19 sharing what is derived from x between calls (the 16
// kv-mask compares of softmax_tile, 32 SGPRs when computed once for all three tiles). hipRTC 5.2
// builds the masks differently and spills 2 VGPRs with the fence, none without: skipped there.
#if __clang_major__ >= 16
template <class T> RTC_ISA void sreg_fence_gfx90a(T& x) { sreg_fence(x); }
#else
template <class T> RTC_ISA void sreg_fence_gfx90a(T&) {}
#endif
#else
RTC_ISA int uniform_i32(int x) { return x; }
template <class T> RTC_ISA void sreg_fence_gfx90a(T&) {}
#endif
#endif

// v_cvt_pk_f32_fp8 on CDNA3 (gfx940..942), whose FP8 is E4M3 FNUZ (bias 8, no Inf, no -0, 0x80 its only NaN): the
// two codes of src's low word (hi: its high word), low byte first, as two fp32, exactly (every FNUZ value is an fp32
// normal or zero; 0x80 a NaN). gfx90a has no FP8 converts, and gfx950's v_cvt_pk_f32_fp8 reads OCP E4M3
// (isa_gfx950.h's cvt_pk_f32_fp8): RTC_HAS_CVT_FP8_FNUZ is 1 only where this one exists (gfx942 and gfx942-emu).
typedef RTC_VEC(float, 2) rtc_f32x2;
#if defined(RTC_EMU)
#if RTC_EMU_ARCH == 0x942
#define RTC_HAS_CVT_FP8_FNUZ 1
template <bool hi> RTC_ISA rtc_f32x2 cvt_pk_f32_fp8_fnuz(rtc_u32 src) {
  const rtc_u32 h = hi ? src >> 16 : src;
  const rtc_f32x2 r = {::rtc_emu::isa::fp8_fnuz_to_f32(h), ::rtc_emu::isa::fp8_fnuz_to_f32(h >> 8)};
  return r;
}
#endif
#elif defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define RTC_HAS_CVT_FP8_FNUZ 1
template <bool hi> RTC_ISA rtc_f32x2 cvt_pk_f32_fp8_fnuz(rtc_u32 src) {
  return __builtin_amdgcn_cvt_pk_f32_fp8((int)src, hi);
}
#endif
#if !defined(RTC_HAS_CVT_FP8_FNUZ)
#define RTC_HAS_CVT_FP8_FNUZ 0
#endif
// gfx950's OCP FP8 converts (isa_gfx950.h's cvt_pk_f32_fp8: E4M3, exact) and its scaled FP4 converts
// (cvt_scalef32_pk_*_fp4): 1 on gfx950 and gfx950-emu.
#if RTC_GFX == 0x950
#define RTC_HAS_CVT_FP8_OCP 1
#define RTC_HAS_CVT_SCALE_FP4 1
#else
#define RTC_HAS_CVT_FP8_OCP 0
#define RTC_HAS_CVT_SCALE_FP4 0
#endif
