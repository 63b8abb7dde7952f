// The gfx942 prefill kernel's quantized K / V cache (RTC_KV_DTYPE, kv_quant.h; docs/numerics.md §10): where the
// expansion happens, and the scales.
//
// The kernel already transposes V once per (sequence, K/V head) into the workspace (the V^T stage), and every q
// block and q head of the GQA group reads that V^T; K goes by DMA from memory into LDS, read there by all 8 waves.
// So the cache's bytes are expanded once, in the V^T stage (expand_rows below): each 64-key block's V rows into the
// LDS staging the V^T chunks are written from, and its K rows into a K workspace of the same block layout, rows of
// the bucket's elements. The attention stage then runs the bf16 / fp16 loop unchanged: its K DMA reads the expanded
// rows (a packed sequence's run of blocks, paged or not), its PV reads V^T. An expansion in the loop would be paid
// by every q block of every q head (group B's K refill, or 8 waves' LDS reads) on the VALU the softmax already
// bounds at 64 and 96: docs/NOTES.md, "Quantized KV caches, step 2c".
//
// The expansion is the decode kernel's (gfx942_decode/kv_cache.h: kv_rows / load_rows move 16 rows of the cache's
// bytes, 8 columns a load; unit_elems expands a unit exactly; NaN codes fixed up). The scales (numerics §10), at no
// cost in the loop's registers (the 128 and 192 window variants sit at 256 VGPRs): FP8's k_descale joins the softmax
// scale, each score times (k_descale * scale_log2), and v_descale joins 1 / l; FP4's K scale joins it per key,
// (q . k) times (2^(e - 127) * scale_log2), a float per key written by expand_rows after the K rows (the same bits
// as the scale on the score then the softmax scale: a power of two), and V's multiplies its row
// of V in fp32 before the rounding to the element (exact for bf16; fp16 inside fp16's range), as in the decode kernel.
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

#if RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
#if RTC_KV == RTC_KV_DENSE
#error "attention_fwd_gfx942: a quantized cache (RTC_KV_DTYPE) is varlen or paged (RTC_KV 1 or 2)"
#endif

// The workspace of a packed call: V^T [0, vt_bytes), the expanded K rows [vt_bytes, 2 vt_bytes) block for block
// (64 rows of the bucket's elements: a V^T block's bytes), then FP4's key factors (64 floats a block), the host's
// workspace_bytes (jit/ops/attention_fwd/gfx942.cpp).
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

// Sub-tile sub (16 rows) of block n of sequence s, K/V head h, from the cache (kV: V, into the V^T stage's LDS rows,
// row-major, kBucket / 2 dwords a row; else K, into the K workspace's block out_block, and FP4's key factors into
// theirs). Rows past the sequence, columns past the call's head dim and (paged) pages outside the pool load as zeros
// (their FP4 scale code 0, 2^-127, or 1: finite either way): zeros in V^T and K, as the stage's rows in q's dtype. One tensor per call: the loaders' pools, strides
// and scales are loop constants of the paged stage, and K's beside V's (selected per wave) took 106 SGPRs.
template <bool kV>
RTC_DEVICE void expand_rows(const Gfx942Params& p, rtc_u32* vt_rows, const Seq& s, int b, int h, int n, int sub,
                            rtc_i64 out_block) {
  const int lane = (int)lane_id(), row = 16 * sub + (lane & 15), col0 = (lane >> 4) * gdec::kQuadCols;
  const DecodeParams dp = as_decode_params(p);
  const gdec::KvRows rows = gdec::kv_rows(dp, kV, s, b, h);
  gdec::KvRegs r;
  gdec::load_rows(rows, n * GFX942_KV_ROWS + 16 * sub, lane, p.head_dim, r);
  const rtc_buffer_rsrc kx = uniform_rsrc((const char*)p.workspace + kx_block_offset(p, out_block), kVtBlockBytes);
#pragma unroll
  for (int u = 0; u < gdec::kLoads; ++u) {
    rtc_u32x4 e = gdec::unit_elems(r.u[u], kV ? gdec::key_scale(r) : 1.0f);
    if (gdec::unit_nan_codes(r.u[u]) != 0u) gdec::fix_nan_elems(e);
    const int col = col0 + 8 * u;
    if (kV)
      ds_write<rtc_u32x4>(&vt_rows[row * (kBucket / 2) + col / 2], e);
    else
      buffer_store_dwordx4(kx, (rtc_u32)((row * kBucket + col) * 2), 0u, e);
  }
#if RTC_KV_FP4 && RTC_SCORE_MOD
  // The key's score factor: its scale alone; the score modifications scale the dequantized score (score_mod.h).
  if (!kV && lane < 16)
    global_store((float*)((char*)p.workspace + key_scale_offset(p, out_block)) + row, gdec::key_scale(r));
#elif RTC_KV_FP4
  // The key's score factor: its scale times the softmax scale (scale_log2), exact (a power of two times it).
  if (!kV && lane < 16)
    global_store((float*)((char*)p.workspace + key_scale_offset(p, out_block)) + row,
                 gdec::key_scale(r) * p.scale_log2);
#endif
}

