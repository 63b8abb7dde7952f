// The sm_90a prefill kernel over a quantized K / V cache (RTC_KV_DTYPE: FP8 E4M3, FP4 E2M1 + E8M0): a first launch of
// the kernel (stage SM90_STAGE_EXPAND) expands the cache rows each (sequence, K/V head) reads, exactly, into the
// workspace as 16-bit elements of q's dtype; the attention stage (SM90_STAGE_ATTN) then reads them as packed rows, with
// the same TMA boxes, tiles and schedule as a varlen cache in q's dtype (no page gather). wgmma reads K and V from
// shared memory as 16-bit elements, so a cache's bytes must be expanded before the tensor cores see them; done once
// per call here, every q tile of the GQA group then reads the expanded rows (docs/design-kv-quant.md, "sm90 prefill").
//
// Where a key lands in the workspace ([rows, heads_k, D], row stride heads_k * D): varlen, the cache's own row (the
// sequence's k_row + j: the workspace has the cache's total_k rows); paged, the sequence's slot of kv_slot rows
// (b * kv_slot + j), kv_slot the most keys a sequence can have (its block-table row's capacity; with seqused_k, which
// max_seqlen_k bounds, at most max_seqlen_k). A row through a block-table entry outside the pool is zeros.
//
// The scales (docs/numerics.md §10): FP8's k_descale joins the softmax scale of the tile's (sequence, K/V head) and
// v_descale multiplies O with 1 / l (sm90/scheduler.h, sm90/epilogue.h); a negative k_descale's sign goes into K's
// elements here (exact), so the scale the softmax sees is never negative. FP4's E8M0 scale of a key row multiplies its
// K and V elements in fp32 before they are rounded to the element: exact for bf16 (every value times a power of two in
// E8M0's range is a bf16 value or overflows as fp32 does), for fp16 while value x 2^(e - 127) is an fp16 value (else
// rounded to nearest even, Inf past 65504); 0xFF gives NaN elements.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "kv_quant.h"
#include "sm90/params.h"
#include "ptx_sm90.h"
#include "sm90_kv_elems.h"

namespace sm90 {

// Sequence b's keys in the workspace (RTC_KV_DTYPE != SAME): its first row, and (paged) its length bounded by its slot.
RTC_DEVICE void expanded_seq(const Sm90AttnParams& p, int b, Seq& s) {
  if (RTC_KV == RTC_KV_PAGED) {
    s.k_row = b * p.kv_slot;  // < 2^31: the host's plan (rows of the workspace) checks it
    if (s.len_k > p.kv_slot) s.len_k = p.kv_slot;  // never (seq_of's bounds are the slot's): the slot's guard
  }
}

// FP8: the k_descale of (sequence b, K/V head h), 1 without a descale tensor.
RTC_DEVICE float k_descale_of(const AttnParams& a, int b, int h) {
  return kv_descale(a.k_descale, a.kd_sb, a.kd_sh, b, h);
}

// 4 bytes of a cache row (FP8: 4 values, FP4: 8) as elements; `flip` XORs the sign bits (a negative k_descale), `sc`
// is the row's FP4 scale.
constexpr int kUnitVals = RTC_KV_FP4 ? 8 : 4;
RTC_DEVICE void expand_unit(rtc_u32 w, rtc_u32 flip, float sc, rtc_u32 (&e)[kUnitVals / 2]) {
  if constexpr (RTC_KV_FP4) {
    rtc_u32 x[4];  // the element pairs as bf16 (exact), then times the scale in fp32, rounded to the element
    sm90kv::fp4x8_elems<0, 4, 1, 5, 2, 6, 3, 7, false>(w, x);  // byte i: columns 2i (low nibble), 2i + 1
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = __uint_as_float(x[i] << 16) * sc, hi = __uint_as_float(x[i] & 0xFFFF0000u) * sc;
      e[i] = (sm90kv::kElemFp16 ? cvt_f16x2_f32(lo, hi)
                                : prmt(__float_as_uint(lo), __float_as_uint(hi), 0x7632u)) ^  // bf16: exact halves
             flip;
    }
  } else {
    sm90kv::fp8x4_elems<0, 1, 2, 3>(w, e[0], e[1]);
    e[0] ^= flip;
    e[1] ^= flip;
  }
}

