// The gfx942 decode kernel's K / V cache: where a work item's rows come from, their loads into registers, and the
// registers as the MFMA's element pairs. A cache in q's dtype (kv_dtype same) is loaded as it is; a quantized cache
// (RTC_KV_DTYPE, kv_quant.h) moves its own bytes (FP8 half, FP4 a quarter of a 16-bit row) and is expanded to the
// element type in registers, exactly (docs/numerics.md §10):
//   * FP8: a value's bits go into an fp16 of the same value times 2^-s (E4M3 s = 8, FNUZ 7): the sign to bit 15,
//     the exponent and mantissa fields to the top of fp16's (fp16 has their subnormals as its own, so the one
//     placement serves every code), then one multiply by 2^s (packed fp16), exact; bf16 through fp32. Where the arch
//     converts the format, by its own v_cvt_pk_f32_fp8 instead (RTC_KV_FP8_BY_CVT: FNUZ on gfx942, E4M3 on gfx950;
//     exact, the NaN codes NaNs);
//   * E2M1: v_perm_b32 tables of the 8 magnitudes' element bytes (high and low), the codes' magnitudes as the
//     selectors, the signs OR-ed in, one perm a pair to interleave (unit_elems below): no conversion; gfx950 by its
//     scaled converts instead, one a byte (the same elements);
//   * placed FP8 NaN codes (E4M3 S.1111.111, FNUZ 0x80), which the placement takes to finite values no other code
//     gives (+-480, -0): the loop ORs its units' tests (unit_nan_codes) over a sub-tile and branches once, rarely:
//     K's keys that hold one get NaN scores (what any NaN element gives them), V's elements are replaced in place
//     by the NaN kv_quant.h's decode gives;
//   * FP4: the lane's key's E8M0 scale comes with its row (one byte); V's is folded into the tables of its key's
//     elements (the 8 magnitudes times the scale in fp32, once per row: exact for bf16, fp32's range; fp16 for
//     scales 2^-22 .. 2^13, rounded to nearest outside), K's multiplies the key's scores in fp32 (kv_loop), as the
//     FP8 descales multiply the scores and O.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "kv_quant.h"
#if (RTC_KV_FP4 && RTC_HAS_CVT_SCALE_FP4) || (RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3 && RTC_HAS_CVT_FP8_OCP)
#include "isa_gfx950.h"
#endif
#include "gfx942/tiles.h"
#include "gfx942/sequences.h"
#include "gfx942_decode/params.h"
#include "gfx942_decode/scheduler.h"
#include "gfx942_decode/softmax.h"

// An FP8 format where the hardware converts it (isa_gfx942.h): FNUZ on gfx942, OCP E4M3 on gfx950. gfx90a has no FP8
// converts, gfx942's read FNUZ only and gfx950's OCP only, so the other formats keep the bit placement there.
// RTC_KV_NAN_CODES: the placed formats, whose NaN codes the loop tests.
#define RTC_KV_FP8_BY_CVT                                                 \
  ((RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ && RTC_HAS_CVT_FP8_FNUZ) || \
   (RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3 && RTC_HAS_CVT_FP8_OCP))
#define RTC_KV_NAN_CODES (RTC_KV_FP8 && !RTC_KV_FP8_BY_CVT)

