// Dropout's keep mask (the manifest's dropout axis, RTC_DROPOUT): a pure function of the call's (seed, offset) and
// the element's (b, h, i, j), so that the forward and the backward regenerate the same mask without storing it and
// every kernel, tile order and split gives the same one (docs/numerics.md, "Dropout").
//
//   Philox4x32-10 (Salmon et al., SC'11), key = seed (low word first), counter = (low and high word of
//   offset + j / 8, i, b * heads + h): four 32-bit outputs, eight 16-bit halves; key j takes half j % 8 (output
//   (j % 8) / 2, its low half for an even j). The element is kept when that half is at least the threshold
//   round(p * 65536): the keep probability is 1 - threshold / 65536, within 2^-17 of 1 - p.
//
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

// Philox4x32-10 of counter c under key k: ten rounds of two 32x32 -> 64-bit products, the key bumped by the Weyl
// constants between rounds (Random123's constants).
RTC_HD Philox4 philox4x32_10(rtc_u32 c0, rtc_u32 c1, rtc_u32 c2, rtc_u32 c3, rtc_u32 k0, rtc_u32 k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
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

// The eight 16-bit draws of keys 8 g .. 8 g + 7 of row i of (b, h): one Philox call.
RTC_HD Philox4 dropout_draws(const DropoutState& s, int heads, int b, int h, rtc_i64 i, rtc_i64 g) {
  const rtc_u64 ctr = s.offset + (rtc_u64)g;
  return philox4x32_10((rtc_u32)ctr, (rtc_u32)(ctr >> 32), (rtc_u32)i, (rtc_u32)((rtc_i64)b * heads + h),
                       (rtc_u32)s.seed, (rtc_u32)(s.seed >> 32));
}

// Whether key j (of its group of eight's draws d) is kept.
RTC_HD bool dropout_kept(const Philox4& d, rtc_i64 j, rtc_u32 threshold) {
  const rtc_u32 w = d.v[(j >> 1) & 3];
  return ((j & 1) ? (w >> 16) : (w & 0xFFFFu)) >= threshold;
}

// The keep bit of one element (a Philox call of its own: the portable kernels' form).
RTC_HD bool dropout_keep(const DropoutState& s, rtc_u32 threshold, int heads, int b, int h, rtc_i64 i, rtc_i64 j) {
  return dropout_kept(dropout_draws(s, heads, b, h, i, j >> 3), j, threshold);
}
