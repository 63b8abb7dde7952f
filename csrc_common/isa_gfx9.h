// One-instruction wrappers for gfx90a/gfx942 kernels: builtins or inline asm on AMD, the instruction's semantics under
// the emulator.
//
// Every wrapper stands for exactly one instruction (or one builtin that selects one), so the
// kernel author picks opcodes and the compiler allocates registers. Wave-wide wrappers (MFMA,
// DPP, swizzle, bpermute, readfirstlane, ballot/all/any, s_waitcnt, wave_barrier) must be called
// by every lane of the wave from the same call site: the emulator checks that.
// Spelling differences between gfx90a and gfx942 stay in this file.
#pragma once
#include "platform.h"

#if defined(RTC_EMU)
#include "emu/isa_host.h"
#define RTC_ISA inline __attribute__((always_inline))
#define RTC_VEC(T, n) T __attribute__((vector_size(sizeof(T) * (n))))
#elif defined(RTC_AMD)
#define RTC_ISA __device__ __forceinline__
#define RTC_VEC(T, n) T __attribute__((ext_vector_type(n)))
#else
#error "isa_gfx9.h is for AMD gfx9 kernels (and their emulation) only"
#endif

typedef RTC_VEC(float, 4) rtc_f32x4;
typedef RTC_VEC(float, 16) rtc_f32x16;
typedef RTC_VEC(short, 4) rtc_bf16x4;     // 4 bf16 bits, element 0 in the low half of dword 0
typedef RTC_VEC(unsigned short,
                4) rtc_f16x4;  // 4 fp16 bits, the same layout (a distinct type: the MFMAs overload on it)
typedef RTC_VEC(rtc_u32, 2) rtc_u32x2;
typedef RTC_VEC(rtc_u32, 4) rtc_u32x4;
typedef RTC_VEC(int, 4) rtc_buffer_rsrc;  // V#: base (48 bits), stride, num_records, flags

// Raw buffer (stride 0) over [base, base + num_records): loads past the end read 0, stores past
// it are dropped, per dword. Word 3 is gfx9's DATA_FORMAT = 32 for untyped dword access.
RTC_ISA rtc_buffer_rsrc make_buffer_rsrc(const void* base, rtc_u32 num_records) {
  const rtc_u64 a = (rtc_u64)base;
  rtc_buffer_rsrc r;
  r[0] = (int)(rtc_u32)a;
  r[1] = (int)(rtc_u32)((a >> 32) & 0xFFFFu);
  r[2] = (int)num_records;
  r[3] = 0x00020000;
  return r;
}
// The same from the base address's two halves (when the caller keeps them in SGPRs itself).
RTC_ISA rtc_buffer_rsrc make_buffer_rsrc(rtc_u32 base_lo, rtc_u32 base_hi, rtc_u32 num_records) {
  rtc_buffer_rsrc r;
  r[0] = (int)base_lo;
  r[1] = (int)(base_hi & 0xFFFFu);
  r[2] = (int)num_records;
  r[3] = 0x00020000;
  return r;
}

// An MFMA operand of four 16-bit elements (F: rtc_bf16x4 or rtc_f16x4) from two dwords, element 0 in lo's low half (no
// instruction: the registers as they are).
template <class F> RTC_ISA F frag_of_words(rtc_u32 lo, rtc_u32 hi) {
  const rtc_u32x2 w = {lo, hi};
  return __builtin_bit_cast(F, w);
}