namespace gdec {

constexpr int kQuadCols = kBucket / 4;  // head-dim columns a lane holds of its row or key
constexpr int kLoads = kQuadCols / 8;   // loads (units of 8 columns) per lane per 16 rows

// A unit: 8 columns of a row as stored (16, 8 or 4 bytes), and its bytes' offset from the row's first byte.
#if RTC_KV_DTYPE == RTC_KV_DTYPE_SAME
typedef rtc_u32x4 KvUnit;
RTC_DEVICE rtc_u32 col_byte(int col) { return (rtc_u32)(col * 2); }
#elif RTC_KV_FP8
typedef rtc_u32x2 KvUnit;
RTC_DEVICE rtc_u32 col_byte(int col) { return (rtc_u32)col; }
#else
typedef rtc_u32 KvUnit;
RTC_DEVICE rtc_u32 col_byte(int col) { return (rtc_u32)(col >> 1); }
#endif

// One lane's share of a 16-key sub-tile: its key's units and (FP4) the key's E8M0 scale code as loaded (0, 2^-127,
// for a key that reads zeros; 127, 1.0, for a 16-bit cache). The code is decoded where it is used (key_scale), not
// at the load: a value used right after its load would make the wave wait for that load, and with it for every
// vector load issued before it.
struct KvRegs {
  KvUnit u[kLoads];
  unsigned char scale;  // as loaded: widened where it is used (a widening at the load would wait for it there)
};
RTC_DEVICE float key_scale(const KvRegs& r) { return rtc_e8m0_decode(r.scale); }

#if RTC_KV_DTYPE == RTC_KV_DTYPE_SAME
// Where a work item's K and V rows come from: one resource over the sequence's rows of its K/V head, or (paged)
// the block table, one page per 16-key sub-tile.
#if RTC_KV == RTC_KV_PAGED
using KvRows = g942::PagedRows;
#else
struct KvRows {
  rtc_buffer_rsrc r;
  rtc_i64 row_stride;
  int len;
};
#endif

RTC_DEVICE KvRows kv_rows(const DecodeParams& p, bool is_v, const Seq& s, int b, int hk) {
  const rtc_elem_t* base = is_v ? p.v : p.k;
  const rtc_i64 sb = is_v ? p.v_sb : p.k_sb, ss = is_v ? p.v_ss : p.k_ss, sh = is_v ? p.v_sh : p.k_sh;
#if RTC_KV == RTC_KV_PAGED
  (void)sb;
  return g942::paged_rows(p, base, sb, ss, sh, b, hk, s.len_k);
#else
  (void)sb;
  (void)b;
  const rtc_i64 off = is_v ? s.v_off : s.k_off;
  return KvRows{g942::uniform_rsrc(base + off + (rtc_i64)hk * sh, g942::rows_span_bytes(s.len_k, ss, p.head_dim)), ss,
                s.len_k};
#endif
}

// This lane's share of key row j0 + lane % 16 (j0 uniform, a multiple of 16): columns [quad kQuadCols, +kQuadCols),
// 8 per load; paged, from page `id` (step_pages: the block table's entry for row j0, read earlier). Keys past the
// sequence, columns past the call's head dim d and (paged) pages outside the pool read 0, and nothing outside the
// row is touched.
RTC_DEVICE void load_rows(const KvRows& kv, int j0, int id, int lane, int d, KvRegs& out) {
  const int key = j0 + (lane & 15), col0 = (lane >> 4) * kQuadCols;
#if RTC_KV == RTC_KV_PAGED
  const rtc_buffer_rsrc r = g942::page_rsrc_at(kv, j0 < kv.len ? id : -1, d);
  const rtc_u32 row = g942::page_row_byte(kv, key);
#else
  (void)id;
  const rtc_buffer_rsrc r = kv.r;
  const rtc_u32 row = (rtc_u32)((rtc_i64)key * kv.row_stride * 2);
#endif
  out.scale = 127u;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int col = col0 + 8 * u;
    out.u[u] = buffer_load_dwordx4(r, key < kv.len && col < d ? row + col_byte(col) : decode_no_row(), 0u);
  }
}

// The unit's 8 elements as 4 pairs.
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, float) { return u; }

#else  // a quantized cache: bytes, row and page strides in bytes
#if RTC_KV == RTC_KV_DENSE
#error "attention_fwd_gfx942_decode: a quantized cache (RTC_KV_DTYPE) is varlen or paged (RTC_KV 1 or 2)"
#endif

// A work item's rows of one K/V head: varlen, one resource over the sequence's rows; paged, the pool's page 0 of the
// head and the block table, one page per 16-key sub-tile (page_of's rule: an id outside [0, num_pages) reads 0).
// FP4: the head's E8M0 scales beside them (varlen: the sequence's row 0).
struct KvRows {
  const unsigned char* head;
  rtc_i64 page_stride, row_stride;
  const unsigned char* scale;
  rtc_i64 scale_page_stride, scale_row_stride;
  const int* table;  // paged: the sequence's block-table row
  int page_size, num_pages, len;
  rtc_u32 row_bytes;  // bytes of a row of the call's head dim
  rtc_buffer_rsrc r;  // varlen: the sequence's rows
  // This lane's offsets from a sub-tile's first row (lane % 16 rows, and its first column's byte), computed once:
  // a load adds them to the sub-tile's uniform offset, its units' columns being the loads' immediate offsets.
  rtc_u32 lane_byte;
  rtc_i64 lane_scale;
};

