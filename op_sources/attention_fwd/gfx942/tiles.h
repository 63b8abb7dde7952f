// gfx942 kernel data placement: uniform buffer resources, the K tile's XOR swizzle in LDS, the V^T fragment layout,
// the LDS map, a wave's registers, and the q rows of a work item.
#pragma once
#include "platform.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "gfx942/params.h"

namespace g942 {

// The shape of this build: a head-dim bucket (params.h) and what it decides (docs/NOTES.md, "gfx942 per head-dim
// bucket"). Only the call's D columns of a bucket are real; the rest are zeros in registers and LDS.
constexpr int kBucket = RTC_HEAD_DIM_MAX;
constexpr int kWaves = 8;
constexpr int kTilesPerWave = gfx942_tiles_per_wave(kBucket);  // q tiles of 16 rows
constexpr int kRowsPerWave = 16 * kTilesPerWave;
constexpr int kQRows = gfx942_q_rows(kBucket);                   // q rows of a work item
// Q tiles in LDS: at 128 the third (MoonMath's layout: 3 tiles in VGPRs do not fit beside O); below 128 every
// tile fits in VGPRs, and above it the K double buffer takes all 64 KiB of LDS.
constexpr int kQLdsTiles = kBucket == 128 ? 1 : 0;
constexpr int kQRegTiles = kTilesPerWave - kQLdsTiles;
constexpr int kDSteps = kBucket / 16;   // k-steps of one QK MFMA chain
constexpr int kSub = 4;                 // 16-row kv sub-tiles per 64-row block
constexpr int kHdTiles = kBucket / 16;  // output tiles of PV
// K rows in LDS are kKPitch elements apart (a power of two, so the XOR swizzle below stays inside a row and one
// DMA of 64 dwords covers whole rows or half rows): 96 and 192 take the next pitch, their last columns zeros.
constexpr int kKPitch = kBucket <= 64 ? 64 : kBucket <= 128 ? 128 : 256;
constexpr int kKRowDwords = kKPitch / 2;
constexpr int kKDmaPerWave = 16 * kKRowDwords / 64;  // one block's DMAs per wave of group B (16 rows each)
constexpr int kVtBlockBytes = (int)gfx942_vt_block_bytes(kBucket);
constexpr long long kPartBytes = gfx942_part_bytes(kBucket);
// Ring depths: loads are issued this many steps ahead minus one, so that about 6 MFMAs per tile hide each
// V^T chunk (L1) and 3 each K step (LDS) whatever the tiles per wave.
constexpr int kVRing = 1 + 6 / kTilesPerWave;  // 3, 4, 7
constexpr int kKRing = 1 + 3 / kTilesPerWave;  // 2, 2, 4
constexpr float kNegMax = -3.402823466e38f;  // initial running max: finite, so never Inf - Inf
constexpr float kNegInf = -__builtin_inff();  // masked scores

// The MFMA operand type of the element type (RTC_DTYPE): raw bits, 4 per lane.
#if RTC_DTYPE == RTC_DTYPE_FP16
typedef rtc_f16x4 Frag;
#else
typedef rtc_bf16x4 Frag;
#endif

// LDS, at most 64 KiB: the K double buffer (2 x 64 rows x kKPitch x 2 bytes) and, at 128, each wave's third Q
// tile (8 k-steps x 64 lanes x 8 B, lane order; a zero-length array elsewhere). The companion stages reuse the
// same bytes.
struct AttnSmem {
  rtc_u32 k[2][GFX942_KV_ROWS * kKRowDwords];
  Frag q3[kWaves * kQLdsTiles][kDSteps][64];
};
union Smem {
  AttnSmem attn;
  rtc_u32 vt[GFX942_KV_ROWS * kBucket / 2];  // V transpose staging, row-major [64][bucket / 2 dwords]
};
static_assert(sizeof(Smem) <= 64 * 1024, "the gfx942 kernel's LDS is at most 64 KiB");

// Registers of one wave: O^T accumulators, scores, P, the Q tiles held in VGPRs.
struct Acc {
  rtc_f32x4 o[kTilesPerWave][kHdTiles];
  rtc_f32x4 s[kTilesPerWave][kSub];
  Frag p[kTilesPerWave][kSub];
  Frag q[kQRegTiles][kDSteps];
};

// Buffer resources must live in SGPRs: readfirstlane makes every word provably uniform.
RTC_DEVICE rtc_buffer_rsrc uniform_rsrc(const void* base, rtc_i64 bytes) {
  const rtc_u32 n = bytes > 0xFFFFFFFFll ? 0xFFFFFFFFu : (rtc_u32)(bytes < 0 ? 0 : bytes);
  rtc_buffer_rsrc r = make_buffer_rsrc(base, n);
  for (int i = 0; i < 4; ++i) r[i] = (int)readfirstlane((rtc_u32)r[i]);
  return r;
}

// Bytes a [rows, d] view of 16-bit elements with row stride `ss` (elements) spans from its first element.
RTC_DEVICE rtc_i64 rows_span_bytes(int rows, rtc_i64 ss, int d) {
  return rows <= 0 ? 0 : ((rtc_i64)(rows - 1) * ss + d) * 2;
}

// K XOR swizzle. In LDS, 8-byte unit u of row r holds global unit u ^ (r & 15): the DMA writes
// lane L's dword at M0 + 4L, so the swizzle is applied to the global source address instead.
// Reading the A fragment (row = lane%16 of a sub-tile, units 4*dstep + quad) then hits 16
// different units per quad: no bank conflicts where the plain layout had 16-way ones. The XOR moves a
// unit inside its aligned group of 16 (64 elements), so a row of kKPitch elements maps onto itself.
// Dword w of LDS row `row` comes from byte k_dma_src_byte(w, row) of the global row: w's own byte with its unit
// XOR-ed by row & 15 (bits 3..6 of the byte; bits 0..2 hold no unit).
RTC_DEVICE rtc_u32 k_dma_src_byte(int w, int row) {
  return (rtc_u32)((w >> 1) << 3 | (w & 1) << 2) ^ ((row & 15) << 3);
}
// Byte offset in AttnSmem::k of the A fragment (kv row sub*16 + lane%16, d = 16*dstep + 4*quad..+3).
RTC_DEVICE rtc_u32 k_frag_byte(int buf, int sub, int dstep, int lane) {
  const int row = sub * 16 + (lane & 15), unit = (dstep * 4 + (lane >> 4)) ^ (lane & 15);
  return (rtc_u32)(((buf * GFX942_KV_ROWS + row) * kKRowDwords + unit * 2) * 4);
}

// V^T workspace, per (b, h) nkb blocks of kVtBlockBytes. Chunk c = (t*2 + sp)*64 + lane holds 16 bytes:
// V[kv = 16*(2sp+s2) + 4*(lane/16) + i][hd = 16t + lane%16] for s2 = 0..1, i = 0..3 — the PV A
// fragments of hd tile t and kv sub-tiles 2sp, 2sp+1. One coalesced dwordx4 per lane.
RTC_DEVICE rtc_u32 vt_chunk_byte(int t, int sp, int lane) { return (rtc_u32)((((t * 2 + sp) << 6) + lane) << 4); }

// First q row of work item `item` (item = bh * nqb + qb): under a mask the q blocks of a head go in
// descending order, longest first, since the last rows see the most keys (bottom-right alignment).
RTC_DEVICE int item_q0(const Gfx942Params& p, int item) {
  const int qb = item % p.nqb;
  return (RTC_MASK ? p.nqb - 1 - qb : qb) * kQRows;
}

RTC_DEVICE Frag as_frag(rtc_u32 lo, rtc_u32 hi) { return frag_of_words<Frag>(lo, hi); }

// The first MFMA of a chain (C = 0) and the accumulating one, of the element type.
RTC_DEVICE rtc_f32x4 mfma_zc(Frag a, Frag b) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return mfma_16x16x16_f16_zc(a, b);
#else
  return mfma_16x16x16_bf16_zc(a, b);
#endif
}

}  // namespace g942
