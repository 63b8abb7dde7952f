// The attention backward on CDNA3 matrix cores (gfx942; gfx90a and gfx950 compile the same text): the baseline's
// three stages (bwd_common.h: delta, then dK / dV, then dQ), their products as v_mfma_f32_16x16x16 bf16 / f16.
//
// Four waves a block; a wave owns 16 keys (dK, dV) or 16 query rows (dQ) and keeps their operands in registers, and
// the block's waves share one tile of 16 rows (q, dO) or 16 keys (k, v) at a time in LDS. Every product is computed
// so that its result lands in the layout of the next product's B operand (lane l: column l % 16, rows 4 (l / 16) ..
// + 3), and P, dS go from accumulators to operands without leaving the lane:
//   dK / dV:  S = Q K^T, dP = dO V^T          A: q, dO rows from LDS      B: the wave's K, V in registers
//             dV^T += dO^T P, dK^T += Q^T dS  A: dO, q columns from LDS   B: P, dS as computed
//   dQ:       S^T = K Q^T, dP^T = V dO^T      A: k, v rows from LDS       B: the wave's q, dO in registers
//             dQ^T += K^T dS^T                A: k columns from LDS       B: dS^T as computed
// Each pair's P and dS are bwd_common.h's (pair_p_ds_bits, exp2 on v_exp_f32 as the forward's): rounded to the element type for the products, fp32
// accumulation; dK / dV sum the query heads of the group in order, as the baseline; no atomics (deterministic).
// Score modifications (RTC_SCORE_MOD): P from the modified score, dS through the soft cap's derivative
// (pair_p_ds_mod_bits), the cap's reciprocal on v_rcp_f32.
// Dropout (RTC_DROPOUT; dropout.h): each pair's keep bit drawn again, the forward's (a function of (b, h, row, key)),
// and P, dS from pair_p_ds_drop_bits. A lane makes one Philox call a tile, not one a pair (four), and takes the bits of
// the other calls its pairs lie in (three for dK / dV, one for dQ) from the lanes that made them, by DPP (DropKeep).
#include "platform.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "bwd_common.h"

#ifndef RTC_HEAD_DIM_MAX
#error "RTC_HEAD_DIM_MAX (the head-dim bucket) must be defined"
#endif
#if RTC_HEAD_DIM_MAX % 16 != 0 || RTC_HEAD_DIM_MAX < 16 || RTC_HEAD_DIM_MAX > 256
#error "RTC_HEAD_DIM_MAX must be a multiple of 16 in [16, 256] (the MFMAs' k-steps)"
#endif
#if RTC_KV == RTC_KV_PAGED || RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
#error "the backward takes dense or varlen K / V in q's dtype (a paged or quantized cache takes no gradients)"
#endif

namespace {

using namespace bwd;

constexpr int kThreads = 256;
constexpr int kTile = 16;  // rows or keys of the shared LDS tile; a wave's own rows or keys
constexpr int kBlock = 4 * kTile;  // a block's keys (dK / dV) or query rows (dQ)
constexpr int kD = RTC_HEAD_DIM_MAX;  // the bucket: columns of the tiles, zeros past the call's D
constexpr int kSteps = kD / 16;  // k-steps of the score products, d tiles of the gradient products

#if RTC_DTYPE == RTC_DTYPE_FP16
typedef rtc_f16x4 Frag;
typedef unsigned short FragElem;
RTC_DEVICE rtc_f32x4 mma(Frag a, Frag b, rtc_f32x4 c) { return mfma_16x16x16_f16(a, b, c); }
#else
typedef rtc_bf16x4 Frag;
typedef short FragElem;
RTC_DEVICE rtc_f32x4 mma(Frag a, Frag b, rtc_f32x4 c) { return mfma_16x16x16_bf16(a, b, c); }
#endif

RTC_DEVICE rtc_f32x4 zero4() {
  const rtc_f32x4 z = {0.0f, 0.0f, 0.0f, 0.0f};
  return z;
}

// One LDS tile: 16 rows of kD elements, and (row tiles) their LSE times log2(e) and delta; at, bt: the same rows
// transposed, for the operands that run down a column (col_frag: 4 rows of one column in one 8-byte read). Up to 128 a
// cell is a dword of two elements (row-major: element (r, c) in cell (r kD + c) / 2, the low half for an even c;
// transposed: element (r, c) in cell (c kTile + r) / 2, the low half for an even r), staged and read 4 or 8 bytes at
// a time; past it a cell is one element, row-major only (dword cells there, staged a dword a lane, left clang a
// private segment at 192).
constexpr int kCellElems = kD <= 128 ? 2 : 1;
#if RTC_HEAD_DIM_MAX <= 128
typedef rtc_u32 Cell;
#else
typedef rtc_elem_t Cell;
#endif
typedef rtc_smem<Cell, kTile * kD / kCellElems> RowTile;
typedef rtc_smem<Cell, kD * kTile / kCellElems> ColTile;
// 8-byte aligned (every member's size is a multiple of 8): an operand's two dword cells are one 8-byte read
// (cell_pair), except on gfx950, where clang-22 with 8-byte LDS reads reserved a 36-byte private segment (the window
// dense D 128 variant: no scratch instruction, the frame reserved; docs/NOTES.md).
#if defined(__gfx950__)
#define BWD_TILE_ALIGN
#else
#define BWD_TILE_ALIGN alignas(8)
#endif
struct BWD_TILE_ALIGN Tile {
  RowTile a, b;  // q and dO, or k and v
  ColTile at, bt;
  rtc_smem<float, kTile> lse, delta;
};
// Up to head dim 128 the column operands come from the transposed copy (kColTiles); past it from the row-major tile,
// 2 bytes a read (the copy's stores and the chunked loads left clang a private segment at 192 on gfx950).
constexpr bool kColTiles = kD <= 128;

// Four elements of one row, columns c .. c + 3 (c even), as the dwords w[0], w[1], or zeros when !in (`row` then points
// at any element of the tensor: read and dropped, so that no load is under a branch). Selected a dword at a time.
RTC_DEVICE void row_words(rtc_u32 (&w)[2], const rtc_elem_t* row, bool in) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const rtc_u32 lo = rtc_gld(row + 2 * j), hi = rtc_gld(row + 2 * j + 1);
    w[j] = in ? lo | hi << 16 : 0u;
  }
}

