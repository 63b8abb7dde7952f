// Host semantics of gfx950's scaled MFMA (v_mfma_scale_f32_16x16x128_f8f6f4), as a whole-wave function over the
// 64 lanes' operands.
#pragma once
#include "host_math.h"
#include <stdint.h>
#include "fp8_fp4.h"

namespace rtc_emu {
namespace isa {

// Element e (0..31) of one lane's A or B operand (8 dwords): bits [w*e, w*e + w) of the little-endian operand,
// w = 8, 6 or 4 by format. FP4 uses dwords 0..3, FP6 dwords 0..5; the others are ignored.
inline uint32_t lp_element(const uint32_t* dwords, int fmt, int e) {
  const int w = rtc_lp_width(fmt), bit = w * e, i = bit / 32;
  uint64_t window = dwords[i];
  if (i + 1 < 8) window |= (uint64_t)dwords[i + 1] << 32;
  return (uint32_t)(window >> (bit % 32)) & ((1u << w) - 1u);
}

// One 16x16x128 block. Lane l holds, for k-block g = l / 16 (k = 32g + e, e = 0..31), row l % 16 of A and column
// l % 16 of B, and the E8M0 scale of that row / column and block (sa[l], sb[l]: the byte op_sel picked).
// C/D as the other 16x16 MFMAs: lane l, element i is [4 * (l / 16) + i][l % 16].
// D = C + sum_g 2^(sa - 127) 2^(sb - 127) sum_e A * B. Order: each block's 32 products summed in double from e = 0 up,
// scaled exactly, the four blocks added in double from g = 0 up, C added last, one rounding to f32 (exact whenever
// the exact result is an f32: every product is exact in double, and so is any sum that stays within 53 bits).
// A NaN scale (0xFF) makes its block NaN.
inline void mfma_scale_16x16x128(const uint32_t (*a)[8], const uint32_t (*b)[8], const float (*c)[4], float (*d)[4],
                                 int cbsz, int blgp, const uint8_t* sa, const uint8_t* sb) {
  double A[16][128], B[128][16];
  for (int l = 0; l < 64; ++l)
    for (int e = 0; e < 32; ++e) {
      A[l % 16][32 * (l / 16) + e] = rtc_lp_decode(cbsz, lp_element(a[l], cbsz, e));
      B[32 * (l / 16) + e][l % 16] = rtc_lp_decode(blgp, lp_element(b[l], blgp, e));
    }
  for (int l = 0; l < 64; ++l)
    for (int i = 0; i < 4; ++i) {
      const int row = 4 * (l / 16) + i, col = l % 16;
      double acc = 0.0;
      for (int g = 0; g < 4; ++g) {
        const int ea = sa[16 * g + row], eb = sb[16 * g + col];
        double dot = 0.0;
        for (int e = 0; e < 32; ++e) dot += A[row][32 * g + e] * B[32 * g + e][col];
        acc += (ea == 0xFF || eb == 0xFF) ? NAN : ldexp(dot, ea + eb - 254);
      }
      d[l][i] = (float)((double)c[l][i] + acc);
    }
}

}  // namespace isa
}  // namespace rtc_emu
