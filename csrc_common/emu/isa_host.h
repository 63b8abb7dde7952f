// Host semantics of the wrapped gfx9 instructions, as whole-wave functions over 64 lanes' operands.
#pragma once
#include "host_math.h"
#include <stdint.h>
#include <string.h>

namespace rtc_emu {
namespace isa {

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// fp16 bits -> fp32, exactly (subnormals, Inf and NaN kept).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t u;
  if (e == 0x1Fu)
    u = sign | 0x7F800000u | (m << 13);
  else if (e != 0)
    u = sign | ((e + 112u) << 23) | (m << 13);
  else {
    const float f = (float)m * 5.9604644775390625e-8f;  // m * 2^-24: exact
    memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// The element type of an MFMA's A and B operands.
typedef float (*elem_to_f32)(uint16_t);
// Four columns of a row of an MFMA block's D (GCC / clang vector extensions: element-wise IEEE fp32 operations).
typedef float f32x4_vec __attribute__((vector_size(16)));

// D[row][0, kCols) = C[row][..] + A[row][0] B[0][..] + ... + A[row][kK - 1] B[kK - 1][..], each product and each sum
// rounded to fp32, added from k = 0 up: the scalar order of every element, four columns a vector.
template <int kCols, int kK>
inline void mfma_row(const float* a_row, const f32x4_vec (*b)[kCols / 4], f32x4_vec* acc) {
  for (int k = 0; k < kK; ++k) {
    const float a = a_row[k];
#pragma GCC unroll 8
    for (int j = 0; j < kCols / 4; ++j) acc[j] += a * b[k][j];
  }
}

// v_mfma_f32_16x16x16_bf16 / _f16 (gfx90a: ..._16x16x16bf16_1k / ..._16x16x16f16), one block, fp32 accumulation.
// Lane l, element i (0..3): A[l%16][4*(l/16)+i], B[4*(l/16)+i][l%16], C/D[4*(l/16)+i][l%16].
inline void mfma_16x16x16(const uint16_t (*a)[4], const uint16_t (*b)[4], const float (*c)[4], float (*d)[4],
                          elem_to_f32 cvt = bf16_to_f32) {
  // Each D element is C plus the 16 products added from k = 0 up, each product and sum rounded to fp32: a row of D
  // is computed as one vector over its 16 columns (the same operations per element, in the same order).
  float A[16][16];
  f32x4_vec B[16][4];
  for (int l = 0; l < 64; ++l)
    for (int i = 0; i < 4; ++i) {
      A[l % 16][4 * (l / 16) + i] = cvt(a[l][i]);
      B[4 * (l / 16) + i][l % 16 / 4][l % 4] = cvt(b[l][i]);
    }
  for (int row = 0; row < 16; ++row) {
    const int l0 = 16 * (row / 4), i = row % 4;  // D[row][col] is lane l0 + col's element i
    f32x4_vec acc[4];
    for (int col = 0; col < 16; ++col) acc[col / 4][col % 4] = c[l0 + col][i];
    mfma_row<16, 16>(A[row], B, acc);
    for (int col = 0; col < 16; ++col) d[l0 + col][i] = acc[col / 4][col % 4];
  }
}

// v_mfma_f32_32x32x8_bf16 / _f16 (gfx90a: ..._32x32x8bf16_1k / ..._32x32x8f16), one block.
// Lane l, element i (0..3): A[l%32][4*(l/32)+i], B[4*(l/32)+i][l%32];
// accumulator register r (0..15): C/D[8*(r/4) + 4*(l/32) + r%4][l%32].
inline void mfma_32x32x8(const uint16_t (*a)[4], const uint16_t (*b)[4], const float (*c)[16], float (*d)[16],
                         elem_to_f32 cvt = bf16_to_f32) {
  // As mfma_16x16x16: a row of D as one vector over its 32 columns, C plus the products from k = 0 up.
  float A[32][8];
  f32x4_vec B[8][8];
  for (int l = 0; l < 64; ++l)
    for (int i = 0; i < 4; ++i) {
      A[l % 32][4 * (l / 32) + i] = cvt(a[l][i]);
      B[4 * (l / 32) + i][l % 32 / 4][l % 4] = cvt(b[l][i]);
    }
  for (int row = 0; row < 32; ++row) {
    const int l0 = 32 * ((row % 8) / 4), r = 4 * (row / 8) + row % 4;  // D[row][col] is lane l0 + col's register r
    f32x4_vec acc[8];
    for (int col = 0; col < 32; ++col) acc[col / 4][col % 4] = c[l0 + col][r];
    mfma_row<32, 8>(A[row], B, acc);
    for (int col = 0; col < 32; ++col) d[l0 + col][r] = acc[col / 4][col % 4];
  }
}

// DPP source lane for control `ctrl` (GFX9 encoding), or -1 when the source is out of range.
inline int dpp_source(int ctrl, int lane) {
  const int row = lane & ~15, in_row = lane & 15;
  if (ctrl >= 0x000 && ctrl <= 0x0FF) return (lane & ~3) | ((ctrl >> (2 * (lane & 3))) & 3);
  if (ctrl >= 0x101 && ctrl <= 0x10F) {  // row_shl:n reads lane + n of the same row
    const int s = in_row + (ctrl & 15);
    return s < 16 ? row + s : -1;
  }
  if (ctrl >= 0x111 && ctrl <= 0x11F) {  // row_shr:n reads lane - n of the same row
    const int s = in_row - (ctrl & 15);
    return s >= 0 ? row + s : -1;
  }
  if (ctrl >= 0x121 && ctrl <= 0x12F) return row + ((in_row - (ctrl & 15)) & 15);  // row_ror
  switch (ctrl) {
    case 0x130: return lane + 1 < 64 ? lane + 1 : -1;  // wave_shl:1
    case 0x134: return (lane + 1) & 63;                // wave_rol:1
    case 0x138: return lane - 1;                       // wave_shr:1 (-1 for lane 0)
    case 0x13C: return (lane - 1) & 63;                // wave_ror:1
    case 0x140: return row + (15 - in_row);            // row_mirror
    case 0x141: return row + ((in_row & 8) | (7 - (in_row & 7)));  // row_half_mirror
    case 0x142: return row >= 16 ? row - 1 : -1;       // row_bcast:15, last lane of previous row
    case 0x143: return lane >= 32 ? 31 : -1;           // row_bcast:31
  }
  return -2;  // not a DPP control this emulator knows
}

// v_mov_b32_dpp / __builtin_amdgcn_update_dpp: lanes whose row or bank is masked off keep `old`;
// an out-of-range source gives 0 with bound_ctrl, else `old`.
inline bool dpp_mov(const uint32_t* old, const uint32_t* src, uint32_t* out, int ctrl, int row_mask, int bank_mask,
                    bool bound_ctrl) {
  for (int l = 0; l < 64; ++l) {
    const int s = dpp_source(ctrl, l);
    if (s == -2) return false;
    const bool enabled = ((row_mask >> (l / 16)) & 1) && ((bank_mask >> ((l & 15) / 4)) & 1);
    if (!enabled)
      out[l] = old[l];
    else if (s < 0)
      out[l] = bound_ctrl ? 0u : old[l];
    else
      out[l] = src[s];
  }
  return true;
}

// v_perm_b32: each result byte picks a byte of {src0 (bytes 4..7), src1 (bytes 0..3)} or a
// constant: 8..11 replicate the sign bit of bytes 1, 3, 5, 7; 12 gives 0x00; 13..255 give 0xFF.
inline uint32_t perm_b32(uint32_t src0, uint32_t src1, uint32_t sel) {
  const uint64_t data = ((uint64_t)src0 << 32) | src1;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (8 * i)) & 0xFF;
    uint32_t byte;
    if (s < 8)
      byte = (uint32_t)(data >> (8 * s)) & 0xFF;
    else if (s < 12)
      byte = ((data >> (16 * (s - 8) + 15)) & 1) ? 0xFF : 0x00;
    else
      byte = s == 12 ? 0x00 : 0xFF;
    r |= byte << (8 * i);
  }
  return r;
}

// fp32 -> fp16 bits, toward zero (v_cvt_pkrtz_f16_f32's halves): the mantissa truncated, subnormals kept (below
// 2^-24 to zero), finite values past 65504 to 65504, Inf kept, a NaN to the quiet 0x7E00 (sign kept).
inline uint32_t f32_to_f16_rtz(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;
  if (a == 0x7F800000u) return sign | 0x7C00u;
  const int e = (int)(a >> 23) - 127;
  if (e >= 16) return sign | 0x7BFFu;
  if (e >= -14) return sign | ((uint32_t)(e + 15) << 10) | ((a >> 13) & 0x3FFu);
  if (e < -24) return sign;
  return sign | (((a & 0x7FFFFFu) | 0x800000u) >> (-e - 1));  // units of 2^-24
}

// v_cvt_pk_f32_fp8 on CDNA3 (gfx940..942), one of its two codes: E4M3 FNUZ to fp32, exactly. FNUZ: bias 8, no Inf
// and no -0; 0x80 is its only NaN (given here as the quiet 0x7FC00000), exponent field 0 the subnormals m/8 x 2^-7.
inline float fp8_fnuz_to_f32(uint32_t code) {
  code &= 0xFFu;
  uint32_t u = 0x7FC00000u;
  if (code != 0x80u) {
    const uint32_t e = (code >> 3) & 0xFu, m = code & 7u;
    const float mag = e ? ldexpf(1.0f + (float)m / 8.0f, (int)e - 8) : ldexpf((float)m / 8.0f, -7);
    memcpy(&u, &mag, 4);
    u |= (code & 0x80u) << 24;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ds_swizzle_b32 offset: 0x8000|perm = quad permute (2 bits per lane of each group of 4);
// otherwise bit-mask mode inside each 32-lane half: lane' = ((lane & and) | or) ^ xor.
inline bool ds_swizzle_source(int pattern, int lane, int* src) {
  if (pattern & 0x8000) {
    if ((pattern & 0xFF00) != 0x8000) return false;  // rotate/FFT modes: not modelled
    *src = (lane & ~3) | ((pattern >> (2 * (lane & 3))) & 3);
    return true;
  }
  const int and_m = pattern & 31, or_m = (pattern >> 5) & 31, xor_m = (pattern >> 10) & 31;
  *src = (lane & 32) | ((((lane & 31) & and_m) | or_m) ^ xor_m);
  return true;
}

// Buffer resource (V#) words as gfx9 reads them: base in 48 bits, stride in bits 16..29 of
// word 1, num_records in word 2.
struct BufferDesc {
  uintptr_t base;
  uint32_t stride, num_records;
};

inline BufferDesc decode_rsrc(const uint32_t w[4]) {
  BufferDesc d;
  d.base = (uintptr_t)w[0] | ((uintptr_t)(w[1] & 0xFFFF) << 32);
  d.stride = (w[1] >> 16) & 0x3FFF;
  d.num_records = w[2];
  return d;
}

// Raw-buffer range check (stride 0): each dword of a multi-dword access is checked on its own;
// a dword is in range when offset + 4 <= num_records, offset counting voffset + soffset + imm.
inline bool dword_in_range(const BufferDesc& d, uint64_t offset) { return offset + 4 <= (uint64_t)d.num_records; }

}  // namespace isa
}  // namespace rtc_emu