// V of block n into the V^T stage's LDS rows: waves 0..3 a sub-tile each (the stage's barrier follows).
RTC_DEVICE void expand_v_block(const Gfx942Params& p, rtc_u32* vt_rows, const Seq& s, int b, int h, int n) {
  const int wave = (int)readfirstlane(threadIdx.x >> 6);
  if (wave < 4) expand_rows<true>(p, vt_rows, s, b, h, n, wave, 0);
}

// K of blocks n_begin, n_begin + step, ... below n_end into the K workspace (block n at out_base + n): waves 0..3 a
// sub-tile each of one block, waves 4..7 of the next. No LDS, no barrier.
RTC_DEVICE void expand_k_blocks(const Gfx942Params& p, const Seq& s, int b, int h, int n_begin, int n_end, int step,
                                rtc_i64 out_base) {
  const int wave = (int)readfirstlane(threadIdx.x >> 6);
  for (int n = n_begin + (wave >> 2) * step; n < n_end; n += 2 * step)
    expand_rows<false>(p, nullptr, s, b, h, n, wave & 3, out_base + n);
}

// FP8: kv_quant.h's kv_descale as a uniform value, its address in SGPRs (a plain load's 64-bit VGPR address was held
// across the window variants' first loop, at 256 VGPRs: a spill).
RTC_DEVICE float uniform_descale(const float* d, rtc_i64 sb, rtc_i64 sh, int b, int h) {
  const rtc_buffer_rsrc r = uniform_rsrc(d ? d + (rtc_i64)b * sb + (rtc_i64)h * sh : d, d ? 4 : 0);
  const float x = rtc_bits_f32(readfirstlane(buffer_load_dword(r, 0u, 0u)));
  return d ? x : 1.0f;
}

// The item's expanded K rows: its sequence's run of K workspace blocks (vt_first_block's, as its V^T).
RTC_DEVICE rtc_u64 kx_rows(const Gfx942Params& p, const Seq& s, int b, int hk) {
  const rtc_i64 block = (rtc_i64)hk * p.vt_head_blocks + vt_first_block(p, b, s);
  return (rtc_u64)((const char*)p.workspace + kx_block_offset(p, block));
}
#if RTC_KV_FP4
// FP4: the softmax scale of this lane's scores of block kb (keys 16 sub + 4 quad + i, quad = lane / 16): each key's
// E8M0 scale times scale_log2, as expand_rows wrote them. (q . k) * 2^(e - 127) * c rounds once, as (q . k) * (2^(e - 127)
// c): the same bits as the scale on the score, then the softmax scale (numerics §10), barring fp32's range.
struct KeyScales {
  rtc_f32x4 f[kSub];
};
RTC_DEVICE rtc_f32x4 score_scale(const KeyScales& k, int sub) { return k.f[sub]; }

// Where the item's key factors are (its blocks'): below 256 a buffer resource in SGPRs (the 128 and 192 window
// variants sit at 256 VGPRs); at 256, where gfx950's attention stage has no SGPR to spare and VGPRs to spare, the
// address in a VGPR pair (fenced there). Every access stays inside the item's blocks by construction, as V^T's.
struct KeyFactors {
#if RTC_HEAD_DIM_MAX == 256
  rtc_u64 at;
#else
  rtc_buffer_rsrc r;
#endif
};
RTC_DEVICE KeyFactors key_factors(const Gfx942Params& p, const Seq& s, int b, int hk) {
  const rtc_i64 block = (rtc_i64)hk * p.vt_head_blocks + vt_first_block(p, b, s);
  const char* at = (const char*)p.workspace + key_scale_offset(p, block);
#if RTC_HEAD_DIM_MAX == 256
  KeyFactors f = {(rtc_u64)at};
  reg_fence(f.at);
  return f;
#else
  return KeyFactors{uniform_rsrc(at, 0xFFFFFFFFll)};
#endif
}
RTC_DEVICE KeyScales key_scales(const KeyFactors& f, int kb, int quad) {
  KeyScales k;
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const rtc_u32 off = (rtc_u32)((16 * s + 4 * quad) * 4);
#if RTC_HEAD_DIM_MAX == 256
    k.f[s] = global_load((const rtc_f32x4*)(f.at + (rtc_u64)kb * kKeyScaleBlockBytes + off));
#else
    k.f[s] =
        __builtin_bit_cast(rtc_f32x4, buffer_load_dwordx4(f.r, off, readfirstlane((rtc_u32)kb * kKeyScaleBlockBytes)));
#endif
  }
  return k;
}
#endif
#endif

}  // namespace g942
