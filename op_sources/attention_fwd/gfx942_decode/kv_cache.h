// The gfx942 decode kernel's K / V cache: where a work item's rows come from, their loads into registers, and the
// registers as the MFMA's element pairs. A cache in q's dtype (kv_dtype same) is loaded as it is; a quantized cache
// (RTC_KV_DTYPE, kv_quant.h) moves its own bytes (FP8 half, FP4 a quarter of a 16-bit row) and is expanded to the
// element type in registers, exactly (docs/numerics.md §10):
//   * FP8: a value's bits go into an fp16 of the same value times 2^-s (E4M3 s = 8, FNUZ 7): the sign to bit 15,
//     the exponent and mantissa fields to the top of fp16's (fp16 has their subnormals as its own, so the one
//     placement serves every code), then one multiply by 2^s (packed fp16), exact; bf16 through fp32;
//   * E2M1: a v_perm_b32 table of the magnitudes' exact fp16 high bytes (unit_elems below), no multiply;
//   * FP8 NaN codes (E4M3 S.1111.111, FNUZ 0x80), which the placement takes to finite values no other code gives
//     (+-480, -0): the loop ORs its units' tests (unit_nan_codes) over a sub-tile and branches once, rarely: K's
//     keys that hold one get NaN scores (what any NaN element gives them), V's elements are replaced in place by
//     the NaN kv_quant.h's decode gives;
//   * FP4: the lane's key's E8M0 scale comes with its row (one byte); V's is folded into the row's elements (the
//     multiply is exact: bf16 has fp32's range, fp16 for scales 2^-22 .. 2^13), K's multiplies the key's scores in
//     fp32 (kv_loop), as the FP8 descales multiply the scores and O.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "kv_quant.h"
#include "gfx942/tiles.h"
#include "gfx942/sequences.h"
#include "gfx942_decode/params.h"
#include "gfx942_decode/scheduler.h"
#include "gfx942_decode/softmax.h"

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

// One lane's share of a 16-key sub-tile: its key's units and (FP4) the key's E8M0 scale as fp32 (1 elsewhere).
struct KvRegs {
  KvUnit u[kLoads];
  float scale;
};

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
// 8 per load. Keys past the sequence, columns past the call's head dim d and (paged) pages outside the pool read 0,
// and nothing outside the row is touched.
RTC_DEVICE void load_rows(const KvRows& kv, int j0, int lane, int d, KvRegs& out) {
  const int key = j0 + (lane & 15), col0 = (lane >> 4) * kQuadCols;
#if RTC_KV == RTC_KV_PAGED
  const rtc_buffer_rsrc r = g942::page_rsrc(kv, j0, d);
  const rtc_u32 row = g942::page_row_byte(kv, key);
#else
  const rtc_buffer_rsrc r = kv.r;
  const rtc_u32 row = (rtc_u32)((rtc_i64)key * kv.row_stride * 2);
#endif
  out.scale = 1.0f;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int col = col0 + 8 * u;
    out.u[u] = rtc_u32x4{0u, 0u, 0u, 0u};
    if (key < kv.len && col < d) out.u[u] = buffer_load_dwordx4(r, row + col_byte(col), 0u);
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
  const rtc_i64 span = s.len_k <= 0 ? 0 : (rtc_i64)(s.len_k - 1) * ss + r.row_bytes;
  r.r = g942::uniform_rsrc(r.head, RTC_KV == RTC_KV_PAGED ? 0 : span);
  return r;
}

// This lane's share of key row j0 + lane % 16 (j0 uniform, a multiple of 16), as load_rows above with the cache's
// bytes, and (FP4) the key's scale: 1 for a key that reads zeros.
RTC_DEVICE void load_rows(const KvRows& kv, int j0, int lane, int d, KvRegs& out) {
  const int key = j0 + (lane & 15), col0 = (lane >> 4) * kQuadCols;
  rtc_i64 page_off = 0, row = key;
  bool ok = key < kv.len;
  rtc_buffer_rsrc r = kv.r;
  if (RTC_KV == RTC_KV_PAGED) {
    const int id = j0 < kv.len ? kv.table[j0 / kv.page_size] : -1;  // uniform: a sub-tile is inside one page
    const bool in_pool = id >= 0 && id < kv.num_pages;
    ok = ok && in_pool;
    const rtc_i64 page = in_pool ? id : 0;
    page_off = page * kv.scale_page_stride;
    row = key % kv.page_size;
    r = g942::uniform_rsrc(kv.head + page * kv.page_stride,
                           in_pool ? (rtc_i64)(kv.page_size - 1) * kv.row_stride + kv.row_bytes : 0);
  }
  const rtc_u32 row_byte = (rtc_u32)(row * kv.row_stride);
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int col = col0 + 8 * u;
#if RTC_KV_FP8
    out.u[u] = rtc_u32x2{0u, 0u};
    if (ok && col < d) out.u[u] = buffer_load_dwordx2(r, row_byte + col_byte(col), 0u);
#else
    out.u[u] = 0u;
    if (ok && col < d) out.u[u] = buffer_load_dword(r, row_byte + col_byte(col), 0u);
#endif
  }
  out.scale = 1.0f;
