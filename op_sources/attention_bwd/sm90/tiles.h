// The sm_90a backward's shared-memory tiles: how a tile of 16-bit rows sits in shared memory (whole 64-column blocks
// of 128-byte rows, 128-byte swizzle: the 16-byte chunk c of row r at chunk c ^ (r & 7)), its cp.async loads, the
// per-row LSE and delta vectors of the DKDV stage, and the wgmma descriptors over those tiles.
#pragma once
#include "platform.h"
#include "ptx_sm90.h"
#include "wgmma_sm90.h"
#include "sm90/plan.h"

namespace bwd90 {

constexpr BwdSm90Plan kPlan = bwd_sm90_plan(RTC_HEAD_DIM_MAX);
constexpr int kD = kPlan.head_dim;
constexpr int kThreads = BWD_SM90_THREADS;
constexpr sm90::Elem kElem = RTC_DTYPE == RTC_DTYPE_FP16 ? sm90::Elem::f16 : sm90::Elem::bf16;
static_assert(kPlan.head_dim == RTC_HEAD_DIM_MAX, "the manifest's sm90 backward buckets are the plan's rows");

// Bytes between the 64-column blocks of a tile of `rows` rows.
RTC_HD constexpr int block_stride(int rows) { return rows * 128; }

// Rows [0, kRows) of a tile at `dst` (1024-byte aligned) from `src` (row stride ss elements, 16-byte aligned rows):
// rows below `valid` and columns below d (a multiple of 8) are copied, the others written as zeros; the CTA's threads
// take 16-byte chunks in order, so a warp reads whole rows. src stays a valid address for the zero chunks.
template <int kRows> RTC_DEVICE void load_tile(rtc_u32 dst, const rtc_elem_t* src, rtc_i64 ss, int valid, int d) {
  constexpr int kRowChunks = kD / 8;
  for (int i = threadIdx.x; i < kRows * kRowChunks; i += kThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks;
    const rtc_u32 at = dst + (c >> 3) * block_stride(kRows) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    const bool in = r < valid && c * 8 < d;
    sm90::cp_async_16_zfill(at, in ? src + (rtc_i64)r * ss + c * 8 : src, in ? 16u : 0u);
  }
}

// The LSE and delta of a DKDV step's 64 rows: fp32 vectors, cp.async by the first 128 threads (zeros past `valid`,
// whose rows are zeros in Q and dO: their P is 1 and dS 0, adding nothing).
RTC_DEVICE void load_row_vecs(rtc_u32 lse_dst, rtc_u32 delta_dst, const float* lse, const float* delta, int valid) {
  const int t = threadIdx.x;
  if (t < 2 * BWD_SM90_ROWS) {
    const int r = t % BWD_SM90_ROWS;
    const float* src = t < BWD_SM90_ROWS ? lse : delta;
    const rtc_u32 dst = (t < BWD_SM90_ROWS ? lse_dst : delta_dst) + r * 4;
    sm90::cp_async_4_zfill(dst, r < valid ? src + r : src, r < valid ? 4u : 0u);
  }
}

// The log2-domain LSE that P is formed with: LSE log2(e), or +inf for a row that sees no key (LSE -inf), so that
// exp2(s - it) is 0.
RTC_DEVICE float lse_log2(float lse) {
  const float inf = rtc_bits_f32(0x7F800000u);
  return lse != -inf ? lse * bwd::kLog2e : inf;
}

// A two-slot ring of copies, step t in slot t % 2, with no CTA-wide barrier: full(i) completes a phase when every
// thread's copies of the slot's step have landed (cp.async's arrive), empty(i) when every thread has read it (its
// GEMMs done). A warpgroup may run a step ahead of the other: one's exponentials under the other's GEMMs.
struct Ring {
  rtc_u32 bars;  // full[0], full[1], empty[0], empty[1], 8 bytes each
  RTC_DEVICE rtc_u32 full(int i) const { return bars + 8 * i; }
  RTC_DEVICE rtc_u32 empty(int i) const { return bars + 16 + 8 * i; }
  RTC_DEVICE void init() const {
    if (threadIdx.x == 0) {
      for (int i = 0; i < 2; ++i) {
        sm90::mbar_init(full(i), kThreads);
        sm90::mbar_init(empty(i), kThreads);
      }
      sm90::mbar_init_fence();
    }
    __syncthreads();
  }
  // Before this thread's copies of step t: the slot's step t - 2 is read by every thread.
  RTC_DEVICE void acquire(int t) const {
    if (t >= 2) sm90::mbar_wait(empty(t & 1), ((t >> 1) - 1) & 1);
  }
  // After them (and any copy issued before, which lands with them).
  RTC_DEVICE void filled(int t) const { sm90::cp_async_mbar_arrive_noinc(full(t & 1)); }
  // Before reading step t: every copy landed, then ordered before wgmma's (async-proxy) reads.
  RTC_DEVICE void wait(int t) const {
    sm90::mbar_wait(full(t & 1), (t >> 1) & 1);
    sm90::fence_proxy_async_smem();
  }
  RTC_DEVICE void release(int t) const { sm90::mbar_arrive(empty(t & 1)); }
  // Filled by plain stores instead of copies: after this thread's stores of step t, fenced for the async proxy.
  RTC_DEVICE void stored(int t) const {
    sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(full(t & 1));
  }
};

// acc = A B^T over the bucket's kD columns: A this warpgroup's 64 rows of a tile (its row 0 at a_rows, blocks
// a_blk bytes apart), B kN rows of another (b_rows, b_blk), both K-major; kD / 16 steps of 16 columns, 32 bytes
// inside a 128-byte row, the next 64-column block after 4.
template <int kN>
RTC_DEVICE void issue_ss(float (&acc)[kN / 2], rtc_u32 a_rows, int a_blk, rtc_u32 b_rows, int b_blk) {
  const rtc_u64 da = sm90::smem_desc(a_rows, 16, 1024), db = sm90::smem_desc(b_rows, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const rtc_u32 off = (kk & 3) * 32;
    sm90::WgmmaSS<kN, kElem>::k16(acc, sm90::desc_at(da, (kk >> 2) * a_blk + off),
                                  sm90::desc_at(db, (kk >> 2) * b_blk + off), kk > 0);
  }
}

// acc += A B with A (64 x kK) in registers (a: the packed accumulator of the GEMM before, 4 words a 16-column step)
// and B kK rows of kN columns of a tile, read "MN-major" (columns contiguous: LBO the 64-column blocks' stride, SBO
// 8 rows): b_cols is the tile's address at its first row and the first of the kN columns (a 64-column block's start).
template <int kN, int kK>
RTC_DEVICE void issue_rs(float (&acc)[kN / 2], const rtc_u32 (&a)[kK / 4], rtc_u32 b_cols, int b_blk) {
  const rtc_u64 db = sm90::smem_desc(b_cols, b_blk, 1024);
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    sm90::WgmmaRS<kN, kElem>::k16(acc, a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3],
                                  sm90::desc_at(db, kk * 2048), 1);
}

// acc += A B with A 64 rows of a tile of one 64-column block (a_rows: its row 0; K-major, kK <= 64 columns) and B
// as issue_rs's (kK rows of kN columns read MN-major): A from shared memory instead of registers.
template <int kN, int kK>
RTC_DEVICE void issue_ss_bmn(float (&acc)[kN / 2], rtc_u32 a_rows, rtc_u32 b_cols, int b_blk) {
  static_assert(kK <= 64, "A is one 64-column block");
  const rtc_u64 da = sm90::smem_desc(a_rows, 16, 1024), db = sm90::smem_desc(b_cols, b_blk, 1024);
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    sm90::WgmmaSSBMN<kN, kElem>::k16(acc, sm90::desc_at(da, kk * 32), sm90::desc_at(db, kk * 2048), 1);
}

}  // namespace bwd90