// Past 128: `rows` (>= 1) rows of d elements from base (row stride ss) into a tile, an element a lane at a time, no
// transposed copy (the chunked loads' addresses, held, cost the SGPRs whose spills left clang a private segment at
// 192); the rest of the tile reads as zeros.
RTC_DEVICE void stage_elems(RowTile& dst, const rtc_elem_t* base, rtc_i64 ss, int rows, int d) {
  sreg_fence(ss);
#pragma unroll
  for (int n = 0; n < kTile * kD / kThreads; ++n) {
    const int i = n * kThreads + threadIdx.x, r = i / kD, c = i - r * kD;
    const bool in = r < rows && c < d;
    const rtc_elem_t x = rtc_gld(base + (in ? (rtc_i64)r * ss + c : 0));
    dst.st(i, (Cell)(in ? x : (rtc_elem_t)0));
  }
}

// The block stages two tiles of `rows` (>= 1) rows of d elements at once: tile 0 (sm.a, and transposed into sm.at
// when kT0) from base0 (row stride ss0), tile 1 (sm.b, sm.bt when kT1) from base1; the rest of each tile reads as
// zeros. Up to 128 a lane takes two rows (a pair) x 8 columns of one tile (d is a multiple of 8: all inside or all
// past it): two 16-byte loads, the row-major words as loaded, and each column's pair of rows one dword of the
// transposed tile (a v_perm_b32 each), where single 16-bit stores took a shift, a mask and a store an element.
template <bool kT0, bool kT1>
RTC_DEVICE void stage_tiles(Tile& sm, const rtc_elem_t* base0, rtc_i64 ss0, const rtc_elem_t* base1, rtc_i64 ss1,
                            int rows, int d) {
  if constexpr (kD > 128) {
    stage_elems(sm.a, base0, ss0, rows, d);
    stage_elems(sm.b, base1, ss1, rows, d);
  } else {
    // The strides, opaque at each call: their products with the unrolled rows are not hoisted out of the tile loops
    // and held there (SGPRs past the budget: clang kept scratch for their spills).
    sreg_fence(ss0);
    sreg_fence(ss1);
    constexpr int kUnits = kTile / 2 * (kD / 8);  // a tile's (row pair, 8 columns) units: kD of them
    static_assert(kD > 128 || 2 * kUnits <= kThreads, "a unit a lane");
    const int t = threadIdx.x;
    if (2 * kUnits < kThreads && t >= 2 * kUnits) return;  // below 128: lanes without a unit (whole waves past 64)
    const bool second = t >= kUnits;
    const int u = second ? t - kUnits : t, rp = u / (kD / 8), c0 = (u - rp * (kD / 8)) * 8;
    const rtc_elem_t* base = second ? base1 : base0;
    const rtc_i64 ss = second ? ss1 : ss0;
    rtc_u32 w[2][4];  // rows 2 rp and 2 rp + 1, columns c0 .. c0 + 7
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = 2 * rp + rr;
      const bool in = r < rows && c0 < d;
      const rtc_elem_t* src = base + (in ? (rtc_i64)r * ss + c0 : 0);
      rtc_u32 lo[2], hi[2];
      row_words(lo, src, in);
      row_words(hi, src + 4, in);
      w[rr][0] = lo[0], w[rr][1] = lo[1], w[rr][2] = hi[0], w[rr][3] = hi[1];
    }
    RowTile& dst = second ? sm.b : sm.a;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int j = 0; j < 4; ++j) dst.st(((2 * rp + rr) * kD + c0) / 2 + j, w[rr][j]);
    if (second ? kT1 : kT0) {
      ColTile& dst_t = second ? sm.bt : sm.at;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // columns c0 + 2 j (the words' low halves) and c0 + 2 j + 1 (their high halves), row 2 rp in the low half
        dst_t.st((c0 + 2 * j) * (kTile / 2) + rp, perm_b32(w[1][j], w[0][j], 0x05040100u));
        dst_t.st((c0 + 2 * j + 1) * (kTile / 2) + rp, perm_b32(w[1][j], w[0][j], 0x07060302u));
      }
    }
  }
}