RTC_DEVICE KvRows kv_rows(const DecodeParams& p, bool is_v, const Seq& s, int b, int hk) {
  const unsigned char* base = (const unsigned char*)(is_v ? p.v : p.k);
  const rtc_i64 sb = is_v ? p.v_sb : p.k_sb, ss = is_v ? p.v_ss : p.k_ss, sh = is_v ? p.v_sh : p.k_sh;
  KvRows r;
  r.page_stride = sb;
  r.row_stride = ss;
  r.row_bytes = (rtc_u32)col_byte(p.head_dim);
  r.len = s.len_k;
  r.page_size = p.page_size;
  r.num_pages = p.num_pages;
  r.table = RTC_KV == RTC_KV_PAGED ? p.block_table + (rtc_i64)b * p.table_stride : nullptr;
  const rtc_i64 row0 = RTC_KV == RTC_KV_PAGED ? 0 : s.k_row;
  r.head = base + row0 * ss + (rtc_i64)hk * sh;
  r.scale = nullptr;
  r.scale_page_stride = r.scale_row_stride = 0;
#if RTC_KV_FP4
  const unsigned char* sc = is_v ? p.v_scale : p.k_scale;
  r.scale_page_stride = is_v ? p.vs_sb : p.ks_sb;
  r.scale_row_stride = is_v ? p.vs_ss : p.ks_ss;
  r.scale = sc + row0 * r.scale_row_stride + (rtc_i64)hk * (is_v ? p.vs_sh : p.ks_sh);
#endif
  const int lane = (int)lane_id();
  r.lane_byte = (rtc_u32)(lane & 15) * (rtc_u32)ss + col_byte((lane >> 4) * kQuadCols);
  r.lane_scale = (rtc_i64)(lane & 15) * r.scale_row_stride;
  const rtc_i64 span = s.len_k <= 0 ? 0 : (rtc_i64)(s.len_k - 1) * ss + r.row_bytes;
  r.r = g942::uniform_rsrc(r.head, RTC_KV == RTC_KV_PAGED ? 0 : span);
  return r;
}

// This lane's share of key row j0 + lane % 16 (j0 uniform, a multiple of 16), as load_rows above with the cache's
// bytes, and (FP4) the key's scale code: 0 (2^-127) for a key past the sequence or its page. Pages hold a power of
// two rows, at least 16 (the op checks it), so the sub-tile's first row in its page and the page are scalar work, and
// the lane's row is that row plus lane % 16: its byte offsets are a uniform part and the lane's part (lane % 16
// rows), the same every step.
// FP4's units load unpredicated: every byte read is inside the resource (a page outside the pool has none, so it
// reads zeros; past the sequence's rows a varlen resource reads zeros too), and what a lane reads past d or past the
// sequence (a paged row of the last page) is finite, E2M1 having no NaN or Inf, and meets a zero: Q's columns past
// d are zeros, a key past the sequence is masked (its score replaced, its weight 0) and its scale finite.
RTC_DEVICE void load_rows(const KvRows& kv, int j0, int id_read, int lane, int d, KvRegs& out) {
  const int col0 = (lane >> 4) * kQuadCols;
  rtc_i64 page_off = 0, row0 = j0;
  bool ok = (lane & 15) < kv.len - j0;  // key j0 + lane % 16 is one of the sequence's
  rtc_buffer_rsrc r = kv.r;
  bool in_pool = true;
  if (RTC_KV == RTC_KV_PAGED) {
    const int id = j0 < kv.len ? id_read : -1;  // step_pages: the table's entry for row j0
    in_pool = id >= 0 && id < kv.num_pages;
    ok = ok && in_pool;
    const rtc_i64 page = in_pool ? id : 0;
    page_off = page * kv.scale_page_stride;
    row0 = j0 & (kv.page_size - 1);
    r = g942::uniform_rsrc(kv.head + page * kv.page_stride,
                           in_pool ? (rtc_i64)(kv.page_size - 1) * kv.row_stride + kv.row_bytes : 0);
  }
  const rtc_u32 at = (rtc_u32)(row0 * kv.row_stride) + kv.lane_byte;  // the lane's row, column col0
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int col = col0 + 8 * u;
#if RTC_KV_FP8
    out.u[u] = buffer_load_dwordx2(r, ok && col < d ? at + col_byte(8 * u) : decode_no_row(), 0u);
#else
    // unpredicated: see below
    (void)col;
    out.u[u] = buffer_load_dword(r, at + col_byte(8 * u), 0u);
#endif
  }
