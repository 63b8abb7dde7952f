// The gfx942 prefill kernel's quantized K / V cache (RTC_KV_DTYPE, kv_quant.h; docs/numerics.md §10): where the
// expansion happens, and the scales.
//
// The kernel already transposes V once per (sequence, K/V head) into the workspace (the V^T stage), and every q
// block and q head of the GQA group reads that V^T; K goes by DMA from memory into LDS, read there by all 8 waves.
// So the cache's bytes are expanded once, in the V^T stage (kv_block below): each 64-key block's V rows into the
// LDS staging the V^T chunks are written from, and its K rows into a K workspace of the same block layout, rows of
// the bucket's elements. The attention stage then runs the bf16 / fp16 loop unchanged: its K DMA reads the expanded
// rows (a packed sequence's run of blocks, paged or not), its PV reads V^T. An expansion in the loop would be paid
// by every q block of every q head (group B's K refill, or 8 waves' LDS reads) on the VALU the softmax already
// bounds at 64 and 96: docs/NOTES.md, "Quantized KV caches, step 2c".
//
// The expansion is the decode kernel's (gfx942_decode/kv_cache.h: kv_rows / load_rows move 16 rows of the cache's
// bytes, 8 columns a load; unit_elems expands a unit exactly; NaN codes fixed up), and the scales as the decode
// kernel applies them: FP8 k_descale on each score before the softmax scale, v_descale on O before the division by
// l; FP4 each key's E8M0 scale on its scores (a float per key, written by the V^T stage beside the K rows), V's on
// its row of V in fp32 before the rounding to the element (exact for bf16; fp16 inside fp16's range).
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "kv_quant.h"
#include "gfx942/params.h"
#include "gfx942/tiles.h"
#include "gfx942/sequences.h"
#if RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
#include "gfx942_decode/kv_cache.h"
#endif

// K rows come from the cache (dense, varlen or paged) in q's dtype; a quantized cache's from the K workspace.
#define GFX942_K_FROM_CACHE (RTC_KV_DTYPE == RTC_KV_DTYPE_SAME)

namespace g942 {

// A score's factor before the softmax scale, per lane and sub-tile: none for a cache in q's dtype.
#if RTC_KV_DTYPE == RTC_KV_DTYPE_SAME
struct KeyMul {};
#else
#if RTC_KV == RTC_KV_DENSE
#error "attention_fwd_gfx942: a quantized cache (RTC_KV_DTYPE) is varlen or paged (RTC_KV 1 or 2)"
#endif
struct KeyMul {
  rtc_f32x4 f[kSub];  // keys 16 sub + 4 quad + i of the block
};

// The workspace of a packed call: V^T [0, vt_bytes), the expanded K rows [vt_bytes, 2 vt_bytes) block for block
// (64 rows of the bucket's elements: a V^T block's bytes), then FP4's key scales (64 floats a block).
constexpr int kKeyScaleBlockBytes = GFX942_KV_ROWS * 4;
RTC_DEVICE rtc_i64 kx_block_offset(const Gfx942Params& p, rtc_i64 block) { return p.vt_bytes + block * kVtBlockBytes; }
RTC_DEVICE rtc_i64 key_scale_offset(const Gfx942Params& p, rtc_i64 block) {
  return 2 * p.vt_bytes + block * kKeyScaleBlockBytes;
}

// The parameter block as the decode kernel's loaders read it (they read AttnParams' fields only).
RTC_DEVICE DecodeParams as_decode_params(const Gfx942Params& p) {
  DecodeParams d;
  static_cast<AttnParams&>(d) = p;
  return d;
}

// Block n of sequence s, K/V head h, from the cache: waves 0..3 expand V's 16-row sub-tiles into the V^T stage's
// LDS rows (row-major, kBucket / 2 dwords a row), waves 4..7 K's into the K workspace block out_block (and FP4's
// key scales beside them). Rows past the sequence, columns past the call's head dim and (paged) pages outside the
// pool load as zeros (scale 1): zeros in V^T and K, as the stage's rows in q's dtype.
RTC_DEVICE void kv_block(const Gfx942Params& p, rtc_u32* vt_rows, const Seq& s, int b, int h, int n,
                         rtc_i64 out_block) {
  const int lane = (int)lane_id(), wave = (int)readfirstlane(threadIdx.x >> 6);
  const bool is_v = wave < 4;
  const int sub = wave & 3, row = 16 * sub + (lane & 15), col0 = (lane >> 4) * gdec::kQuadCols;
  const DecodeParams dp = as_decode_params(p);
  const gdec::KvRows rows = gdec::kv_rows(dp, is_v, s, b, h);
  gdec::KvRegs r;
  gdec::load_rows(rows, n * GFX942_KV_ROWS + 16 * sub, lane, p.head_dim, r);
  const rtc_buffer_rsrc kx = uniform_rsrc((const char*)p.workspace + kx_block_offset(p, out_block), kVtBlockBytes);
#pragma unroll
  for (int u = 0; u < gdec::kLoads; ++u) {
    rtc_u32x4 e = gdec::unit_elems(r.u[u], is_v ? r.scale : 1.0f);
    if (gdec::unit_nan_codes(r.u[u]) != 0u) gdec::fix_nan_elems(e);
    const int col = col0 + 8 * u;
    if (is_v)
      ds_write<rtc_u32x4>(&vt_rows[row * (kBucket / 2) + col / 2], e);
    else
      buffer_store_dwordx4(kx, (rtc_u32)((row * kBucket + col) * 2), 0u, e);
  }
#if RTC_KV_FP4
  if (!is_v && lane < 16)
    global_store((float*)((char*)p.workspace + key_scale_offset(p, out_block)) + row, r.scale);
#endif
}

// The item's expanded K rows: its sequence's run of K workspace blocks (vt_first_block's, as its V^T).
RTC_DEVICE rtc_u64 kx_rows(const Gfx942Params& p, const Seq& s, int b, int hk) {
  const rtc_i64 block = (rtc_i64)hk * p.vt_head_blocks + vt_first_block(p, b, s);
  return (rtc_u64)((const char*)p.workspace + kx_block_offset(p, block));
}
// The item's FP4 key scales (the same blocks'), as one resource; FP8: none.
RTC_DEVICE rtc_buffer_rsrc key_scale_rsrc(const Gfx942Params& p, const Seq& s, int b, int hk) {
  const rtc_i64 block = (rtc_i64)hk * p.vt_head_blocks + vt_first_block(p, b, s);
  return uniform_rsrc((const char*)p.workspace + key_scale_offset(p, block),
                      RTC_KV_FP4 ? (rtc_i64)kv_blocks(s.len_k) * kKeyScaleBlockBytes : 0);
}

// Block kb's factors for this lane's scores (quad: lane / 16): FP8 the descale, FP4 its keys' scales.
RTC_DEVICE KeyMul key_mul(rtc_buffer_rsrc scales, float k_descale, int kb, int quad) {
  KeyMul km;
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
#if RTC_KV_FP4
    (void)k_descale;
    const rtc_u32x4 w = buffer_load_dwordx4(scales, (rtc_u32)((16 * s + 4 * quad) * 4),
                                            readfirstlane((rtc_u32)kb * kKeyScaleBlockBytes));
    km.f[s] = __builtin_bit_cast(rtc_f32x4, w);
#else
    (void)scales;
    (void)kb;
    (void)quad;
    km.f[s] = rtc_f32x4{k_descale, k_descale, k_descale, k_descale};
#endif
  }
  return km;
}
#endif

}  // namespace g942