// An operand's two dword cells i, i + 1 (i even): one 8-byte read (`ds_read_b64`, whose 16-bit offset reaches the
// whole tile), but two dword reads on gfx950 (Tile's alignment above).
template <class Cells> RTC_DEVICE void cell_pair(const Cells& t, int i, Cell& lo, Cell& hi) {
#if defined(__gfx950__)
  lo = t.ld(i), hi = t.ld(i + 1);
#else
  t.ld2(i, lo, hi);
#endif
}

// Operands from a tile: 4 elements along a row (columns c0 .. c0 + 3 of row r, c0 a multiple of 4: an A operand's
// k-run of a row-major product), or along a column (rows r0 .. r0 + 3 of column c, r0 a multiple of 4: a transposed
// one).
RTC_DEVICE Frag row_frag(const RowTile& t, int r, int c0) {
  if constexpr (kCellElems == 2) {
    Cell lo, hi;  // (dwords here)
    cell_pair(t, (r * kD + c0) / 2, lo, hi);
    return frag_of_words<Frag>(lo, hi);
  } else {
    Frag f;
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = (FragElem)t.ld(r * kD + c0 + i);
    return f;
  }
}
RTC_DEVICE Frag col_frag(const RowTile& t, const ColTile& tt, int r0, int c) {
  if constexpr (kColTiles) {
    Cell lo, hi;  // (dwords here)
    cell_pair(tt, (c * kTile + r0) / 2, lo, hi);
    return frag_of_words<Frag>(lo, hi);
  } else {
    Frag f;
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = (FragElem)t.ld((r0 + i) * kD + c);
    return f;
  }
}

// A row's B-operand fragments from global memory: columns 16 s + 4 quad .. + 3 of step s (zeros past d, or for a row
// outside the sequence: `row` is then the sequence's first row, read and dropped). No branch a load.
RTC_DEVICE void row_operands(Frag (&f)[kSteps], const rtc_elem_t* row, bool in, int quad, int d) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    int dd = d;  // opaque at each step, as in store_columns
    sreg_fence(dd);
    const int c0 = 16 * s + 4 * quad;
    const bool ok = in && c0 < dd;  // a lane's 4 columns: all inside d or all past it
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const rtc_elem_t x = rtc_gld(row + (ok ? c0 + i : 0));
      f[s][i] = (FragElem)(ok ? x : (rtc_elem_t)0);
    }
  }
}