#if RTC_KV_FP4
  // The scale bytes of the sub-tile's keys of the sequence (none outside the pool): a key past them reads 0, with no
  // branch around the load (params.h decode_no_row says why).
  const unsigned char* sc = kv.scale + page_off + row0 * kv.scale_row_stride;  // uniform
  const rtc_i64 keys = kv.len - j0 < 16 ? kv.len - j0 : 16;
  const rtc_i64 span = in_pool && keys > 0 ? (keys - 1) * kv.scale_row_stride + 1 : 0;
  out.scale = buffer_load_ubyte(g942::uniform_rsrc(sc, span), (rtc_u32)kv.lane_scale, 0u);
#else
  out.scale = 127u;  // 1.0
  (void)page_off;
#endif
}

// The same with the page's table entry read here, by s_load (the prefill kernel's loads: gfx942/kv_cache.h).
RTC_DEVICE void load_rows(const KvRows& kv, int j0, int lane, int d, KvRegs& out) {
  const int shift = __builtin_ctz((unsigned)kv.page_size);
  load_rows(kv, j0, RTC_KV == RTC_KV_PAGED && j0 < kv.len ? scalar_load(kv.table + (j0 >> shift)) : -1, lane, d, out);
}
#endif  // the cache's format

// The block-table entries of a step's kSub sub-tiles starting at key key0 (uniform; paged: one page per 16-key
// sub-tile), for K's loads and V's alike (one table). Each is an s_load (its wait is lgkmcnt's, not the data loads'
// vmcnt) at an entry clamped into the sequence's part of the table, so it has no branch and reads no entry past it;
// load_rows takes page -1 for a sub-tile past the sequence. The loop reads them a step before the loads that use
// them, so that nothing waits for them.
struct StepPages {
  int id[kSub];
};
RTC_DEVICE StepPages step_pages(const KvRows& kv, int key0) {
  StepPages pg;
#if RTC_KV == RTC_KV_PAGED
  const int shift = __builtin_ctz((unsigned)kv.page_size);
  const int last = kv.len > 0 ? (kv.len - 1) >> shift : 0;
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int e = (key0 + 16 * s) >> shift;
    pg.id[s] = scalar_load(kv.table + (e < last ? e : last));
  }
#else
  (void)kv;
  (void)key0;
#pragma unroll
  for (int s = 0; s < kSub; ++s) pg.id[s] = -1;
#endif
  return pg;
}

#if RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
// An element pair from fp16 bits h of two placed codes (as described at the top): each half times 2^s in fp16
// (exact: every result is an fp16 normal or zero), then, for bf16, through fp32 (its top half).
RTC_DEVICE float half_f32(rtc_u32 bits) {
  return (float)__builtin_bit_cast(_Float16, (unsigned short)(bits & 0xFFFFu));
}
// An fp16 pair e of exact values as the element type.
RTC_DEVICE rtc_u32 pair_elems(rtc_u32 e) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return e;
#else
  // the two fp32's top halves, one v_perm_b32 (the shift and and-or clang writes for it cost two)
  return perm_b32(rtc_f32_bits(half_f32(e >> 16)), rtc_f32_bits(half_f32(e)), 0x07060302u);
