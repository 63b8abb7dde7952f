// The sm_90a decode kernel's operand fragments for mma.sync m16n8k16, per cache element (RTC_KV_DTYPE): Q's A
// fragments, K's B fragments (S = Q K^T) and V's B fragments (O += P V) from the ring's swizzled tiles, and where
// each O accumulator's column lies.
//
// bf16 / fp16 caches: ldmatrix (V: .trans) gives the fragments as they are. FP8 E4M3 and FP4 E2M1 caches: the tiles
// hold the cache's bytes and ldmatrix moves them as 16-bit pairs, so a thread gets four bytes (four FP8 values, eight
// FP4 ones) where the MMA wants 16-bit elements; they are expanded in registers, exactly (fp8x4_elems, fp4x8_elems),
// and the k and n orders they arrive in are taken as they are. FP8:
//   K: thread (g, t) of an 8 x 8 b16 matrix over 8 keys x 16 bytes gets key g's bytes 4t .. 4t + 3. The B fragment
//      wants k = 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1): k-step ks's logical k = 2t + e is FP8 column 16 ks + 4t + e
//      and k = 2t + 8 + e is column 16 ks + 4t + 2 + e. A dot product does not depend on the order of k, so Q's A
//      fragment takes the same order (q_frag: one 8-byte load of Q's row at columns 16 ks + 4t .. + 3 gives a0 and
//      a2) and S needs no transpose. One ldmatrix.x4 gives a block's two n-tiles for two k-steps.
//   V: .trans over 8 keys x 16 bytes gives thread (g, t) keys 2t, 2t + 1 (the B fragment's k) at bytes 2g, 2g + 1:
//      byte 2g is column 2g of the 16-column piece, byte 2g + 1 column 2g + 1. The even bytes make the B fragment of
//      n-tile "even" (n = g: column 2g), the odd bytes that of n-tile "odd" (column 2g + 1): a piece is two n-tiles,
//      and accumulator c of n-tile j sits at column 16 (j / 2) + 4t + 2c + (j % 2) of the warp's columns (o_col).
// FP4 (byte i of a row: columns 2i, low nibble, and 2i + 1): a 16-byte piece is 32 columns, two k-steps.
//   K: thread (g, t) gets key g's bytes 4t .. 4t + 3, columns 8t .. 8t + 7 of the piece: its first k-step takes
//      columns 8t + e (k = 2t + e) and 8t + 2 + e (k = 2t + 8 + e), its second 8t + 4 + e and 8t + 6 + e; Q's A
//      fragment of k-step ks reads columns 32 (ks / 2) + 8t + 4 (ks % 2) .. + 3. One ldmatrix.x4: four k-steps.
//   V: thread (g, t) gets keys 2t, 2t + 1 at bytes 2g, 2g + 1: columns 4g .. 4g + 3, one n-tile each (n = g is
//      column 4g + q of n-tile q of the piece); accumulator c of n-tile j is column 32 (j / 4) + 8t + 4c + (j % 4).
// tests/cpu/test_sm90_decode_fragments.py models ldmatrix, the MMA's fragment ownership and the swizzle and checks
// that these functions' index arithmetic gives Q K^T and P V exactly.
#pragma once
#include "platform.h"
#include "ptx_sm90.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90_decode/loads.h"
#include "sm90_kv_elems.h"