// Score modifications (RTC_SCORE_MOD: the soft cap, ALiBi; score_mod.h) on the hardware's exp2 and reciprocal, as the
// forward's (op_sources/attention_fwd/gfx942/score_mods.h).
struct HwExp2 {
  RTC_DEVICE float operator()(float x) const { return exp2_f32(x); }
};
struct HwRcp {
  RTC_DEVICE float operator()(float x) const { return rcp_f32(x); }
};
// A stage's score-modification constants, pinned in VGPRs: the stages have VGPRs to spare and, on gfx950, no SGPR
// (held there, clang-22 kept a private segment in window and 192 variants). modded_score's parameter block (the scale
// and the soft cap's constants; the other fields zero, never read); Sq - Sk of the sequence, for a pair's ALiBi
// distance key - (row + Sk - Sq) in 32 bits (exact for a pair of the sequence; unsigned arithmetic, defined for the
// pairs past it, whose P and dS are 0), converted from 32 bits, not 64; the ALiBi slopes of query heads h0, h0 + 1, ..
// (their address and head stride).
struct PairMods {
  AttnParams p;
  int sq_minus_sk;
  const float* slopes;
  rtc_i64 slope_stride;
  RTC_DEVICE int distance(int key, int row) const { return (int)((rtc_u32)key - (rtc_u32)row + (rtc_u32)sq_minus_sk); }
  // Query head h0 + i's slope, log2 domain (0 without ALiBi).
  RTC_DEVICE float slope_log2(int i) const {
    return RTC_ALIBI ? alibi_log2(rtc_gld(slopes + (rtc_i64)i * slope_stride)) : 0.0f;
  }
};
RTC_DEVICE PairMods pair_mods(const AttnParams& view, int b, int h0) {
  PairMods m = {};
  m.p.scale_log2 = view.scale_log2;
  m.p.softcap_exp2 = view.softcap_exp2;
  m.p.softcap_log2 = view.softcap_log2;
  m.sq_minus_sk = view.seq_q - view.seq_k;
  reg_fence(m.p.scale_log2);
  reg_fence(m.p.softcap_exp2);
  reg_fence(m.p.softcap_log2);
  reg_fence(m.sq_minus_sk);
  if (RTC_ALIBI) {
    m.slopes = view.alibi_slopes + alibi_offset(view, b, h0);
    m.slope_stride = view.alibi_sh;
    reg_fence(m.slopes);
    reg_fence(m.slope_stride);
  }
  return m;
}
// The call's parameter block with its tensors' base addresses in VGPRs (the modified and the dropout variants'): the
// kernel arguments q, k, v and o are one 8-SGPR load, which under the modifications' pressure clang rematerialised
// rather than kept, leaving its spill slot behind, a private segment no instruction uses (gfx950's 128 window
// variants, 192; with dropout, gfx950's 192 window dense variant).
RTC_DEVICE AttnParams pinned_bases(const AttnParams& call) {
  AttnParams a = call;
  reg_fence(a.q);
  reg_fence(a.k);
  reg_fence(a.v);
  reg_fence(a.o);
  return a;
}
// One pair's P and dS bits (pair_p_ds_mod_bits) from its raw score s, key - diag = dist: the modified score, then the
// cap's derivative.
RTC_DEVICE void pair_mod_bits(float s, float dp, float lse2, float delta, bool seen, const PairMods& mods,
                              float slope_log2, int dist, rtc_elem_t& p, rtc_elem_t& ds) {
  pair_p_ds_mod_bits(modded_score(s, mods.p, slope_log2, (rtc_i64)dist, 0, HwExp2{}, HwRcp{}), dp, lse2, delta, seen, p,
                     ds, HwExp2{});
}

#if RTC_DROPOUT
// Dropout's keep bits of a lane's four pairs in a tile, one Philox call a lane (dropout.h: a call draws the block of
// rows {i, i + 8} (i % 16 < 8) x keys {j, j + 1, j + 8, j + 9} (j % 16 even, < 8)). A tile's first row and first
// key are multiples of 16, so a lane's column (col = lane % 16) and quad fix its pairs' place in their blocks:
//   dK / dV (S's column `key` = the tile's key col, rows 4 quad + r): the lanes col, col ^ 1, col ^ 8, col ^ 9 of a
//     quad hold keys of one block in each of their four rows, and the lane with (col % 2, (col / 8) % 2) = (x, y)
//     draws the block of row 4 quad + 2 x + y; quads q and q ^ 2 hold its two rows, so of its eight halves the four of
//     the quad's row go to the four lanes: a nibble, placed at 4 (2 x + y), gathered by an OR with the lane ^ 1 (DPP
//     quad_perm) and then the lane ^ 8 (DPP row_ror:8) values.
//   dQ (S^T's column `row` = the tile's row col, keys 4 quad + r): keys 4 quad, 4 quad + 1 lie in one block and
//     4 quad + 2, 4 quad + 3 in the next, each shared with row col ^ 8 (lane ^ 8); the lane with (col / 8) % 2 = y
//     draws the block of keys 4 quad + 2 y, and the four halves of rows col, col ^ 8 go to the two lanes: a nibble at
//     4 y, gathered by an OR with the lane ^ 8 value.
// Bit 4 g + 2 y' + x' of the gathered word: block g's element of the row (dK / dV: the key) with (i / 8) % 2 = y'
// ((j / 8) % 2) and the key with j % 2 = x'.
struct DropKeep {
  DropoutState state;
  rtc_u32 threshold;
  int heads, b;