#endif
}
template <int kShift>
RTC_DEVICE rtc_u32 placed_elems(rtc_u32 h) {
  constexpr _Float16 kScale = (_Float16)(float)(1u << kShift);
  const _Float16 lo = __builtin_bit_cast(_Float16, (unsigned short)(h & 0xFFFFu)) * kScale;
  const _Float16 hi = __builtin_bit_cast(_Float16, (unsigned short)(h >> 16)) * kScale;
  return pair_elems((rtc_u32) __builtin_bit_cast(unsigned short, lo) |
                    ((rtc_u32) __builtin_bit_cast(unsigned short, hi) << 16));
}

// The placement of two codes, v_perm_b32 gathering the bytes (a pair: 2 perms, a shift, an and-or): the perm source
// pair {mags_hi, mags_lo} holds each code's magnitude field in a byte, mag_sel picks the pair's two into bytes 0 and 2
// (then << kAt, the field's place in fp16); {signs_hi, signs_lo} holds each code's sign at bit 7 of a byte, sign_sel
// picks them into bytes 1 and 3 (bits 15 and 31).
template <int kAt>
RTC_DEVICE rtc_u32 placed_pair(rtc_u32 mags_hi, rtc_u32 mags_lo, rtc_u32 mag_sel, rtc_u32 signs_hi, rtc_u32 signs_lo,
                               rtc_u32 sign_sel) {
  const rtc_u32 m = perm_b32(mags_hi, mags_lo, mag_sel) << kAt;
  return (perm_b32(signs_hi, signs_lo, sign_sel) & 0x80008000u) | m;
}

#if RTC_KV_FP8_BY_CVT
// FNUZ on gfx942, E4M3 on gfx950, by the arch's own convert: v_cvt_pk_f32_fp8 gives a word's two codes as fp32,
// exactly, the NaN codes (FNUZ 0x80, E4M3 S.1111.111) as quiet NaNs (so there is no NaN test and no fix-up); bf16
// takes the fp32s' top halves (one perm: a quiet NaN's top half is a bf16 NaN), fp16 converts the pair in one
// v_cvt_pkrtz_f16_f32 (exact whatever the rounding: every FNUZ and E4M3 value is an fp16 normal or zero).
template <bool kHi>
RTC_DEVICE rtc_u32 fp8_cvt_pair(rtc_u32 x) {
#if RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ
  const rtc_f32x2 f = cvt_pk_f32_fp8_fnuz<kHi>(x);
#else
  const rtc_f32x2 f = cvt_pk_f32_fp8<kHi>(x);
#endif
#if RTC_DTYPE == RTC_DTYPE_FP16
  return cvt_pkrtz_f16_f32(f[0], f[1]);
#else
  return perm_b32(rtc_f32_bits(f[1]), rtc_f32_bits(f[0]), 0x07060302u);
#endif
}
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, float) {
  return rtc_u32x4{fp8_cvt_pair<false>(u[0]), fp8_cvt_pair<true>(u[0]), fp8_cvt_pair<false>(u[1]),
                   fp8_cvt_pair<true>(u[1])};
}
#elif RTC_KV_FP8
// Codes 2p and 2p + 1 of the dword x (mags: x & 0x7F7F7F7F): the magnitudes (7 bits) to fp16 bits 7..13.
RTC_DEVICE rtc_u32 fp8x2_elems(rtc_u32 x, rtc_u32 mags, int p) {
  const rtc_u32 h = placed_pair<7>(mags, mags, 0x0C000C00u | ((2u * p + 1u) << 16) | (2u * p), x, x,
                                   ((2u * p + 1u) << 24) | 0x000C000Cu | ((2u * p) << 8));
  return placed_elems < RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ ? 7 : 8 > (h);
}
// A unit's NaN codes: bit 7 of a byte set where either dword's byte is a NaN code (a byte's magnitude m is at most
// 0x7F, so neither sum below carries into the next byte). E4M3: m + 1 reaches bit 7 where m is 0x7F; FNUZ: m + 0x7F
// reaches it where m is not 0, and the code is 0x80 where it does not and the sign is set. The sums share the
// placement's magnitudes, and a step ORs its units' results: the hot path's whole test.
RTC_DEVICE rtc_u32 unit_nan_codes(const KvUnit& u) {
  const rtc_u32 m0 = u[0] & 0x7F7F7F7Fu, m1 = u[1] & 0x7F7F7F7Fu;
#if RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ
  return ((u[0] & ~(m0 + 0x7F7F7F7Fu)) | (u[1] & ~(m1 + 0x7F7F7F7Fu))) & 0x80808080u;
#else
  return ((m0 + 0x01010101u) | (m1 + 0x01010101u)) & 0x80808080u;
#endif
}