#if defined(RTC_EMU)
#include "emu/isa_emu.h"
#else
// ---- matrix core. Builtins: the compiler inserts the MFMA -> VALU wait states itself. ---------
RTC_ISA rtc_f32x4 mfma_16x16x16_bf16(rtc_bf16x4 a, rtc_bf16x4 b, rtc_f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
}
RTC_ISA rtc_f32x16 mfma_32x32x8_bf16(rtc_bf16x4 a, rtc_bf16x4 b, rtc_f32x16 c) {
  return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, 0, 0, 0);
}
// The fp16 forms: the same operand layouts, fp16 products accumulated in fp32.
typedef _Float16 rtc_half4_native __attribute__((ext_vector_type(4)));
RTC_ISA rtc_f32x4 mfma_16x16x16_f16(rtc_f16x4 a, rtc_f16x4 b, rtc_f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(rtc_half4_native, a),
                                               __builtin_bit_cast(rtc_half4_native, b), c, 0, 0, 0);
}
RTC_ISA rtc_f32x16 mfma_32x32x8_f16(rtc_f16x4 a, rtc_f16x4 b, rtc_f32x16 c) {
  return __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(rtc_half4_native, a),
                                              __builtin_bit_cast(rtc_half4_native, b), c, 0, 0, 0);
}
// The same instruction as inline asm (the opcode is spelled per arch). The caller owns the wait
// states: gfx942 needs 7 (16x16x16) / 11 (32x32x8) before a VALU, DS or VMEM read of the result,
// gfx950 8 for a 16x16x16, gfx90a 11 / 19; none between MFMAs chaining the same accumulator.
#if defined(__gfx90a__)
#define RTC_MFMA16_OP "v_mfma_f32_16x16x16bf16_1k"
#define RTC_MFMA16_F16_OP "v_mfma_f32_16x16x16f16"
#else
#define RTC_MFMA16_OP "v_mfma_f32_16x16x16_bf16"
#define RTC_MFMA16_F16_OP "v_mfma_f32_16x16x16_f16"
#endif
RTC_ISA void mfma_16x16x16_bf16_asm(rtc_f32x4& acc, rtc_bf16x4 a, rtc_bf16x4 b) {
  asm volatile(RTC_MFMA16_OP " %0, %1, %2, %0" : "+v"(acc) : "v"(a), "v"(b));
}
RTC_ISA void mfma_16x16x16_f16_asm(rtc_f32x4& acc, rtc_f16x4 a, rtc_f16x4 b) {
  asm volatile(RTC_MFMA16_F16_OP " %0, %1, %2, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// ---- transcendental VALU ops (approximate on hardware, to about 1 ULP) -------------------------
RTC_ISA float exp2_f32(float x) {
  float r;
  asm volatile("v_exp_f32 %0, %1" : "=v"(r) : "v"(x));
  return r;
}
RTC_ISA float log2_f32(float x) {
  float r;
  asm volatile("v_log_f32 %0, %1" : "=v"(r) : "v"(x));
  return r;
}
RTC_ISA float rcp_f32(float x) { return __builtin_amdgcn_rcpf(x); }
// fp32 -> fp16 bits in the low half (v_cvt_f16_f32: to nearest even, subnormals kept, past 65520 to Inf; a NaN
// stays a quiet NaN, its payload not canonical).
RTC_ISA rtc_u32 cvt_f16_f32(float x) { return (rtc_u32) __builtin_bit_cast(unsigned short, (_Float16)x); }
// Two fp32 -> an fp16 pair, a in the low half (v_cvt_pkrtz_f16_f32: toward zero, subnormals kept, finite values past
// 65504 to 65504, Inf kept; a NaN stays a quiet NaN).
RTC_ISA rtc_u32 cvt_pkrtz_f16_f32(float a, float b) {
  return __builtin_bit_cast(rtc_u32, __builtin_amdgcn_cvt_pkrtz(a, b));
}
RTC_ISA rtc_u32 perm_b32(rtc_u32 src0, rtc_u32 src1, rtc_u32 sel) { return __builtin_amdgcn_perm(src0, src1, sel); }
RTC_ISA rtc_u32 lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

// ---- cross-lane ---------------------------------------------------------------------------------
template <int ctrl, int row_mask = 0xF, int bank_mask = 0xF, bool bound_ctrl = true>
RTC_ISA rtc_u32 dpp_mov(rtc_u32 old, rtc_u32 src) {
  return (rtc_u32)__builtin_amdgcn_update_dpp((int)old, (int)src, ctrl, row_mask, bank_mask, bound_ctrl);
}
RTC_ISA rtc_u32 readfirstlane(rtc_u32 v) { return (rtc_u32)__builtin_amdgcn_readfirstlane((int)v); }
RTC_ISA rtc_u32 ds_bpermute(int byte_addr, rtc_u32 src) {
  return (rtc_u32)__builtin_amdgcn_ds_bpermute(byte_addr, (int)src);
}
template <int pattern>
RTC_ISA rtc_u32 ds_swizzle(rtc_u32 src) {
  return (rtc_u32)__builtin_amdgcn_ds_swizzle((int)src, pattern);
}
#if __has_builtin(__builtin_amdgcn_ballot_w64)
RTC_ISA rtc_u64 ballot(bool p) { return __builtin_amdgcn_ballot_w64(p); }
#else
// hipRTC 5.2 (clang 15) has the intrinsic but not the builtin: bind it by name.
__device__ rtc_u64 rtc_llvm_ballot_w64(bool) __asm("llvm.amdgcn.ballot.i64");
RTC_ISA rtc_u64 ballot(bool p) { return rtc_llvm_ballot_w64(p); }
#endif
RTC_ISA rtc_u64 exec_mask() { return __builtin_amdgcn_read_exec(); }
RTC_ISA bool wave_all(bool p) { return ballot(p) == exec_mask(); }
RTC_ISA bool wave_any(bool p) { return ballot(p) != 0; }

// ---- synchronisation ----------------------------------------------------------------------------
// gfx9 s_waitcnt immediate: vmcnt bits 3:0 and 15:14, expcnt 6:4, lgkmcnt 11:8 (all-ones = no wait).
template <int n> RTC_ISA void s_waitcnt_vmcnt() {
  static_assert(n >= 0 && n < 64, "vmcnt is 0..63");
  __builtin_amdgcn_s_waitcnt((n & 0xF) | ((n >> 4) << 14) | (0x7 << 4) | (0xF << 8));
}
template <int n> RTC_ISA void s_waitcnt_lgkmcnt() {
  static_assert(n >= 0 && n < 16, "lgkmcnt is 0..15");
  __builtin_amdgcn_s_waitcnt(0xF | (0x3 << 14) | (0x7 << 4) | (n << 8));
}
RTC_ISA void wave_barrier() { __builtin_amdgcn_wave_barrier(); }
RTC_ISA void s_barrier() { __builtin_amdgcn_s_barrier(); }
template <int prio> RTC_ISA void s_setprio() { __builtin_amdgcn_s_setprio(prio); }
// The head of a block that runs rarely (a data-dependent fix-up): two s_nop 0 in a row, which clang's hazard
// waits (one s_nop n of the waits needed) never give, so that the code-object tools (coreport) can leave the block
// out of a loop's per-step counts. No effect on execution beyond two cycles.
RTC_ISA void rare_block() { asm volatile("s_nop 0\n\ts_nop 0"); }
template <int mask> RTC_ISA void sched_barrier() {
#if __has_builtin(__builtin_amdgcn_sched_barrier)
  __builtin_amdgcn_sched_barrier(mask);
#endif
}
template <int mask, int size, int group> RTC_ISA void sched_group_barrier() {
#if __has_builtin(__builtin_amdgcn_sched_group_barrier)
  __builtin_amdgcn_sched_group_barrier(mask, size, group);
#endif
}

// ---- memory: the LLVM buffer intrinsics bound by name (no clang builtin in every version) -------
typedef __attribute__((address_space(3))) void* rtc_lds_ptr;
__device__ unsigned char rtc_llvm_buffer_load_b8(rtc_buffer_rsrc, int, int,
                                                 int) __asm("llvm.amdgcn.raw.buffer.load.i8");
__device__ rtc_u32 rtc_llvm_buffer_load_b32(rtc_buffer_rsrc, int, int, int) __asm("llvm.amdgcn.raw.buffer.load.i32");
__device__ rtc_u32x2 rtc_llvm_buffer_load_b64(rtc_buffer_rsrc, int, int,
                                              int) __asm("llvm.amdgcn.raw.buffer.load.v2i32");
__device__ rtc_u32x4 rtc_llvm_buffer_load_b128(rtc_buffer_rsrc, int, int,
                                               int) __asm("llvm.amdgcn.raw.buffer.load.v4i32");
__device__ void rtc_llvm_buffer_store_b32(rtc_u32, rtc_buffer_rsrc, int, int,
                                          int) __asm("llvm.amdgcn.raw.buffer.store.i32");
__device__ void rtc_llvm_buffer_store_b64(rtc_u32x2, rtc_buffer_rsrc, int, int,
                                          int) __asm("llvm.amdgcn.raw.buffer.store.v2i32");
__device__ void rtc_llvm_buffer_store_b128(rtc_u32x4, rtc_buffer_rsrc, int, int,
                                           int) __asm("llvm.amdgcn.raw.buffer.store.v4i32");
__device__ void rtc_llvm_buffer_load_lds(rtc_buffer_rsrc, rtc_lds_ptr, int, int, int, int,
                                         int) __asm("llvm.amdgcn.raw.buffer.load.lds");

// One byte, zero-extended (buffer_load_ubyte); 0 past num_records, as the wider loads' dwords.
RTC_ISA unsigned char buffer_load_ubyte(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so) {
  return rtc_llvm_buffer_load_b8(r, (int)vo, (int)so, 0);
}
RTC_ISA rtc_u32 buffer_load_dword(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so) {
  return rtc_llvm_buffer_load_b32(r, (int)vo, (int)so, 0);
}
RTC_ISA rtc_u32x2 buffer_load_dwordx2(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so) {
  return rtc_llvm_buffer_load_b64(r, (int)vo, (int)so, 0);
}
RTC_ISA rtc_u32x4 buffer_load_dwordx4(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so) {
  return rtc_llvm_buffer_load_b128(r, (int)vo, (int)so, 0);
}
RTC_ISA void buffer_store_dword(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so, rtc_u32 v) {
  rtc_llvm_buffer_store_b32(v, r, (int)vo, (int)so, 0);
}
RTC_ISA void buffer_store_dwordx2(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so, rtc_u32x2 v) {
  rtc_llvm_buffer_store_b64(v, r, (int)vo, (int)so, 0);
}
RTC_ISA void buffer_store_dwordx4(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so, rtc_u32x4 v) {
  rtc_llvm_buffer_store_b128(v, r, (int)vo, (int)so, 0);
}
// M0 = lds_base; lane l's dword lands at lds_base + 4*l.
RTC_ISA void buffer_load_dword_lds(rtc_buffer_rsrc r, rtc_u32 vo, rtc_u32 so, void* lds_base) {
  rtc_llvm_buffer_load_lds(r, (rtc_lds_ptr)lds_base, 4, (int)vo, (int)so, 0, 0);
}

template <class T> RTC_ISA T global_load(const T* p) { return *p; }
// s_load: a load at a uniform address, once for the wave, through the scalar cache into SGPRs. Its counter is lgkmcnt,
// so waiting for it never waits for the vector loads in flight (vmcnt counts those in order: a vector load of a page
// id would make its wait wait for every earlier data load). The constant address space tells the compiler the
// memory does not change during the kernel; a divergent address still compiles, to a vector load.
template <class T> RTC_ISA T scalar_load(const T* p) { return *(const __attribute__((address_space(4))) T*)p; }
template <class T> RTC_ISA void global_store(T* p, T v) { *p = v; }
template <class T> RTC_ISA T ds_read(const void* lds_ptr) {
  return *(const __attribute__((address_space(3))) T*)lds_ptr;
}
template <class T> RTC_ISA void ds_write(void* lds_ptr, T v) { *(__attribute__((address_space(3))) T*)lds_ptr = v; }
#endif
