// wgmma.mma_async wrappers for sm_90a: 16-bit inputs (bf16 or fp16), fp32 accumulators. SS: A (64x16) and B
// (Nx16) both K-major in shared memory; RS: A from registers, B (16 x N, N contiguous) in shared memory.
// SS for every N that is a multiple of 16 in 32..256 (K/V block rows), RS for every multiple of 32 (head-dim
// buckets); the accumulator count is R = N / 2 per thread.
#pragma once
#include "platform.h"

// Accumulator operand lists (thread t holds d[4j+2i+c] = D[16*(t/32) + (t%32)/4 + 8i][8j + 2*(t%4) + c]):
// the asm text "{%0, ..., %R-1}" from 8-operand blocks, and the "+f" constraints in the same blocks.
// clang-format off: the operand lists are laid out by hand
#define SM90_A0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define SM90_A8 "%8, %9, %10, %11, %12, %13, %14, %15"
#define SM90_A16 "%16, %17, %18, %19, %20, %21, %22, %23"
#define SM90_A24 "%24, %25, %26, %27, %28, %29, %30, %31"
#define SM90_A32 "%32, %33, %34, %35, %36, %37, %38, %39"
#define SM90_A40 "%40, %41, %42, %43, %44, %45, %46, %47"
#define SM90_A48 "%48, %49, %50, %51, %52, %53, %54, %55"
#define SM90_A56 "%56, %57, %58, %59, %60, %61, %62, %63"
#define SM90_A64 "%64, %65, %66, %67, %68, %69, %70, %71"
#define SM90_A72 "%72, %73, %74, %75, %76, %77, %78, %79"
#define SM90_A80 "%80, %81, %82, %83, %84, %85, %86, %87"
#define SM90_A88 "%88, %89, %90, %91, %92, %93, %94, %95"
#define SM90_A96 "%96, %97, %98, %99, %100, %101, %102, %103"
#define SM90_A104 "%104, %105, %106, %107, %108, %109, %110, %111"
#define SM90_A112 "%112, %113, %114, %115, %116, %117, %118, %119"
#define SM90_A120 "%120, %121, %122, %123, %124, %125, %126, %127"
#define SM90_O8(d, b) \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7])
#define SM90_ACC16_STR "{" SM90_A0 ", " SM90_A8 "}"
#define SM90_ACC16_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8)
#define SM90_ACC24_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 "}"
#define SM90_ACC24_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16)
#define SM90_ACC32_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 "}"
#define SM90_ACC32_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24)
#define SM90_ACC40_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 "}"
#define SM90_ACC40_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32)
#define SM90_ACC48_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 "}"
#define SM90_ACC48_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40)
#define SM90_ACC56_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 "}"
#define SM90_ACC56_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48)
#define SM90_ACC64_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 "}"
#define SM90_ACC64_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56)
#define SM90_ACC72_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 "}"
#define SM90_ACC72_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64)
#define SM90_ACC80_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 "}"
#define SM90_ACC80_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72)
#define SM90_ACC88_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 ", " SM90_A80 "}"
#define SM90_ACC88_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72), SM90_O8(d, 80)
#define SM90_ACC96_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 ", " SM90_A80 ", " SM90_A88 "}"
#define SM90_ACC96_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72), SM90_O8(d, 80), SM90_O8(d, 88)
#define SM90_ACC104_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 ", " SM90_A80 ", " SM90_A88 ", " SM90_A96 "}"
#define SM90_ACC104_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72), SM90_O8(d, 80), SM90_O8(d, 88), SM90_O8(d, 96)
#define SM90_ACC112_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 ", " SM90_A80 ", " SM90_A88 ", " SM90_A96 ", " SM90_A104 "}"
#define SM90_ACC112_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72), SM90_O8(d, 80), SM90_O8(d, 88), SM90_O8(d, 96), SM90_O8(d, 104)
#define SM90_ACC120_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 ", " SM90_A80 ", " SM90_A88 ", " SM90_A96 ", " SM90_A104 ", " SM90_A112 "}"
#define SM90_ACC120_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72), SM90_O8(d, 80), SM90_O8(d, 88), SM90_O8(d, 96), SM90_O8(d, 104), SM90_O8(d, 112)
#define SM90_ACC128_STR "{" SM90_A0 ", " SM90_A8 ", " SM90_A16 ", " SM90_A24 ", " SM90_A32 ", " SM90_A40 ", " SM90_A48 ", " SM90_A56 ", " SM90_A64 ", " SM90_A72 ", " SM90_A80 ", " SM90_A88 ", " SM90_A96 ", " SM90_A104 ", " SM90_A112 ", " SM90_A120 "}"
#define SM90_ACC128_OPS(d) SM90_O8(d, 0), SM90_O8(d, 8), SM90_O8(d, 16), SM90_O8(d, 24), SM90_O8(d, 32), SM90_O8(d, 40), SM90_O8(d, 48), SM90_O8(d, 56), SM90_O8(d, 64), SM90_O8(d, 72), SM90_O8(d, 80), SM90_O8(d, 88), SM90_O8(d, 96), SM90_O8(d, 104), SM90_O8(d, 112), SM90_O8(d, 120)
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