// The image of the NaN codes under the placement (E4M3 S.1111.111: +-480, which no finite code reaches; FNUZ 0x80:
// -0, which no other FNUZ code is) in the element type, and the element NaN kv_quant.h's decode gives them.
#if RTC_DTYPE == RTC_DTYPE_FP16
constexpr rtc_u32 kNanImage = RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ ? 0x8000u : 0x5F80u, kSignKept = 0u;
constexpr rtc_u32 kElemNan = RTC_FP16_NAN;
#else
constexpr rtc_u32 kNanImage = RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ ? 0x8000u : 0x43F0u, kSignKept = 0x8000u;
constexpr rtc_u32 kElemNan = 0x7FC0u;
#endif
RTC_DEVICE rtc_u32 nan_fix(rtc_u32 e) {
  const bool fnuz = RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ;
  const bool nan = fnuz ? e == kNanImage : (e & 0x7FFFu) == kNanImage;
  return nan ? (fnuz ? kElemNan : (e & kSignKept) | kElemNan) : e;
}

// The unit's 8 elements, NaN codes placed as their images (the caller tests unit_nan_codes and fixes them up).
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, float) {
  const rtc_u32 m0 = u[0] & 0x7F7F7F7Fu, m1 = u[1] & 0x7F7F7F7Fu;
  return rtc_u32x4{fp8x2_elems(u[0], m0, 0), fp8x2_elems(u[0], m0, 1), fp8x2_elems(u[1], m1, 0),
                   fp8x2_elems(u[1], m1, 1)};
}
// The rare path: a unit's elements with the NaN codes' images replaced by kv_quant.h's NaN.
RTC_DEVICE void fix_nan_elems(rtc_u32x4& w) {
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = nan_fix(w[i] & 0xFFFFu) | (nan_fix(w[i] >> 16) << 16);
}
#elif RTC_HAS_CVT_SCALE_FP4
// E2M1 on gfx950 by its scaled converts (isa_gfx950.h): v_cvt_scalef32_pk_{bf16,f16}_fp4 takes one byte's two codes
// (the low nibble first) to two elements, each the code's value times the scale operand's power of two rounded to
// the element type to nearest even: the elements the tables below hold (bf16 exact; fp16 the rounding of the same
// exact product), four instructions a unit, in column order. The scale operand is an f32 whose exponent field is the
// E8M0 code, the rest zero: K's 1.0 (its scale multiplies the key's scores, as below); V's its key's decoded scale
// with the mantissa cleared (2^-127, an f32 subnormal, becomes +0: the code 0; the NaN becomes Inf: 0xFF).
struct Fp4Scale {
  float op;
};
typedef Fp4Scale KTables;
typedef Fp4Scale VTables;
constexpr KTables kKTables = {1.0f};
RTC_DEVICE VTables v_tables(float mul) { return VTables{rtc_bits_f32(rtc_f32_bits(mul) & 0x7F800000u)}; }
template <int kByte> RTC_DEVICE rtc_u32 fp4_pair(rtc_u32 u, float scale) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return cvt_scalef32_pk_f16_fp4<kByte>(u, scale);
#else
  return cvt_scalef32_pk_bf16_fp4<kByte>(u, scale);
