// wgmma.mma_async wrappers for sm_90a: bf16 inputs, fp32 accumulators (SS m64nNk16, RS m64n128k16).
#pragma once
#include "platform.h"

// Accumulator operand lists (thread t holds d[4j+2i+c] = D[16*(t/32) + (t%32)/4 + 8i][8j + 2*(t%4) + c]).
// clang-format off: the operand lists and the asm text are laid out by hand
#define SM90_ACC64_STR \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, \
    %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, \
    %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, \
    %59, %60, %61, %62, %63" \
  "}"
#define SM90_ACC64_OPS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
    "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
    "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
    "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define SM90_ACC88_STR \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, \
    %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, \
    %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, \
    %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, \
    %78, %79, %80, %81, %82, %83, %84, %85, %86, %87" \
  "}"
#define SM90_ACC88_OPS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
    "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
    "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
    "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), \
    "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
    "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), \
    "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
// clang-format on

namespace sm90 {

// Shared-memory matrix descriptor: 128-byte swizzle, tile base 1024-byte aligned.
// lbo/sbo in bytes (see the PTX ISA "matrix descriptor" table).
RTC_DEVICE rtc_u64 smem_desc(rtc_u32 addr, rtc_u32 lbo, rtc_u32 sbo) {
  return (rtc_u64)((addr & 0x3FFFF) >> 4) | ((rtc_u64)((lbo >> 4) & 0x3FFF) << 16) |
         ((rtc_u64)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// The descriptor of a tile `bytes` past desc's base: the address field (bits 0..13, in 16-byte units)
// takes the offset as a 64-bit add, which ptxas issues as one uniform add per wgmma (no carry: shared
// addresses stay below 256 KiB).
RTC_DEVICE rtc_u64 desc_at(rtc_u64 desc, rtc_u32 bytes) { return desc + (bytes >> 4); }

RTC_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
RTC_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> RTC_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

// ptxas schedules a wait as if it cost nothing and hoists it to the top of its basic block, which
// put the whole softmax behind the in-flight P V GEMM (seen in the SASS). A one-trip loop on a
// condition ptxas cannot evaluate (`never` is 0 at run time) gives the wait a block of its own.
// The empty asm launders `never` at each use: otherwise, after a first pinned wait, the compiler
// knows it is 0 and dissolves the next one.
template <int N> RTC_DEVICE void wgmma_wait_pinned(int never) {
  asm volatile("" : "+r"(never));
  do {
    wgmma_wait<N>();
  } while (never);
}

// Pins accumulator registers at this point of the program, so the compiler neither reads them
// before a wgmma_wait nor moves writes across an issue.
template <int N> RTC_DEVICE void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> RTC_DEVICE void fence_regs(rtc_u32 (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// D (+)= A * B^T with A (64x16, K-major) and B (Nx16, K-major) both in shared memory, N = 128 or 176.
// accumulate = 0 overwrites D.
template <int N> struct WgmmaSS;
// clang-format off
#define SM90_DEFINE_SS(N, R, IA, IB, IP)                                                                   \
  template <> struct WgmmaSS<N> {                                                                \
    static RTC_DEVICE void k16(float (&d)[R], rtc_u64 desc_a, rtc_u64 desc_b, int accumulate) { \
      asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #IP ", 0;\n"                          \
                   " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 " SM90_ACC##R##_STR \
                   ", %" #IA ", %" #IB ", p, 1, 1, 0, 0;\n}\n"                                   \
                   : SM90_ACC##R##_OPS(d)                                                        \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                 \
    }                                                                                            \
  };
SM90_DEFINE_SS(128, 64, 64, 65, 66)  // operand numbers after the accumulators
SM90_DEFINE_SS(176, 88, 88, 89, 90)
// clang-format on
#undef SM90_DEFINE_SS

// D (+)= A * B with A (64x16 bf16) in registers (a0..a3: the mma.m16n8k16 A-fragment per warp)
// and B (16 rows of K x 128 columns, N contiguous: "MN-major", transposed) in shared memory.
RTC_DEVICE void wgmma_rs_k16_tb(float (&d)[64], rtc_u32 a0, rtc_u32 a1, rtc_u32 a2, rtc_u32 a3, rtc_u64 desc_b,
                                int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SM90_ACC64_STR
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : SM90_ACC64_OPS(d)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate));
}

}  // namespace sm90