  // dropout_kept(d, half, threshold), the word picked by selects: indexed by a lane's value, the draws went to a
  // private array (promoted to LDS, or scratch).
  RTC_DEVICE bool kept(const Philox4& d, int half) const {
    const rtc_u32 w = half & 4 ? (half & 2 ? d.v[3] : d.v[2]) : (half & 2 ? d.v[1] : d.v[0]);
    return ((half & 1) ? (w >> 16) : (w & 0xFFFFu)) >= threshold;
  }

  // The kept bit of each of the draws' four halves of row i (keys j, j + 1, j + 8, j + 9 with j % 16 even < 8, or
  // any key of the block): bit 2 ((key / 8) % 2) + key % 2.
  RTC_DEVICE rtc_u32 row_nibble(const Philox4& d, int i, int j) const {
    rtc_u32 nib = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kj = (j & ~9) | (e >> 1) << 3 | (e & 1);
      nib |= (rtc_u32)kept(d, dropout_half(i, kj)) << e;
    }
    return nib;
  }
  // The same for key j: bit 2 ((row / 8) % 2) + key % 2, rows i % 8 and i % 8 + 8 of i's 16-row group, keys j, j + 1
  // (j even).
  RTC_DEVICE rtc_u32 key_nibble(const Philox4& d, int i, int j) const {
    rtc_u32 nib = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ri = (i & ~8) | (e >> 1) << 3, kj = j + (e & 1);
      nib |= (rtc_u32)kept(d, dropout_half(ri, kj)) << e;
    }
    return nib;
  }
  // dK / dV: bit r, whether the pair (row i0 + 4 quad + r, key) is kept (i0 a multiple of 16, key % 16 = col).
  RTC_DEVICE rtc_u32 dkdv_bits(int h, int i0, int key, int col, int quad) const {
    const int x = col & 1, y = (col >> 3) & 1;
    const Philox4 d = dropout_draws(state, heads, b, h, i0 + 4 * quad + 2 * x + y, key);
    rtc_u32 w = row_nibble(d, i0 + 4 * quad + 2 * x + y, key) << (4 * (2 * x + y));
    w |= dpp_mov<0xB1>(0u, w);  // quad_perm [1, 0, 3, 2]: lane ^ 1
    w |= dpp_mov<0x128>(0u, w);  // row_ror:8: lane ^ 8
    const rtc_u32 mine = w >> (2 * y + x);
    return (mine & 1u) | (mine >> 3 & 2u) | (mine >> 6 & 4u) | (mine >> 9 & 8u);
  }
  // dQ: bit r, whether the pair (row, key j0 + 4 quad + r) is kept (j0 a multiple of 16, row % 16 = col).
  RTC_DEVICE rtc_u32 dq_bits(int h, int row, int j0, int col, int quad) const {
    const int y = (col >> 3) & 1;
    const Philox4 d = dropout_draws(state, heads, b, h, row, j0 + 4 * quad + 2 * y);
    rtc_u32 w = key_nibble(d, row, j0 + 4 * quad + 2 * y) << (4 * y);
    w |= dpp_mov<0x128>(0u, w);  // row_ror:8: lane ^ 8
    const rtc_u32 mine = w >> (2 * y);
    return (mine & 3u) | (mine >> 2 & 12u);
  }
};
// The stage's DropKeep, and the kept elements' factor, pinned in VGPRs: held in SGPRs beside the stage's own, they
// left clang spilling SGPRs into a private segment.
RTC_DEVICE DropKeep drop_keep(const AttnParams& view, int b, float& drop_scale) {
  DropKeep k = {dropout_state(view), view.drop_threshold, view.heads, b};
  drop_scale = view.drop_scale;
  reg_fence(k.state.seed);
  reg_fence(k.state.offset);
  reg_fence(k.threshold);
  reg_fence(k.heads);
  reg_fence(k.b);
  reg_fence(drop_scale);
  return k;
}
// One pair's P and dS bits with dropout (pair_p_ds_drop_bits) from its raw score s: the modified score (score_mod.h,
// with the variant's modifications; plain: s scale log2(e)).
#if RTC_SCORE_MOD
RTC_DEVICE SoftcapScore drop_score(float s, const PairMods& mods, float slope_log2, int dist) {
  return modded_score(s, mods.p, slope_log2, (rtc_i64)dist, 0, HwExp2{}, HwRcp{});
}
#endif
#endif