#endif
}
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, Fp4Scale s) {
  return rtc_u32x4{fp4_pair<0>(u, s.op), fp4_pair<1>(u, s.op), fp4_pair<2>(u, s.op), fp4_pair<3>(u, s.op)};
}
// The unit's 8 elements times mul in column order.
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, float mul) { return unit_elems(u, v_tables(mul)); }
constexpr int kUnitCol[8] = {0, 1, 2, 3, 4, 5, 6, 7};
RTC_DEVICE rtc_u32x4 q_unit_order(rtc_u32x4 w) { return w; }
#else
// E2M1 by table: each of the 8 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6) times the row's scale is one element of the
// element type, computed once per row (V: its key's E8M0 scale; K: 1, constants), its high and low bytes in two
// 8-byte tables, the sources of a v_perm_b32 whose selector is four 3-bit magnitudes (a byte each): four codes'
// high (low) bytes in one instruction. The sign is OR-ed into bit 7 of the high bytes; one perm per pair then puts
// two elements' low and high bytes side by side. Unscaled, every element's low byte is 0 in fp16 (the high bytes
// 0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46), so K's fp16 tables have no low half.
template <bool kLow>
struct Fp4Tables {
  rtc_u32 h03, h47;  // high bytes of magnitudes 0..3, 4..7
  rtc_u32 l03, l47;  // low bytes (kLow)
};
#if RTC_DTYPE == RTC_DTYPE_FP16
typedef Fp4Tables<false> KTables;
constexpr KTables kKTables = {0x3E3C3800u, 0x46444240u, 0u, 0u};
#else
typedef Fp4Tables<true> KTables;
constexpr KTables kKTables = {0x3F3F3F00u, 0x40404040u, 0xC0800000u, 0xC0804000u};
#endif
typedef Fp4Tables<true> VTables;

// The tables of the elements m x mul, m the 8 magnitudes: each the element computed as the fp32 path computes it
// (bf16: the fp32 product's top half, exact; fp16: the product rounded to nearest even), so a code's element is the
// same bits it was, a negative code's with bit 15 set (-0 for -0; a NaN scale gives NaN elements of the code's
// sign). Per row 8 multiplies, (fp16) 8 converts, and 8 perms gathering the bytes.
// An element's bits: fp16 in the low half, bf16 in the high half (the fp32's top).
RTC_DEVICE rtc_u32 fp4_elem_bits(float m, float mul) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  return cvt_f16_f32(m * mul);
#else
  return rtc_f32_bits(m * mul);
#endif
}
// bytes (low, high) of elements a..d: {a.l, b.l, c.l, d.l} and {a.h, b.h, c.h, d.h}
RTC_DEVICE void fp4_table_bytes(rtc_u32 a, rtc_u32 b, rtc_u32 c, rtc_u32 d, rtc_u32& lo, rtc_u32& hi) {
  constexpr rtc_u32 kSel = RTC_DTYPE == RTC_DTYPE_FP16 ? 0x05010400u : 0x07030602u;  // {x.l, y.l, x.h, y.h}
  const rtc_u32 ab = perm_b32(b, a, kSel), cd = perm_b32(d, c, kSel);
  lo = perm_b32(cd, ab, 0x05040100u);
  hi = perm_b32(cd, ab, 0x07060302u);
}
RTC_DEVICE VTables v_tables(float mul) {
  VTables t;
#if RTC_DTYPE == RTC_DTYPE_FP16
  fp4_table_bytes(fp4_elem_bits(0.0f, mul), fp4_elem_bits(0.5f, mul), fp4_elem_bits(1.0f, mul),
                  fp4_elem_bits(1.5f, mul), t.l03, t.h03);
  fp4_table_bytes(fp4_elem_bits(2.0f, mul), fp4_elem_bits(3.0f, mul), fp4_elem_bits(4.0f, mul),
                  fp4_elem_bits(6.0f, mul), t.l47, t.h47);
#else
  // bf16: the products two at a time (v_pk_mul_f32), the same fp32 products; the factor a pair in two registers
  // (fenced: as softmax.h's rescale, a broadcast from mul's register would read its neighbour, at 256 a scale byte's
  // load destination, and wait for every load in flight)
  rtc_f32x2 m = {mul, mul};
  reg_fence(m);
  const rtc_f32x2 p01 = rtc_f32x2{0.0f, 0.5f} * m, p23 = rtc_f32x2{1.0f, 1.5f} * m;
  const rtc_f32x2 p45 = rtc_f32x2{2.0f, 3.0f} * m, p67 = rtc_f32x2{4.0f, 6.0f} * m;
  fp4_table_bytes(rtc_f32_bits(p01[0]), rtc_f32_bits(p01[1]), rtc_f32_bits(p23[0]), rtc_f32_bits(p23[1]), t.l03, t.h03);
  fp4_table_bytes(rtc_f32_bits(p45[0]), rtc_f32_bits(p45[1]), rtc_f32_bits(p67[0]), rtc_f32_bits(p67[1]), t.l47, t.h47);
#endif
  return t;
}

