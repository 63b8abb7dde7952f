// sm_90a PTX wrappers used by the Hopper kernels: mbarrier, TMA, shared-memory loads and stores, read-only loads,
// cp.async, ldmatrix and mma.sync, named barriers, setmaxnreg, fences.
#pragma once
#include "platform.h"

namespace sm90 {

RTC_DEVICE rtc_u32 smem_addr(const void* p) { return static_cast<rtc_u32>(__cvta_generic_to_shared(p)); }

// ---- mbarrier (shared::cta, 64-bit object) ----
RTC_DEVICE void mbar_init(rtc_u32 bar, rtc_u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) before any copy signals them.
RTC_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
RTC_DEVICE void mbar_arrive(rtc_u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
RTC_DEVICE void mbar_expect_tx(rtc_u32 bar, rtc_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Spins until the phase of the given parity has completed. A C++ loop, because labels inside
// inline asm would be duplicated wherever this is inlined.
RTC_DEVICE void mbar_wait(rtc_u32 bar, rtc_u32 parity) {
  rtc_u32 done;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}

// ---- TMA: one 4-D tile (d, s, h, b) into shared memory, completion counted on an mbarrier ----
RTC_DEVICE void tma_load_4d(rtc_u32 dst, const void* tmap, rtc_u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
               "l"(reinterpret_cast<rtc_u64>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}
RTC_DEVICE void tma_prefetch_desc(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<rtc_u64>(tmap)) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (wgmma, TMA).
RTC_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- shared memory by address (shared::cta window), and cp.async into it ----
RTC_DEVICE void st_shared_u32(rtc_u32 addr, rtc_u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
RTC_DEVICE rtc_u32 ld_shared_u32(rtc_u32 addr) {
  rtc_u32 v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
RTC_DEVICE void st_shared_u8(rtc_u32 addr, rtc_u32 v) {
  asm volatile("st.shared.u8 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
// 2 bytes (2-byte aligned), zero-extended.
RTC_DEVICE rtc_u32 ld_shared_u16(rtc_u32 addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
  return v;
}
// 8 bytes (8-byte aligned) as two words, the lower address in x.
RTC_DEVICE void ld_shared_v2_u32(rtc_u32& x, rtc_u32& y, rtc_u32 addr) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(x), "=r"(y) : "r"(addr) : "memory");
}
// 16 bytes: v in each of the four words.
RTC_DEVICE void st_shared_v4_splat(rtc_u32 addr, rtc_u32 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(v) : "memory");
}
// 4 bytes of global memory that the kernel never writes, through the non-coherent path. Volatile, so the
// load issues where the source puts it; only the first use of the value waits for it.
RTC_DEVICE int ld_global_nc_s32(const int* src) {
  int v;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(src) : "memory");
  return v;
}
// The same for one byte, zero-extended.
RTC_DEVICE rtc_u32 ld_global_nc_u8(const unsigned char* src) {
  unsigned short v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(src) : "memory");
  return v;
}

// dst[0..3] += x, y, z, w as one vector reduction in L2 (no value returned; 16-byte aligned dst).
RTC_DEVICE void red_add_v4_f32(float* dst, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
// 16 bytes of global memory as four floats, stored.
RTC_DEVICE void st_global_v4_f32(float* dst, float x, float y, float z, float w) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
// 16 bytes of global memory as four floats, loaded.
RTC_DEVICE void ld_global_v4_f32(float (&v)[4], const float* src) {
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "l"(src)
               : "memory");
}

RTC_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits for every cp.async of this thread, committed or not.
RTC_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// 16 bytes global -> shared, asynchronous, through L2 only (cg), asking L2 to fetch the 128-byte line around it (a
// row's other pieces follow); src_bytes 0 reads nothing and writes zeros (a row past the tensor: src must still be a
// valid address, any byte of the tensor).
RTC_DEVICE void cp_async_16_zfill(rtc_u32 dst, const void* src, rtc_u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// 4 bytes global -> shared, asynchronous (through L1: ca, the only form below 16 bytes); src_bytes 0 writes zeros.
RTC_DEVICE void cp_async_4_zfill(rtc_u32 dst, const void* src, rtc_u32 src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// An arrive on the mbarrier once every cp.async this thread issued before it has landed; noinc: the barrier's expected
// count includes this arrive (mbarrier.init's count).
RTC_DEVICE void cp_async_mbar_arrive_noinc(rtc_u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Waits until at most N of this thread's committed cp.async groups are pending.
template <int N> RTC_DEVICE void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// ---- ldmatrix: four 8x8 matrices of 16-bit elements, lanes 8i..8i+7 giving the row addresses of matrix i ----
RTC_DEVICE void ldmatrix_x4(rtc_u32 (&r)[4], rtc_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// The same, each matrix transposed (a row-major [k][n] tile as the column-major B operand).
RTC_DEVICE void ldmatrix_x4_trans(rtc_u32 (&r)[4], rtc_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// ---- mma.sync m16n8k16, fp32 accumulators: d += a b, a and b bf16 (fp16 when kFp16) ----
template <bool kFp16>
RTC_DEVICE void mma_16816(float (&d)[4], const rtc_u32 (&a)[4], rtc_u32 b0, rtc_u32 b1) {
  if (kFp16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9},"
        " {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9},"
        " {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- named barriers (id 0 is __syncthreads) ----
RTC_DEVICE void named_sync(int id, int threads) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory"); }
RTC_DEVICE void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// One lane of the whole (converged) warp: true in it, false in the others (elect.sync). Where a lane-0 test would keep
// the lane index live in a register, this keeps nothing.
RTC_DEVICE bool elect_one() {
  rtc_u32 r;
  asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(r));
  return r != 0;
}

// ---- register reallocation between warpgroup roles ----
template <int N> RTC_DEVICE void regs_grow() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> RTC_DEVICE void regs_shrink() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }

// ---- packed bits and conversions ----
// PRMT (default mode): byte n of the result is byte (sel >> 4n) & 7 of {b, a} (a: bytes 0-3), or, with bit 3 of that
// nibble set, that byte's sign bit replicated over 8 bits.
RTC_DEVICE rtc_u32 prmt(rtc_u32 a, rtc_u32 b, rtc_u32 sel) {
  rtc_u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// The two FP8 E4M3 bytes in the low half of x as an f16x2 pair (the low byte in the low half), exactly (sm_89+).
RTC_DEVICE rtc_u32 cvt_f16x2_e4m3x2(rtc_u32 x) {
  rtc_u32 d;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(d) : "r"(x));
  return d;
}
// Two fp32 values as an f16x2 pair (lo in the low half), each rounded to nearest even (past 65504 to Inf, NaN kept).
RTC_DEVICE rtc_u32 cvt_f16x2_f32(float lo, float hi) {
  rtc_u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// a * b + c on fp16 pairs, rounded to nearest even; subnormal inputs and results are kept (no .ftz).
RTC_DEVICE rtc_u32 fma_f16x2(rtc_u32 a, rtc_u32 b, rtc_u32 c) {
  rtc_u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// a * b + c on bf16 pairs, rounded to nearest even; subnormal inputs and results are kept (bf16 has no .ftz).
RTC_DEVICE rtc_u32 fma_bf16x2(rtc_u32 a, rtc_u32 b, rtc_u32 c) {
  rtc_u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// ---- math ----
// 2^x on the SFU; ex2(-inf) = +0 and NaN stays NaN, which the softmax relies on.
RTC_DEVICE float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1 / x on the SFU (MUFU.RCP): relative error within 1 ulp; rcp(+-inf) = +-0, rcp(+-0) = +-inf, NaN stays NaN; a
// subnormal input or result flushes to zero.
RTC_DEVICE float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// A value every lane of the warp holds alike, made visibly so to ptxas (a broadcast from lane 0):
// what is computed from it stays in uniform registers (wgmma descriptors: no R2UR per issue).
RTC_DEVICE int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }
// threadIdx.x read where it is used (a volatile read the compiler neither hoists nor keeps live): for a value
// derived from it once per tile, where a register held across the tile loop would be spilled.
RTC_DEVICE int tid_x_here() {
  int v;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
  return v;
}
RTC_DEVICE float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

}  // namespace sm90