// Four elements' bits as an operand (P or dS).
RTC_DEVICE Frag to_frag(const rtc_elem_t (&x)[4]) {
  Frag f;
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = (FragElem)x[i];
  return f;
}

// Gradient tiles: acc[t] holds rows 16 t + 4 quad .. + 3 (head-dim columns) of one key's or row's gradient,
// times `scale`, rounded, stored at dst (its row of the gradient tensor).
RTC_DEVICE void store_columns(rtc_elem_t* dst, const rtc_f32x4 (&acc)[kSteps], float scale, int quad, int d) {
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
    // A lane's 4 columns are all inside d or all past it (d is a multiple of 8): one test a group. d, opaque here
    // at each group, keeps the compiler from computing every group's lane mask first and holding them all (SGPRs
    // past the budget).
    int dd = d;
    sreg_fence(dd);
    if (16 * t + 4 * quad < dd)
#pragma unroll
      for (int r = 0; r < 4; ++r) rtc_gst(dst + 16 * t + 4 * quad + r, to_elem(acc[t][r] * scale));
  }
}

// 64 keys of K/V head hk, 16 a wave: every row tile of every query head of the group that reaches them.
RTC_DEVICE void dkdv_stage(Tile& sm, const BwdParams& bp) {
#if RTC_SCORE_MOD || RTC_DROPOUT
  const AttnParams a = pinned_bases(bp.a);
#else
  const AttnParams& a = bp.a;
#endif
  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kBlock;
  const Seq seq = seq_of(a, b);
  if (j0 >= seq.len_k) return;  // the block's, uniform
  const AttnParams view = seq_view(a, seq);
  const int lane = threadIdx.x % 64, wave = threadIdx.x / 64, col = lane % 16, quad = lane / 16;
  const int d = view.head_dim, wj0 = j0 + kTile * wave, key = wj0 + col;  // this lane's key: its column of S, P, dS
  const bool key_in = key < view.seq_k;
  Frag kf[kSteps], vf[kSteps];
  const int key_row = key_in ? key : 0;  // a key past the sequence reads key 0's row (dropped)
  row_operands(kf, a.k + row_at(a.k_sb, a.k_ss, b, seq.k_row, key_row) + (rtc_i64)hk * a.k_sh, key_in, quad, d);
  row_operands(vf, a.v + row_at(a.v_sb, a.v_ss, b, seq.k_row, key_row) + (rtc_i64)hk * a.v_sh, key_in, quad, d);
  rtc_f32x4 dk[kSteps], dv[kSteps];
#pragma unroll
  for (int t = 0; t < kSteps; ++t) dk[t] = dv[t] = zero4();
  const int group = view.heads / view.heads_k, j_last = (view.seq_k < j0 + kBlock ? view.seq_k : j0 + kBlock) - 1;
#if RTC_SCORE_MOD
  const PairMods mods = pair_mods(view, b, hk * group);
#endif
#if RTC_DROPOUT
  float drop_scale;
  const DropKeep drop = drop_keep(view, b, drop_scale);
#endif
  for (int gi = 0; gi < group; ++gi) {
#if RTC_SCORE_MOD
    const float slope_log2 = mods.slope_log2(gi);  // query head hk group + gi's
#endif
    for (int i0 = 0; i0 < view.seq_q; i0 += kTile) {
      const int h = hk * group + gi, rows = view.seq_q - i0 < kTile ? view.seq_q - i0 : kTile;
      // Windows move right with the row: a tile whose last row ends before the block's keys, or whose first row
      // starts after them, sees none of them.
      if (RTC_MASK && (key_range(view, i0 + rows - 1).hi < j0 || key_range(view, i0).lo > j_last)) continue;
      __syncthreads();  // the previous row tile is no longer read
      stage_tiles<kColTiles, kColTiles>(
          sm, a.q + row_at(a.q_sb, a.q_ss, b, seq.q_row, i0) + (rtc_i64)h * a.q_sh, a.q_ss,
          bp.dout + row_at(bp.do_sb, bp.do_ss, b, seq.q_row, i0) + (rtc_i64)h * bp.do_sh, bp.do_ss, rows, d);
      if ((int)threadIdx.x < kTile) {
        const int r = threadIdx.x;
        const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + i0 + r;
        sm.lse.st(r, r < rows ? rtc_gld(a.lse + at) * kLog2e : neg_inf());
        sm.delta.st(r, r < rows ? rtc_gld(bp.delta + at) : 0.0f);
      }
      __syncthreads();
      rtc_f32x4 s = zero4(), dp = zero4();
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        s = mma(row_frag(sm.a, col, 16 * st + 4 * quad), kf[st], s);
        dp = mma(row_frag(sm.b, col, 16 * st + 4 * quad), vf[st], dp);
      }
      // Lane l holds rows 4 quad + r of its key's column.
      const Pairs pairs{window_of(view), i0, wj0};
      rtc_elem_t p[4], ds[4];
#if RTC_DROPOUT
      const rtc_u32 keep = drop.dkdv_bits(h, i0, key, col, quad);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#if RTC_SCORE_MOD
        const SoftcapScore t = drop_score(s[r], mods, slope_log2, mods.distance(key, i0 + 4 * quad + r));
#else
        const SoftcapScore t = {s[r] * view.scale_log2, 0.0f};
#endif
        pair_p_ds_drop_bits(t, dp[r], sm.lse.ld(4 * quad + r), sm.delta.ld(4 * quad + r), pairs.seen(4 * quad + r, col),
                            (keep >> r & 1u) != 0, drop_scale, p[r], ds[r], HwExp2{});
      }
#elif RTC_SCORE_MOD
#pragma unroll
      for (int r = 0; r < 4; ++r)
        pair_mod_bits(s[r], dp[r], sm.lse.ld(4 * quad + r), sm.delta.ld(4 * quad + r), pairs.seen(4 * quad + r, col),
                      mods, slope_log2, mods.distance(key, i0 + 4 * quad + r), p[r], ds[r]);
#else
#pragma unroll
      for (int r = 0; r < 4; ++r)
        pair_p_ds_bits(s[r], dp[r], sm.lse.ld(4 * quad + r), sm.delta.ld(4 * quad + r), pairs.seen(4 * quad + r, col),
                       view.scale_log2, p[r], ds[r], exp2_f32);
#endif
      const Frag pf = to_frag(p), dsf = to_frag(ds);
#pragma unroll
      for (int t = 0; t < kSteps; ++t) {
        dv[t] = mma(col_frag(sm.b, sm.bt, 4 * quad, 16 * t + col), pf, dv[t]);
        dk[t] = mma(col_frag(sm.a, sm.at, 4 * quad, 16 * t + col), dsf, dk[t]);
      }
    }
  }
  if (!key_in) return;
  store_columns(bp.dk + row_at(bp.dk_sb, bp.dk_ss, b, seq.k_row, key) + (rtc_i64)hk * bp.dk_sh, dk, view.scale, quad,
                d);
  store_columns(bp.dv + row_at(bp.dv_sb, bp.dv_ss, b, seq.k_row, key) + (rtc_i64)hk * bp.dv_sh, dv, 1.0f, quad, d);
}