// The order of a unit's 8 elements as unit_elems gives them: pair j holds columns kUnitCol[2j], kUnitCol[2j + 1]
// (the low nibbles' codes, columns 0 2 4 6, then the high nibbles', 1 3 5 7: a pair is one perm of two tables' bytes).
// Q's columns take the same order (q_unit_order) so that K's MFMAs contract matching columns; V's elements are
// written to their columns one by one.
constexpr int kUnitCol[8] = {0, 2, 4, 6, 1, 3, 5, 7};
RTC_DEVICE rtc_u32x4 q_unit_order(rtc_u32x4 w) {
  return rtc_u32x4{perm_b32(w[1], w[0], 0x05040100u), perm_b32(w[3], w[2], 0x05040100u),
                   perm_b32(w[1], w[0], 0x07060302u), perm_b32(w[3], w[2], 0x07060302u)};
}

// The unit's 8 elements in kUnitCol's order. sel: the magnitudes of the low / high nibbles of bytes 0..3; H, L: their
// high bytes signed (the low nibble's sign is bit 3 of its byte, the high one's bit 7) and low bytes.
template <bool kLow>
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, const Fp4Tables<kLow>& t) {
  const rtc_u32 sel_lo = u & 0x07070707u, sel_hi = (u >> 4) & 0x07070707u;
  const rtc_u32 h_lo = perm_b32(t.h47, t.h03, sel_lo) | ((u << 4) & 0x80808080u);
  const rtc_u32 h_hi = perm_b32(t.h47, t.h03, sel_hi) | (u & 0x80808080u);
  if (!kLow)  // zero low bytes (selector 12)
    return rtc_u32x4{perm_b32(h_lo, h_lo, 0x050C040Cu), perm_b32(h_lo, h_lo, 0x070C060Cu),
                     perm_b32(h_hi, h_hi, 0x050C040Cu), perm_b32(h_hi, h_hi, 0x070C060Cu)};
  const rtc_u32 l_lo = perm_b32(t.l47, t.l03, sel_lo), l_hi = perm_b32(t.l47, t.l03, sel_hi);
  return rtc_u32x4{perm_b32(h_lo, l_lo, 0x05010400u), perm_b32(h_lo, l_lo, 0x07030602u),
                   perm_b32(h_hi, l_hi, 0x05010400u), perm_b32(h_hi, l_hi, 0x07030602u)};
}
// The unit's 8 elements times mul in column order (pair j: columns 2j, 2j + 1).
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, float mul) {
  const rtc_u32x4 w = unit_elems(u, v_tables(mul));
  return rtc_u32x4{perm_b32(w[2], w[0], 0x05040100u), perm_b32(w[2], w[0], 0x07060302u),
                   perm_b32(w[3], w[1], 0x05040100u), perm_b32(w[3], w[1], 0x07060302u)};
}
#endif
#endif  // RTC_KV_DTYPE

#if RTC_KV_FP4
// What K's and V's expansions take beside the bytes: FP4 the tables (K's constant, V's of its key's scale);
// elsewhere V's scale (1: FP8's descale multiplies O).
RTC_DEVICE KTables k_map() { return kKTables; }
RTC_DEVICE VTables v_map(float scale) { return v_tables(scale); }
#else
RTC_DEVICE float k_map() { return 1.0f; }
RTC_DEVICE float v_map(float scale) { return scale; }
// The unit's elements in column order, Q's as loaded.
constexpr int kUnitCol[8] = {0, 1, 2, 3, 4, 5, 6, 7};
RTC_DEVICE rtc_u32x4 q_unit_order(rtc_u32x4 w) { return w; }
#endif

#if !RTC_KV_NAN_CODES
// Formats without NaN codes, or whose convert makes them NaNs (a cache in q's dtype carries its NaNs as they are; FP4's come from its scale).
RTC_DEVICE rtc_u32 unit_nan_codes(const KvUnit&) { return 0u; }
RTC_DEVICE void fix_nan_elems(rtc_u32x4&) {}
#endif

}  // namespace gdec