// The expansion stage: the expand_ctas CTAs of (sequence b, K/V head h) = blockIdx.x / p.expand_ctas share its key
// rows (however long cu_seqlens_k makes the sequence): a warp takes 32 / lanes_per_row rows at a time, a row's 4-byte
// units over lanes_per_row lanes, the CTAs' warps interleaved, each lane kRows rows in flight. K and V both.
RTC_DEVICE void expand_stage(const Sm90AttnParams& p) {
  const AttnParams& a = p.a;
  const int bh = (int)(blockIdx.x / (unsigned)p.expand_ctas), c = (int)(blockIdx.x % (unsigned)p.expand_ctas);
  const int b = bh / a.heads_k, h = bh - b * a.heads_k;
  Seq s = seq_of(a, b);
  const int cache_row = s.k_row;  // varlen: the first key's row in the cache (and in the workspace)
  expanded_seq(p, b, s);
  const int units = RTC_KV_FP4 ? a.head_dim / 8 : a.head_dim / 4, lanes = p.expand_lanes;  // lanes: a power of 2
  const int warps = (int)(blockDim.x / 32), warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
  const int rows_per_warp = 32 / lanes, sub = lane / lanes, u0 = lane % lanes;
  rtc_u32 k_flip = 0;
  if (RTC_KV_FP8 && k_descale_of(a, b, h) < 0.f) k_flip = 0x80008000u;
  const rtc_i64 out_row = (rtc_i64)a.heads_k * a.head_dim;  // elements between workspace rows
  // A thread's rows are `step` apart, kRows of them in flight at once: their page ids, then their words, are loaded
  // before any is expanded (the stage is latency-bound otherwise: one CTA an SM, the attention's registers).
  constexpr int kRows = 8;
  const int step = p.expand_ctas * warps * rows_per_warp;
  for (int j0 = (c * warps + warp) * rows_per_warp + sub; j0 < s.len_k; j0 += kRows * step) {
    const unsigned char* kr[kRows];
    const unsigned char* vr[kRows];
    float ks[kRows], vs[kRows];
    bool in_pool[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = j0 + r * step;
      rtc_i64 page = j < s.len_k ? 0 : -1, row = cache_row + j;
      if (RTC_KV == RTC_KV_PAGED && page == 0) {
        page = page_of(a, b, j);
        row = j & (a.page_size - 1);
      }
      in_pool[r] = page >= 0;  // else past the sequence, or a block-table entry outside the pool (zeros)
      if (!in_pool[r]) page = row = 0;
      ks[r] = vs[r] = 1.f;
      if (RTC_KV_FP4 && in_pool[r]) {
        ks[r] = rtc_e8m0_decode(ld_global_nc_u8(a.k_scale + page * a.ks_sb + row * a.ks_ss + h * a.ks_sh));
        vs[r] = rtc_e8m0_decode(ld_global_nc_u8(a.v_scale + page * a.vs_sb + row * a.vs_ss + h * a.vs_sh));
      }
      kr[r] = (const unsigned char*)a.k + page * a.k_sb + row * a.k_ss + h * a.k_sh;
      vr[r] = (const unsigned char*)a.v + page * a.v_sb + row * a.v_ss + h * a.v_sh;
    }
    for (int u = u0; u < units; u += lanes) {
      rtc_u32 wk[kRows], wv[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        wk[r] = in_pool[r] ? rtc_gld(reinterpret_cast<const rtc_u32*>(kr[r]) + u) : 0u;
        wv[r] = in_pool[r] ? rtc_gld(reinterpret_cast<const rtc_u32*>(vr[r]) + u) : 0u;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int j = j0 + r * step;
        if (j >= s.len_k) break;
        rtc_u32 ek[kUnitVals / 2] = {}, ev[kUnitVals / 2] = {};
        if (in_pool[r]) {
          expand_unit(wk[r], k_flip, ks[r], ek);
          expand_unit(wv[r], 0u, vs[r], ev);
        }
        const rtc_i64 dst = ((rtc_i64)s.k_row + j) * out_row + (rtc_i64)h * a.head_dim + (rtc_i64)u * kUnitVals;
        if constexpr (RTC_KV_FP4) {
          *reinterpret_cast<uint4*>(p.kx + dst) = make_uint4(ek[0], ek[1], ek[2], ek[3]);
          *reinterpret_cast<uint4*>(p.vx + dst) = make_uint4(ev[0], ev[1], ev[2], ev[3]);
        } else {
          *reinterpret_cast<uint2*>(p.kx + dst) = make_uint2(ek[0], ek[1]);
          *reinterpret_cast<uint2*>(p.vx + dst) = make_uint2(ev[0], ev[1]);
        }
      }
    }
  }
}

}  // namespace sm90