namespace sm90dec {

constexpr bool kFp16 = RTC_DTYPE == RTC_DTYPE_FP16;
constexpr bool kKvFp8 = RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3;
constexpr bool kKvFp4 = RTC_KV_DTYPE == RTC_KV_DTYPE_FP4_E2M1;
constexpr int kColSplit = kPlan.col_split;  // warps sharing a block, each with 1 / kColSplit of O
constexpr int kKSteps = kBucket / 16;       // k-steps of Q K^T
constexpr int kWarpCols = kBucket / kColSplit;  // O's columns a warp holds
constexpr int kAccO = kWarpCols / 2;            // O accumulators per thread: kWarpCols / 8 n-tiles of 4
// k-steps whose K fragments (both n-tiles of a block) one ldmatrix.x4 gives, and n-tiles of P V whose V fragments one
// ldmatrix.x4.trans gives: a 16-byte piece holds 8, 16 or 32 columns.
constexpr int kKGroup = 16 / kPlan.kv_bits;
constexpr int kVTiles = 2 * kKGroup;
constexpr int kKLoads = (kKSteps + kKGroup - 1) / kKGroup;  // ldmatrix.x4 per block for Q K^T
constexpr int kVLoads = (kWarpCols + 8 * kVTiles - 1) / (8 * kVTiles);  // ldmatrix.x4.trans per block for P V
// FP4 at D 32, 96, 160: the last load's pieces past the row are the box's zeros, its k-steps and n-tiles past the
// bucket are skipped. A column split's shares must be whole loads (the loads' pieces are counted from a share's).
static_assert(kColSplit == 1 || kWarpCols % (8 * kVTiles) == 0, "a column share is a whole number of V loads");

// The exact expansions of FP8 / FP4 bytes into element pairs: sm90_kv_elems.h (shared with the sm90 prefill's
// expansion stage).
using sm90kv::fp4x8_elems;
using sm90kv::fp8x4_elems;

// ---- fragments ----
// The first of the four columns of Q that thread t's a0, a2 hold at k-step ks (a quantized cache's k order).
RTC_DEVICE int q_col(int ks, int t) { return kKvFp4 ? 32 * (ks / 2) + 8 * t + 4 * (ks % 2) : 16 * ks + 4 * t; }

// Q's A fragment of k-step ks for row tile rt (rows 16 rt + g, + 8 of thread (g, t) = (lane / 4, lane % 4)). bf16 /
// fp16 caches: ldmatrix (rows 16 rt + (lane & 7) + 8 ((lane >> 3) & 1), columns 16 ks + 8 (lane >> 4)). Quantized:
// K's k order, columns q_col .. + 3 of each row: a0, a2 from row g, a1, a3 from row g + 8.
RTC_DEVICE void q_frag(rtc_u32 (&a)[4], const Smem& sm, int rt, int ks, int lane) {
  if (kKvFp8 || kKvFp4) {
    const rtc_u32 at = sm.q() + (16 * rt + lane / 4) * kRowBytes + 2 * q_col(ks, lane % 4);
    sm90::ld_shared_v2_u32(a[0], a[2], at);
    sm90::ld_shared_v2_u32(a[1], a[3], at + 8 * kRowBytes);
  } else {
    const int row = 16 * rt + (lane & 7) + ((lane >> 3) & 1) * 8, col = 16 * ks + (lane >> 4) * 8;
    sm90::ldmatrix_x4(a, sm.q() + row * kRowBytes + 2 * col);
  }
}

// K's B fragments of the k-steps kKGroup kq .. kKGroup kq + kKGroup - 1 for one 16-key block of the K tile: b[h][j]
// = (b0, b1) of k-step kKGroup kq + h, n-tile j (the block's keys 8j .. 8j + 7). `key`: the lane's row of the
// ldmatrix.x4, the block's first key + (lane & 7) + 8 (lane >> 4); its 16-byte piece 2 kq + ((lane >> 3) & 1). So
// matrix m is n-tile m / 2, piece 2 kq + m % 2: bf16 / fp16 the (b0, b1) of k-step kq; FP8 k-step 2 kq + m % 2; FP4
// k-steps 4 kq + 2 (m % 2) (bytes 0, 1 of each thread) and + 1 (bytes 2, 3).
RTC_DEVICE void k_frags(rtc_u32 (&b)[kKGroup][2][2], rtc_u32 tile, int key, int kq, int lane) {
  const int piece = 2 * kq + ((lane >> 3) & 1);
  rtc_u32 r[4];
  sm90::ldmatrix_x4(r, kv_piece(tile, piece / 8, key, piece % 8));
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (kKvFp4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rtc_u32 x[4];
        fp4x8_elems<0, 4, 1, 5, 2, 6, 3, 7>(r[2 * j + h], x);  // byte i: columns 8t + 2i, + 1
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          b[2 * h + e][j][0] = x[2 * e];
          b[2 * h + e][j][1] = x[2 * e + 1];
        }
      }
    } else if (kKvFp8) {
#pragma unroll
      for (int h = 0; h < kKGroup; ++h) fp8x4_elems<0, 1, 2, 3>(r[2 * j + h], b[h][j][0], b[h][j][1]);
    } else {
      b[0][j][0] = r[2 * j];
      b[0][j][1] = r[2 * j + 1];
    }
  }
}

// V's B fragments of one ldmatrix.x4.trans at 16-byte piece `piece` (the lane's, piece + (lane >> 4) of the load) of
// the V tile: b[j] = (b0, b1) of n-tile j. `key`: the lane's row, the block's first key + (lane & 7) +
// 8 ((lane >> 3) & 1). Matrix m holds keys 8 (m % 2) .. (b0 or b1) of piece + m / 2: bf16 / fp16 n-tile m / 2; FP8
// n-tiles 2 (m / 2) (even columns) and 2 (m / 2) + 1 (odd columns); FP4 n-tiles 4 (m / 2) + q, q = 0 .. 3 (columns
// 4g + q: byte 0's low and high nibble, byte 1's; keys 2t in bytes 0, 1, 2t + 1 in bytes 2, 3).
RTC_DEVICE void v_frags(rtc_u32 (&b)[kVTiles][2], rtc_u32 tile, int key, int piece) {
  rtc_u32 r[4];
  sm90::ldmatrix_x4_trans(r, kv_piece(tile, piece / 8, key, piece % 8));
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if (kKvFp4) {
      rtc_u32 x[4];
      fp4x8_elems<0, 2, 4, 6, 1, 3, 5, 7>(r[m], x);
#pragma unroll
      for (int q = 0; q < 4; ++q) b[4 * (m / 2) + q][m % 2] = x[q];
    } else if (kKvFp8) {
      fp8x4_elems<0, 2, 1, 3>(r[m], b[2 * (m / 2)][m % 2], b[2 * (m / 2) + 1][m % 2]);
    } else {
      b[m / 2][m % 2] = r[m];
    }
  }
}

// The column of O (of the warp's kWarpCols, from its share's first) that accumulator c (0, 1) of n-tile j holds in
// thread lane: o[4 j + 2 i + c] (row lane / 4 + 8 i).
RTC_DEVICE int o_col(int j, int c, int lane) {
  if (kKvFp4) return 32 * (j / 4) + 8 * (lane % 4) + 4 * c + (j % 4);
  return kKvFp8 ? 16 * (j / 2) + 4 * (lane % 4) + 2 * c + (j % 2) : 8 * j + 2 * (lane % 4) + c;
}

}  // namespace sm90dec
