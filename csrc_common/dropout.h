// Dropout's keep mask (the manifest's dropout axis, RTC_DROPOUT): a pure function of the call's (seed, offset) and
// the element's (b, h, i, j), so that the forward and the backward regenerate the same mask without storing it and
// every kernel, tile order and split gives the same one (docs/numerics.md, "Dropout").
//
//   Philox4x32-10 (Salmon et al., SC'11), key = seed (low word first), one call per block of 2 rows x 4 keys:
//   rows {i, i + 8} of a 16-row group (i % 16 < 8), keys {j, j + 1, j + 8, j + 9} of a 16-key group (j % 16 even,
//   < 8). Counter = (low and high word of offset + 4 (j / 16) + (j % 8) / 2, 8 (i / 16) + i % 8, b * heads + h).
//   Its four 32-bit outputs are eight 16-bit halves: element (i, j) takes half 4 ((j / 8) % 2) + 2 ((i / 8) % 2) +
//   j % 2 (output (j / 8) % 2 * 2 + (i / 8) % 2, its low half for an even j).
//   The element is kept when that half is at least the threshold round(p * 65536): the keep probability is
//   1 - threshold / 65536, within 2^-17 of 1 - p.
//
// The block is what one thread of an sm_90a wgmma accumulator holds of a 16 x 16 tile of S (rows r, r + 8; columns
// 2t, 2t + 1, 2t + 8, 2t + 9), in the order of its registers: the forward draws its fragment with no call wasted and
// no exchange, and the backward's S^T fragments (keys r, r + 8; rows in pairs) use four halves of each call.
// b is the batch row (dense) or the sequence (packed), h the query head, i and j the row and key within the sequence.
// Kept elements of P are scaled by 1 / (1 - p) in fp32 before their rounding for P V (scale, below).
#pragma once
#include "attn_params.h"

#ifndef RTC_DROPOUT
#define RTC_DROPOUT 0  // the manifest's dropout axis: 0 off, 1 on
#endif

struct Philox4 {
  rtc_u32 v[4];
};

// A key word's bump between rounds. On NVIDIA an opaque add: ptxas otherwise computes the ten round keys once for
// every call of a fragment and holds all twenty across them, registers the sm_90a kernels' accumulators need.
#if defined(RTC_NVIDIA) && defined(__CUDA_ARCH__)
#define philox_bump(k, c) asm volatile("add.u32 %0, %0, %1;" : "+r"(k) : "n"(c))
#else
#define philox_bump(k, c) ((k) += (c))
#endif

// Philox4x32-10 of counter c under key k: ten rounds of two 32x32 -> 64-bit products, the key bumped by the Weyl
// constants between rounds (Random123's constants).
RTC_HD Philox4 philox4x32_10(rtc_u32 c0, rtc_u32 c1, rtc_u32 c2, rtc_u32 c3, rtc_u32 k0, rtc_u32 k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      philox_bump(k0, 0x9E3779B9u);
      philox_bump(k1, 0xBB67AE85u);
    }
    const rtc_u64 p0 = (rtc_u64)0xD2511F53u * c0, p1 = (rtc_u64)0xCD9E8D57u * c2;
    const rtc_u32 n0 = (rtc_u32)(p1 >> 32) ^ c1 ^ k0, n2 = (rtc_u32)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = (rtc_u32)p1;
    c2 = n2;
    c3 = (rtc_u32)p0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The call's generator state, read once by a kernel from p.rng_state (int64 [2]: seed, offset).
struct DropoutState {
  rtc_u64 seed, offset;
};

// The eight 16-bit draws of the block of row i and key j (any element of it): one Philox call.
RTC_HD Philox4 dropout_draws(const DropoutState& s, int heads, int b, int h, rtc_i64 i, rtc_i64 j) {
  const rtc_u64 ctr = s.offset + (rtc_u64)(4 * (j >> 4) + ((j & 7) >> 1));
  return philox4x32_10((rtc_u32)ctr, (rtc_u32)(ctr >> 32), (rtc_u32)(8 * (i >> 4) + (i & 7)),
                       (rtc_u32)((rtc_i64)b * heads + h), (rtc_u32)s.seed, (rtc_u32)(s.seed >> 32));
}

// Which 16-bit half of its block's draws element (i, j) takes: 0 .. 7, the low half of output (half / 2) when even.
RTC_HD int dropout_half(rtc_i64 i, rtc_i64 j) { return (int)(4 * ((j >> 3) & 1) + 2 * ((i >> 3) & 1) + (j & 1)); }

// Whether half `half` of the block's draws d is kept.
RTC_HD bool dropout_kept(const Philox4& d, int half, rtc_u32 threshold) {
  const rtc_u32 w = d.v[half >> 1];
  return ((half & 1) ? (w >> 16) : (w & 0xFFFFu)) >= threshold;
}

// The same rule for both halves of a draw word at once (the sm_90a forward's form: its packed P holds an element a
// half, in the draw's order). A half is kept when its high bit is above the threshold's, or equal to it with its low
// 15 bits at least the threshold's: bit 15 of the half of (d | 0x8000) - (the threshold's low 15 bits), no borrow
// crossing the halves. The threshold 65536 (p within 2^-17 of 1: nothing kept) is held as 0xFFFF with 0x8000 for its
// low bits, which no half reaches.
struct KeepHalves {
  rtc_u32 th, tl;  // the threshold's 16 bits in both halves; its low 15 bits in both
  RTC_HD static KeepHalves of(rtc_u32 threshold) {
    return threshold > 0xFFFFu ? KeepHalves{0xFFFFFFFFu, 0x80008000u}
                               : KeepHalves{threshold * 0x10001u, (threshold & 0x7FFFu) * 0x10001u};
  }
  // Bit 15 and bit 31: whether the low and the high half of d is kept (the other bits are not defined).
  RTC_HD rtc_u32 kept_bits(rtc_u32 d) const {
    const rtc_u32 low_ge = (d | 0x80008000u) - tl;
    return (d & ~th) | (~(d ^ th) & low_ge);
  }
  // 0xFFFF over each kept half of d, 0 over each dropped one.
  RTC_HD rtc_u32 mask(rtc_u32 d) const {
    const rtc_u32 k = kept_bits(d);
#if defined(RTC_NVIDIA) && defined(__CUDA_ARCH__)
    rtc_u32 m;  // PRMT: bytes 0-1 the sign of byte 1 (bit 15), bytes 2-3 the sign of byte 3 (bit 31)
    asm("prmt.b32 %0, %1, 0, 0xBB99;" : "=r"(m) : "r"(k));
    return m;
#else
    return ((k >> 15) & 0x10001u) * 0xFFFFu;
#endif
  }
};

// The keep bit of one element (a Philox call of its own: the portable kernels' form).
RTC_HD bool dropout_keep(const DropoutState& s, rtc_u32 threshold, int heads, int b, int h, rtc_i64 i, rtc_i64 j) {
  return dropout_kept(dropout_draws(s, heads, b, h, i, j), dropout_half(i, j), threshold);
}
