// gfx942 kernel data placement: uniform buffer resources, the K tile's XOR swizzle in LDS, the V^T fragment layout,
// the LDS map, a wave's registers, and the q rows of a work item.
#pragma once
#include "platform.h"
#include "isa_gfx9.h"
#include "gfx942/params.h"

namespace g942 {

constexpr int kWaves = 8;
constexpr int kTilesPerWave = 3;     // q tiles of 16 rows: two in VGPRs, the third in LDS
constexpr int kDSteps = 8;           // 128 / 16: k-steps of one QK MFMA chain
constexpr int kSub = 4;              // 16-row kv sub-tiles per 64-row block
constexpr int kHdTiles = 8;          // 128 / 16 output tiles of PV
constexpr int kKRowDwords = 64;      // 256-byte K row
constexpr float kNegMax = -3.402823466e38f;  // initial running max: finite, so never Inf - Inf
constexpr float kNegInf = -__builtin_inff();  // masked scores

// LDS: exactly 64 KiB. K double buffer (2 x 64 rows x 256 B) + each wave's third Q tile
// (8 k-steps x 64 lanes x 8 B, lane order). The companion stages reuse the same bytes.
struct AttnSmem {
  rtc_u32 k[2][GFX942_KV_ROWS * kKRowDwords];
  rtc_bf16x4 q3[kWaves][kDSteps][64];
};
union Smem {
  AttnSmem attn;
  rtc_u32 vt[GFX942_KV_ROWS * kKRowDwords];  // V transpose staging, row-major [64][64 dwords]
};

// Registers of one wave: O^T accumulators, scores, P, two Q tiles.
struct Acc {
  rtc_f32x4 o[kTilesPerWave][kHdTiles];
  rtc_f32x4 s[kTilesPerWave][kSub];
  rtc_bf16x4 p[kTilesPerWave][kSub];
  rtc_bf16x4 q[2][kDSteps];
};

// Buffer resources must live in SGPRs: readfirstlane makes every word provably uniform.
RTC_DEVICE rtc_buffer_rsrc uniform_rsrc(const void* base, rtc_i64 bytes) {
  const rtc_u32 n = bytes > 0xFFFFFFFFll ? 0xFFFFFFFFu : (rtc_u32)(bytes < 0 ? 0 : bytes);
  rtc_buffer_rsrc r = make_buffer_rsrc(base, n);
  for (int i = 0; i < 4; ++i) r[i] = (int)readfirstlane((rtc_u32)r[i]);
  return r;
}

// Bytes a [rows, 128] bf16 view with row stride `ss` (elements) spans from its first element.
RTC_DEVICE rtc_i64 rows_span_bytes(int rows, rtc_i64 ss) {
  return rows <= 0 ? 0 : ((rtc_i64)(rows - 1) * ss + GFX942_HEAD_DIM) * 2;
}

// K XOR swizzle. In LDS, 8-byte unit u of row r holds global unit u ^ (r & 15): the DMA writes
// lane L's dword at M0 + 4L, so the swizzle is applied to the global source address instead.
// Reading the A fragment (row = lane%16 of a sub-tile, units 4*dstep + quad) then hits 16
// different units per quad: no bank conflicts where the plain layout had 16-way ones.
RTC_DEVICE rtc_u32 k_dma_src_byte(int lane, int row) {
  return (rtc_u32)(((((lane >> 1) ^ (row & 15))) << 3) | ((lane & 1) << 2));
}
// Byte offset in AttnSmem::k of the A fragment (kv row sub*16 + lane%16, d = 16*dstep + 4*quad..+3).
RTC_DEVICE rtc_u32 k_frag_byte(int buf, int sub, int dstep, int lane) {
  const int row = sub * 16 + (lane & 15), unit = (dstep * 4 + (lane >> 4)) ^ (lane & 15);
  return (rtc_u32)(((buf * GFX942_KV_ROWS + row) * kKRowDwords + unit * 2) * 4);
}

// V^T workspace, per (b, h) nkb blocks of 16 KiB. Chunk c = (t*2 + sp)*64 + lane holds 16 bytes:
// V[kv = 16*(2sp+s2) + 4*(lane/16) + i][hd = 16t + lane%16] for s2 = 0..1, i = 0..3 — the PV A
// fragments of hd tile t and kv sub-tiles 2sp, 2sp+1. One coalesced dwordx4 per lane.
RTC_DEVICE rtc_u32 vt_chunk_byte(int t, int sp, int lane) { return (rtc_u32)((((t * 2 + sp) << 6) + lane) << 4); }

// First q row of work item `item` (item = bh * nqb + qb): under a mask the q blocks of a head go in
// descending order, longest first, since the last rows see the most keys (bottom-right alignment).
RTC_DEVICE int item_q0(const Gfx942Params& p, int item) {
  const int qb = item % p.nqb;
  return (RTC_MASK ? p.nqb - 1 - qb : qb) * GFX942_Q_ROWS;
}

RTC_DEVICE rtc_bf16x4 as_bf16x4(rtc_u32 lo, rtc_u32 hi) {
  const rtc_u32x2 w = {lo, hi};
  return __builtin_bit_cast(rtc_bf16x4, w);
}

}  // namespace g942