// 64 query rows of head h, 16 a wave: every key tile their windows reach.
RTC_DEVICE void dq_stage(Tile& sm, const BwdParams& bp) {
#if RTC_SCORE_MOD || RTC_DROPOUT
  const AttnParams a = pinned_bases(bp.a);
#else
  const AttnParams& a = bp.a;
#endif
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlock;
  const Seq seq = seq_of(a, b);
  if (i0 >= seq.len_q) return;  // the block's, uniform
  const AttnParams view = seq_view(a, seq);
  const int lane = threadIdx.x % 64, wave = threadIdx.x / 64, col = lane % 16, quad = lane / 16;
  const int d = view.head_dim, wi0 = i0 + kTile * wave, row = wi0 + col;  // this lane's row: its column of S^T
  const bool row_in = row < view.seq_q;
  Frag qf[kSteps], df[kSteps];
  const int q_row = row_in ? row : 0;  // a row past the sequence reads row 0 (dropped)
  row_operands(qf, a.q + row_at(a.q_sb, a.q_ss, b, seq.q_row, q_row) + (rtc_i64)h * a.q_sh, row_in, quad, d);
  row_operands(df, bp.dout + row_at(bp.do_sb, bp.do_ss, b, seq.q_row, q_row) + (rtc_i64)h * bp.do_sh, row_in, quad, d);
  const rtc_i64 at = seq.lse_off + (rtc_i64)h * seq.lse_head_stride + row;
  const float lse2 = row_in ? rtc_gld(a.lse + at) * kLog2e : neg_inf(), delta = row_in ? rtc_gld(bp.delta + at) : 0.0f;
  rtc_f32x4 dq[kSteps];
#pragma unroll
  for (int t = 0; t < kSteps; ++t) dq[t] = zero4();
  const int rows = view.seq_q - i0 < kBlock ? view.seq_q - i0 : kBlock, hk = kv_head(view, h);
#if RTC_SCORE_MOD
  const PairMods mods = pair_mods(view, b, h);
  const float slope_log2 = mods.slope_log2(0);
#endif
#if RTC_DROPOUT
  float drop_scale;
  const DropKeep drop = drop_keep(view, b, drop_scale);
#endif
  int kv_begin = 0, kv_end = view.seq_k;
  if (RTC_MASK) {
    const KeyRange first = key_range(view, i0), last = key_range(view, i0 + rows - 1);
    kv_begin = (int)(first.lo / kTile) * kTile;
    kv_end = last.hi < first.lo ? kv_begin : (int)last.hi + 1;  // no row sees a key: no tile
  }
  for (int j0 = kv_begin; j0 < kv_end; j0 += kTile) {
    const int keys = view.seq_k - j0 < kTile ? view.seq_k - j0 : kTile;
    __syncthreads();  // the previous key tile is no longer read
    // V's transposed copy is not read: written all the same, so that no wave's path branches on its tile (the waves
    // staging K write K's, as many stores).
    stage_tiles<kColTiles, kColTiles>(sm, a.k + row_at(a.k_sb, a.k_ss, b, seq.k_row, j0) + (rtc_i64)hk * a.k_sh, a.k_ss,
                                      a.v + row_at(a.v_sb, a.v_ss, b, seq.k_row, j0) + (rtc_i64)hk * a.v_sh, a.v_ss,
                                      keys, d);
    __syncthreads();
    rtc_f32x4 st = zero4(), dpt = zero4();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      st = mma(row_frag(sm.a, col, 16 * s + 4 * quad), qf[s], st);
      dpt = mma(row_frag(sm.b, col, 16 * s + 4 * quad), df[s], dpt);
    }
    // Lane l holds keys 4 quad + r of its row's column.
    const Pairs pairs{window_of(view), wi0, j0};
    rtc_elem_t p[4], ds[4];
#if RTC_DROPOUT
    const rtc_u32 keep = drop.dq_bits(h, row, j0, col, quad);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#if RTC_SCORE_MOD
      const SoftcapScore t = drop_score(st[r], mods, slope_log2, mods.distance(j0 + 4 * quad + r, row));
#else
      const SoftcapScore t = {st[r] * view.scale_log2, 0.0f};
#endif
      pair_p_ds_drop_bits(t, dpt[r], lse2, delta, pairs.seen(col, 4 * quad + r), (keep >> r & 1u) != 0, drop_scale,
                          p[r], ds[r], HwExp2{});
    }