// The element type of A and B: its PTX type pair.
enum class Elem { bf16, f16 };

// D (+)= A * B^T with A (64x16, K-major) and B (Nx16, K-major) both in shared memory; accumulate = 0
// overwrites D.
template <int N, Elem E> struct WgmmaSS;
// D (+)= A * B with A (64x16) in registers (a0..a3: the mma.m16n8k16 A-fragment per warp) and B (16 rows of
// K x N columns, N contiguous: "MN-major", transposed) in shared memory.
template <int N, Elem E> struct WgmmaRS;
// D (+)= A * B with A (64 x 16, its 64 rows contiguous: "MN-major") and B (16 x N, N contiguous) both in shared
// memory: both operands transposed against WgmmaSS.
template <int N, Elem E> struct WgmmaSSMN;
// D (+)= A * B with A (64 x 16, K-major) and B (16 x N, N contiguous) both in shared memory: B transposed against
// WgmmaSS, as WgmmaRS's.
template <int N, Elem E> struct WgmmaSSBMN;
// clang-format off
#define SM90_DEFINE_SS(N, R, T, IA, IB, IP) \
  template <> struct WgmmaSS<N, Elem::T> { \
    static RTC_DEVICE void k16(float (&d)[R], rtc_u64 desc_a, rtc_u64 desc_b, int accumulate) { \
      asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #IP ", 0;\n" \
                   " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " " SM90_ACC##R##_STR \
                   ", %" #IA ", %" #IB ", p, 1, 1, 0, 0;\n}\n" \
                   : SM90_ACC##R##_OPS(d) \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate)); \
    } \
  };
#define SM90_DEFINE_SS_T(NAME, TA, N, R, T, IA, IB, IP) \
  template <> struct NAME<N, Elem::T> { \
    static RTC_DEVICE void k16(float (&d)[R], rtc_u64 desc_a, rtc_u64 desc_b, int accumulate) { \
      asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #IP ", 0;\n" \
                   " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " " SM90_ACC##R##_STR \
                   ", %" #IA ", %" #IB ", p, 1, 1, " #TA ", 1;\n}\n" \
                   : SM90_ACC##R##_OPS(d) \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate)); \
    } \
  };
#define SM90_DEFINE_RS(N, R, T, IA, IB, IC, ID, IDESC, IP) \
  template <> struct WgmmaRS<N, Elem::T> { \
    static RTC_DEVICE void k16(float (&d)[R], rtc_u32 a0, rtc_u32 a1, rtc_u32 a2, rtc_u32 a3, rtc_u64 desc_b, \
                               int accumulate) { \
      asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #IP ", 0;\n" \
                   " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " " SM90_ACC##R##_STR \
                   ", {%" #IA ", %" #IB ", %" #IC ", %" #ID "}, %" #IDESC ", p, 1, 1, 1;\n}\n" \
                   : SM90_ACC##R##_OPS(d) \
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate)); \
    } \
  };
SM90_DEFINE_SS(32, 16, bf16, 16, 17, 18)
SM90_DEFINE_SS(32, 16, f16, 16, 17, 18)
SM90_DEFINE_SS(48, 24, bf16, 24, 25, 26)
SM90_DEFINE_SS(48, 24, f16, 24, 25, 26)
SM90_DEFINE_SS(64, 32, bf16, 32, 33, 34)
SM90_DEFINE_SS(64, 32, f16, 32, 33, 34)
SM90_DEFINE_SS(80, 40, bf16, 40, 41, 42)
SM90_DEFINE_SS(80, 40, f16, 40, 41, 42)
SM90_DEFINE_SS(96, 48, bf16, 48, 49, 50)
SM90_DEFINE_SS(96, 48, f16, 48, 49, 50)
SM90_DEFINE_SS(112, 56, bf16, 56, 57, 58)
SM90_DEFINE_SS(112, 56, f16, 56, 57, 58)
SM90_DEFINE_SS(128, 64, bf16, 64, 65, 66)
SM90_DEFINE_SS(128, 64, f16, 64, 65, 66)
SM90_DEFINE_SS(144, 72, bf16, 72, 73, 74)
SM90_DEFINE_SS(144, 72, f16, 72, 73, 74)
SM90_DEFINE_SS(160, 80, bf16, 80, 81, 82)
SM90_DEFINE_SS(160, 80, f16, 80, 81, 82)
SM90_DEFINE_SS(176, 88, bf16, 88, 89, 90)
SM90_DEFINE_SS(176, 88, f16, 88, 89, 90)
SM90_DEFINE_SS(192, 96, bf16, 96, 97, 98)
SM90_DEFINE_SS(192, 96, f16, 96, 97, 98)
SM90_DEFINE_SS(208, 104, bf16, 104, 105, 106)
SM90_DEFINE_SS(208, 104, f16, 104, 105, 106)
SM90_DEFINE_SS(224, 112, bf16, 112, 113, 114)
SM90_DEFINE_SS(224, 112, f16, 112, 113, 114)
SM90_DEFINE_SS(240, 120, bf16, 120, 121, 122)
SM90_DEFINE_SS(240, 120, f16, 120, 121, 122)
SM90_DEFINE_SS(256, 128, bf16, 128, 129, 130)
SM90_DEFINE_SS(256, 128, f16, 128, 129, 130)
SM90_DEFINE_SS_T(WgmmaSSMN, 1, 32, 16, bf16, 16, 17, 18)
SM90_DEFINE_SS_T(WgmmaSSMN, 1, 32, 16, f16, 16, 17, 18)
SM90_DEFINE_SS_T(WgmmaSSMN, 1, 64, 32, bf16, 32, 33, 34)
SM90_DEFINE_SS_T(WgmmaSSMN, 1, 64, 32, f16, 32, 33, 34)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 32, 16, bf16, 16, 17, 18)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 32, 16, f16, 16, 17, 18)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 64, 32, bf16, 32, 33, 34)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 64, 32, f16, 32, 33, 34)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 96, 48, bf16, 48, 49, 50)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 96, 48, f16, 48, 49, 50)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 128, 64, bf16, 64, 65, 66)
SM90_DEFINE_SS_T(WgmmaSSBMN, 0, 128, 64, f16, 64, 65, 66)
SM90_DEFINE_RS(32, 16, bf16, 16, 17, 18, 19, 20, 21)
SM90_DEFINE_RS(32, 16, f16, 16, 17, 18, 19, 20, 21)
SM90_DEFINE_RS(64, 32, bf16, 32, 33, 34, 35, 36, 37)
SM90_DEFINE_RS(64, 32, f16, 32, 33, 34, 35, 36, 37)
SM90_DEFINE_RS(96, 48, bf16, 48, 49, 50, 51, 52, 53)
SM90_DEFINE_RS(96, 48, f16, 48, 49, 50, 51, 52, 53)
SM90_DEFINE_RS(128, 64, bf16, 64, 65, 66, 67, 68, 69)
SM90_DEFINE_RS(128, 64, f16, 64, 65, 66, 67, 68, 69)
SM90_DEFINE_RS(160, 80, bf16, 80, 81, 82, 83, 84, 85)
SM90_DEFINE_RS(160, 80, f16, 80, 81, 82, 83, 84, 85)
SM90_DEFINE_RS(192, 96, bf16, 96, 97, 98, 99, 100, 101)
SM90_DEFINE_RS(192, 96, f16, 96, 97, 98, 99, 100, 101)
SM90_DEFINE_RS(224, 112, bf16, 112, 113, 114, 115, 116, 117)
SM90_DEFINE_RS(224, 112, f16, 112, 113, 114, 115, 116, 117)
SM90_DEFINE_RS(256, 128, bf16, 128, 129, 130, 131, 132, 133)
SM90_DEFINE_RS(256, 128, f16, 128, 129, 130, 131, 132, 133)
// clang-format on
#undef SM90_DEFINE_SS
#undef SM90_DEFINE_RS
#undef SM90_DEFINE_SS_T

}  // namespace sm90