#if RTC_KV_FP4
  if (ok) out.scale = rtc_e8m0_decode(rtc_gld(kv.scale + page_off + row * kv.scale_row_stride));
#endif
}

// An element pair from fp16 bits h of two placed codes (as described at the top): each half times 2^s in fp16
// (exact: every result is an fp16 normal or zero), then, for bf16 or FP4's V (times `mul`, its key's scale), through
// fp32: bf16 its top half, fp16 rounded back (exact inside fp16's range).
RTC_DEVICE float half_f32(rtc_u32 bits) {
  return (float)__builtin_bit_cast(_Float16, (unsigned short)(bits & 0xFFFFu));
}
// An fp16 pair e of exact values as the element type, times mul.
RTC_DEVICE rtc_u32 pair_elems(rtc_u32 e, float mul) {
#if RTC_DTYPE == RTC_DTYPE_FP16
  if (!RTC_KV_FP4) return e;
  return cvt_f16_f32(half_f32(e) * mul) | (cvt_f16_f32(half_f32(e >> 16) * mul) << 16);
#else
  // the two fp32's top halves, one v_perm_b32 (the shift and and-or clang writes for it cost two)
  return perm_b32(rtc_f32_bits(half_f32(e >> 16) * mul), rtc_f32_bits(half_f32(e) * mul), 0x07060302u);
#endif
}
template <int kShift>
RTC_DEVICE rtc_u32 placed_elems(rtc_u32 h, float mul) {
  constexpr _Float16 kScale = (_Float16)(float)(1u << kShift);
  const _Float16 lo = __builtin_bit_cast(_Float16, (unsigned short)(h & 0xFFFFu)) * kScale;
  const _Float16 hi = __builtin_bit_cast(_Float16, (unsigned short)(h >> 16)) * kScale;
  return pair_elems(
      (rtc_u32) __builtin_bit_cast(unsigned short, lo) | ((rtc_u32) __builtin_bit_cast(unsigned short, hi) << 16), mul);
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

#if RTC_KV_FP8
// Codes 2p and 2p + 1 of the dword x (mags: x & 0x7F7F7F7F): the magnitudes (7 bits) to fp16 bits 7..13.
RTC_DEVICE rtc_u32 fp8x2_elems(rtc_u32 x, rtc_u32 mags, int p) {
  const rtc_u32 h = placed_pair<7>(mags, mags, 0x0C000C00u | ((2u * p + 1u) << 16) | (2u * p), x, x,
                                   ((2u * p + 1u) << 24) | 0x000C000Cu | ((2u * p) << 8));
  return placed_elems < RTC_KV_DTYPE == RTC_KV_DTYPE_FP8_E4M3FNUZ ? 7 : 8 > (h, 1.0f);
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
#else
// E2M1 by table: every magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6) is an fp16 whose low byte is 0, so its high byte
// (0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46) is the whole code, and the 8 of them fill the 8-byte source of a
// v_perm_b32 that takes four 3-bit magnitudes, a byte each, as its selector: four codes' high bytes in one
// instruction, their signs OR-ed into bit 7, then one perm per pair puts two high bytes above zero low bytes.
constexpr rtc_u32 kFp4HighBytes03 = 0x3E3C3800u, kFp4HighBytes47 = 0x46444240u;

// The unit's 8 elements times mul (V: its key's scale; K: 1). lo / hi: the high bytes of the low / high nibbles'
// codes of bytes 0..3, signed (the low nibble's sign is bit 3 of its byte, the high one's bit 7).
RTC_DEVICE rtc_u32x4 unit_elems(const KvUnit& u, float mul) {
  const rtc_u32 lo = perm_b32(kFp4HighBytes47, kFp4HighBytes03, u & 0x07070707u) | ((u << 4) & 0x80808080u);
  const rtc_u32 hi = perm_b32(kFp4HighBytes47, kFp4HighBytes03, (u >> 4) & 0x07070707u) | (u & 0x80808080u);
  rtc_u32x4 w;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const rtc_u32 e = perm_b32(hi, lo, 0x000C000Cu | ((rtc_u32)j << 8) | ((4u + j) << 24));
    w[j] = pair_elems(e, mul);
  }
  return w;
}
#endif
#endif  // RTC_KV_DTYPE

#if !RTC_KV_FP8
// Formats without NaN codes (a cache in q's dtype carries its NaNs as they are; FP4's come from its scale).
RTC_DEVICE rtc_u32 unit_nan_codes(const KvUnit&) { return 0u; }
RTC_DEVICE void fix_nan_elems(rtc_u32x4&) {}
#endif

}  // namespace gdec