#elif RTC_SCORE_MOD
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pair_mod_bits(st[r], dpt[r], lse2, delta, pairs.seen(col, 4 * quad + r), mods, slope_log2,
                    mods.distance(j0 + 4 * quad + r, row), p[r], ds[r]);
#else
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pair_p_ds_bits(st[r], dpt[r], lse2, delta, pairs.seen(col, 4 * quad + r), view.scale_log2, p[r], ds[r], exp2_f32);
#endif
    const Frag dsf = to_frag(ds);
#pragma unroll
    for (int t = 0; t < kSteps; ++t) dq[t] = mma(col_frag(sm.a, sm.at, 4 * quad, 16 * t + col), dsf, dq[t]);
  }
  if (!row_in) return;
  store_columns(bp.dq + row_at(bp.dq_sb, bp.dq_ss, b, seq.q_row, row) + (rtc_i64)h * bp.dq_sh, dq, view.scale, quad, d);
}

}  // namespace

// Up to head dim 128, at least two waves a SIMD (blocks a CU): the bound keeps a wave's registers to 256 (no AGPR
// copies of the accumulators either), and another wave issues while one waits (the static model: one wave alone is
// bound by its own instruction issue, python -m rtcattn isa --backward-model). At 192 the bound left clang a 36-byte
// private segment (gfx942, gfx950): one wave there.
#if defined(RTC_EMU) || RTC_HEAD_DIM_MAX > 128
#define BWD_OCCUPANCY
#else
#define BWD_OCCUPANCY __attribute__((amdgpu_waves_per_eu(2)))
#endif
RTC_KERNEL(256) BWD_OCCUPANCY attention_bwd_gfx942(BwdParams bp) {
  RTC_SHARED(Tile, sm);
  if (bp.stage == BWD_STAGE_DELTA)
    delta_stage(bp, kThreads);
  else if (bp.stage == BWD_STAGE_DKDV)
    dkdv_stage(sm, bp);
  else
    dq_stage(sm, bp);
}
RTC_EXPORT_KERNEL(attention_bwd_gfx942, BwdParams)
