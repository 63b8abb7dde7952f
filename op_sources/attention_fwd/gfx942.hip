// bf16 attention forward for MI300X (gfx942; also gfx90a): 8 waves in two phase-offset groups, MFMA 16x16x16, K in
// LDS, V^T via L1.
//
// One workgroup = 384 q rows of one (batch, head); wave w owns rows 48w..48w+47 as three 16-row
// tiles (two in VGPRs, the third in LDS). KV is walked in 64-row blocks. We compute S^T = K Q^T,
// so each lane's S^T fragment is already the B operand of O^T = V^T P^T: P never leaves
// registers. The price is V^T, written by the companion stage GFX942_STAGE_VT into the workspace.
//
// Schedule: every wave runs the same loop, "MFMA step; barrier; softmax step; barrier", and waves
// 4..7 (group B) pass one extra barrier first, so at any moment one group feeds the matrix core
// while the other does softmax and memory traffic (see NOTES.md, gfx942):
//   half-step 2k   : A: PV(k-1) + QK(k)            B: softmax(k-1) + K[k+1] HBM -> LDS
//   half-step 2k+1 : A: softmax(k) + V^T(k) -> L1  B: PV(k-1) + QK(k)
// One stage per launch (params.stage): V^T, attention (whole items and tail-split parts), merge.
// Packed sequences (RTC_KV, gfx942/sequences.h): an item is a q block of one (sequence, head), the
// grid covers max_seqlen_q, and paged K/V rows come through per-page buffer resources.
#include "platform.h"
#include "attn_params.h"
#include "bf16_round.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "gfx942/params.h"
#include "gfx942/tiles.h"
#include "gfx942/softmax.h"
#include "gfx942/companions.h"
#include "gfx942/sequences.h"

#ifndef RTC_HEAD_DIM_MAX
#define RTC_HEAD_DIM_MAX 128
#endif
#if RTC_HEAD_DIM_MAX != 128
#error "attention_fwd_gfx942 is built for head dim 128 only (RTC_HEAD_DIM_MAX=128)"
#endif
#if RTC_DTYPE != RTC_DTYPE_BF16
#error "attention_fwd_gfx942 reads and writes bf16 only (RTC_DTYPE=0); the manifest sends fp16 calls to the baseline"
#endif

namespace g942 {

// Registers of one wave: O^T accumulators, scores, P, two Q tiles.
struct Acc {
  rtc_f32x4 o[kTilesPerWave][kHdTiles];
  rtc_f32x4 s[kTilesPerWave][kSub];
  rtc_bf16x4 p[kTilesPerWave][kSub];
  rtc_bf16x4 q[2][kDSteps];
};

struct Work {
  int b, h, bh, q0, rows;  // q rows [q0, q0 + rows) of (b, h)
  int kb0, kb1;            // kv blocks of this workgroup
  int part;                // -1: whole item, written to O; else split part index (partials)
  int fb, fe;              // RTC_MASK: blocks [fb, fe) every row sees fully (unmasked steps)
};

// Identity except on gfx90a, whose compiler keeps these division results in VGPRs (isa_ext.h).
RTC_DEVICE void make_uniform(Work& w) {
  w.b = uniform_i32(w.b);
  w.h = uniform_i32(w.h);
  w.bh = uniform_i32(w.bh);
  w.q0 = uniform_i32(w.q0);
  w.rows = uniform_i32(w.rows);
  w.kb0 = uniform_i32(w.kb0);
  w.kb1 = uniform_i32(w.kb1);
  w.part = uniform_i32(w.part);
  w.fb = uniform_i32(w.fb);
  w.fe = uniform_i32(w.fe);
}

// Whole items first (XCD swizzle: the hardware deals workgroup i to XCD i % 8, so we hand XCD x
// a run of consecutive items, i.e. the q blocks of the same heads, which then share its L2).
RTC_DEVICE Work find_work(const Gfx942Params& p) {
  const int i = blockIdx.x;
  Work w;
  int item;
  w.part = -1;
  if (i < p.n_prefix) {
    item = i < p.n_swz ? (i & 7) * (p.n_swz >> 3) + (i >> 3) : i;
  } else {
    const int k = i - p.n_prefix, j = k / p.split_g;
    w.part = k;
    item = p.n_prefix + j;
  }
  w.bh = item / p.nqb;
  w.b = w.bh / p.heads;
  w.h = w.bh - w.b * p.heads;
  w.q0 = item_q0(p, item);
  w.rows = p.seq_q - w.q0 < GFX942_Q_ROWS ? p.seq_q - w.q0 : GFX942_Q_ROWS;
  // The item's own blocks; a split part takes its share of them (possibly none).
  const KvSpan sp = kv_span(p, w.q0, w.rows, GFX942_KV_ROWS, RTC_MASK);
  const int n = sp.end - sp.begin, g = w.part >= 0 ? (i - p.n_prefix) % p.split_g : 0;
  w.kb0 = sp.begin + (w.part >= 0 ? (int)((rtc_i64)g * n / p.split_g) : 0);
  w.kb1 = w.part >= 0 ? sp.begin + (int)((rtc_i64)(g + 1) * n / p.split_g) : sp.end;
  w.fb = sp.full_begin;
  w.fe = sp.full_end;
  // Identity except on gfx90a, whose compiler keeps these division results in VGPRs (isa_ext.h).
  // Written out, not make_uniform(w): the call moves clang 19's SGPR count of the dense kernel.
  w.b = uniform_i32(w.b);
  w.h = uniform_i32(w.h);
  w.bh = uniform_i32(w.bh);
  w.q0 = uniform_i32(w.q0);
  w.rows = uniform_i32(w.rows);
  w.kb0 = uniform_i32(w.kb0);
  w.kb1 = uniform_i32(w.kb1);
  w.part = uniform_i32(w.part);
  w.fb = uniform_i32(w.fb);
  w.fe = uniform_i32(w.fe);
  return w;
}

// Packed sequences: workgroup i runs q block nqb - 1 - i / (B*H) of (b, h) = i % (B*H). The high q
// blocks exist only in the longest sequences (and see the most keys under a causal mask), so the
// longest work starts first without the host reading a length; a block past its sequence's end has
// rows <= 0 and exits. No split, no swizzle (a swizzle would deal the longest items to one XCD).
// Masks and kv blocks follow the sequence's own lengths: all its keys, whatever max_seqlen_k says.
RTC_DEVICE Work find_packed_work(const Gfx942Params& p, Seq& seq) {
  const int i = blockIdx.x, bhn = p.batch * p.heads, from_last = i / bhn;
  Work w;
  w.part = -1;
  w.bh = i - from_last * bhn;
  w.b = w.bh / p.heads;
  w.h = w.bh - w.b * p.heads;
  w.q0 = (p.nqb - 1 - from_last) * GFX942_Q_ROWS;
  seq = seq_of(p, w.b);
  w.rows = seq.len_q - w.q0 < GFX942_Q_ROWS ? seq.len_q - w.q0 : GFX942_Q_ROWS;
  const KvSpan sp = kv_span(seq_view(p, seq), w.q0, w.rows, GFX942_KV_ROWS, RTC_MASK);
  w.kb0 = sp.begin;
  w.kb1 = sp.end;
  w.fb = sp.full_begin;
  w.fe = sp.full_end;
  make_uniform(w);
  return w;
}

// Where the item's K rows come from: one buffer resource over its sequence's rows of its K/V head,
// or (paged) the block table, one page's resource per 16-row group.
#if RTC_KV == RTC_KV_PAGED
using KRows = PagedRows;
#else
using KRows = rtc_buffer_rsrc;
#endif
RTC_DEVICE KRows k_rows(const Gfx942Params& p, const Seq& s, int b, int hk) {
#if RTC_KV == RTC_KV_PAGED
  return paged_rows(p, p.k, p.k_sb, p.k_ss, p.k_sh, b, hk, s.len_k);
#else
  return uniform_rsrc(p.k + s.k_off + (rtc_i64)hk * p.k_sh, rows_span_bytes(s.len_k, p.k_ss));
#endif
}

// The item's V^T blocks in the workspace (written by the V^T stage).
RTC_DEVICE const char* vt_blocks(const Gfx942Params& p, const Work& w, const Seq& s, int hk) {
#if RTC_KV == RTC_KV_DENSE
  return (const char*)p.workspace + ((rtc_i64)w.b * p.heads_k + hk) * p.nkb * GFX942_VT_BLOCK_BYTES;
#else
  return (const char*)p.workspace +
         ((rtc_i64)hk * p.vt_head_blocks + vt_first_block(p, w.b, s)) * GFX942_VT_BLOCK_BYTES;
#endif
}

// Stage 0 (prologue): Q tiles 0-1 into VGPRs, tile 2 into this wave's LDS slot. Rows past Sq
// load as zeros and are never stored.
RTC_DEVICE void load_q(Acc& a, AttnSmem& sm, rtc_buffer_rsrc qr, rtc_i64 q_ss, int rows, int wave, int lane) {
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    const int r = 48 * wave + 16 * g + (lane & 15);
#pragma unroll
    for (int ds = 0; ds < kDSteps; ++ds) {
      rtc_u32x2 w = {0u, 0u};
      if (r < rows) w = buffer_load_dwordx2(qr, (rtc_u32)(r * q_ss * 2 + (16 * ds + 4 * (lane >> 4)) * 2), 0u);
      const rtc_bf16x4 f = as_bf16x4(w[0], w[1]);
      if (g < 2)
        a.q[g][ds] = f;
      else
        ds_write<rtc_bf16x4>(&sm.q3[wave][ds][lane], f);
    }
  }
}

// K block -> LDS buffer by DMA: each of the 4 waves of group B moves 16 rows, one row (64 lanes x
// 4 bytes) per instruction, swizzled on the global side.
// Paged: a 16-row group never straddles a page (pages hold a multiple of 16 rows), so it is one
// page's resource; a page id outside the pool reads zeros.
RTC_DEVICE void issue_k(AttnSmem& sm, const KRows& k, rtc_i64 k_ss, int kb, int buf, int wave4, int lane) {
  rtc_u32 l = (rtc_u32)lane, row_bytes = readfirstlane((rtc_u32)(k_ss * 2));
#if RTC_KV == RTC_KV_PAGED
  const int j0 = kb * GFX942_KV_ROWS + wave4 * 16;
  const rtc_buffer_rsrc kr = page_rsrc(k, j0);
  rtc_u32 soff = readfirstlane(page_row_byte(k, j0));
#else
  const rtc_buffer_rsrc kr = k;
  rtc_u32 soff = readfirstlane((rtc_u32)(((rtc_i64)kb * GFX942_KV_ROWS + wave4 * 16) * k_ss * 2));
#endif
  rtc_u32 dst = readfirstlane((rtc_u32)((buf * GFX942_KV_ROWS + wave4 * 16) * kKRowDwords * 4));
  // Fenced here, so the 16 swizzled offsets and M0 values are recomputed per call instead of
  // being hoisted out of the kv loop and held (spilled) across it.
  reg_fence(l);
  sreg_fence(row_bytes);
  sreg_fence(soff);
  sreg_fence(dst);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    buffer_load_dword_lds(kr, k_dma_src_byte((int)l, j), soff, (char*)&sm.k[0][0] + dst);
    soff += row_bytes;
    dst += kKRowDwords * 4;
  }
}

// Pins O and one of S / P (the other is dead at that point: fencing it would keep it alive).
RTC_DEVICE void fence_acc(Acc& a, bool scores) {
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
#pragma unroll
    for (int t = 0; t < kHdTiles; ++t) reg_fence(a.o[g][t]);
#pragma unroll
    for (int s = 0; s < kSub; ++s) {
      if (scores)
        reg_fence(a.s[g][s]);
      else
        reg_fence(a.p[g][s]);
    }
  }
}

// Ring loads. The offset passes through a register fence first, which is ordered with the MFMA
// asm statements: so a load is issued where the ring puts it, not hoisted to the top of the step
// (the compiler would otherwise start all 32 K reads at once and spill).
RTC_DEVICE rtc_u32x4 vt_chunk(rtc_buffer_rsrc vt, int c, int lane, rtc_u32 vt_off) {
  rtc_u32 l = (rtc_u32)lane;
  reg_fence(l);
  return buffer_load_dwordx4(vt, vt_chunk_byte(c >> 1, c & 1, (int)l), vt_off);
}
RTC_DEVICE void qk_frags(const AttnSmem& sm, int buf, int ds, int wave, int lane, rtc_bf16x4 (&kf)[kSub],
                         rtc_bf16x4& q3) {
  rtc_u32 l = (rtc_u32)lane;
  reg_fence(l);
  q3 = ds_read<rtc_bf16x4>(&sm.q3[wave][ds][l]);
#pragma unroll
  for (int s = 0; s < kSub; ++s)
    kf[s] = ds_read<rtc_bf16x4>((const char*)&sm.k[0][0] + k_frag_byte(buf, s, ds, (int)l));
}

// Stage 1 of an iteration: O^T += V^T(k-1) P^T(k-1), then S^T(k) = K(k) Q^T.
RTC_DEVICE void mfma_step(Acc& a, const AttnSmem& sm, rtc_buffer_rsrc vt, rtc_u32 vt_off, int buf, bool pv, bool qk,
                          int wave, int lane) {
  s_setprio<3>();
  fence_acc(a, false);  // every VALU write of O and P is above this line ...
  mfma_wait_read();     // ... and 2 wait states before the first MFMA reads them
  if (pv) {
    // V^T chunks through a 3-deep ring: chunk c+2 is requested while chunk c feeds 6 MFMAs.
    rtc_u32x4 v[3];
    v[0] = vt_chunk(vt, 0, lane, vt_off);
    v[1] = vt_chunk(vt, 1, lane, vt_off);
#pragma unroll
    for (int c = 0; c < 2 * kHdTiles; ++c) {
      if (c + 2 < 2 * kHdTiles) v[(c + 2) % 3] = vt_chunk(vt, c + 2, lane, vt_off);
      const int t = c >> 1, sp = c & 1;
      const rtc_bf16x4 f0 = as_bf16x4(v[c % 3][0], v[c % 3][1]), f1 = as_bf16x4(v[c % 3][2], v[c % 3][3]);
#pragma unroll
      for (int g = 0; g < kTilesPerWave; ++g) mfma_acc(a.o[g][t], f0, a.p[g][2 * sp]);
#pragma unroll
      for (int g = 0; g < kTilesPerWave; ++g) mfma_acc(a.o[g][t], f1, a.p[g][2 * sp + 1]);
    }
  }
  if (qk) {
    // K and Q3 fragments through a 2-deep ring: step ds+1 is read while step ds feeds 12 MFMAs.
    rtc_bf16x4 kf[2][kSub], q3[2];
    qk_frags(sm, buf, 0, wave, lane, kf[0], q3[0]);
#pragma unroll
    for (int ds = 0; ds < kDSteps; ++ds) {
      const int c = ds & 1;
      if (ds + 1 < kDSteps) qk_frags(sm, buf, ds + 1, wave, lane, kf[c ^ 1], q3[c ^ 1]);
#pragma unroll
      for (int s = 0; s < kSub; ++s) {
        if (ds == 0) {
          a.s[0][s] = mfma_16x16x16_bf16_zc(kf[c][s], a.q[0][0]);
          a.s[1][s] = mfma_16x16x16_bf16_zc(kf[c][s], a.q[1][0]);
          a.s[2][s] = mfma_16x16x16_bf16_zc(kf[c][s], q3[c]);
        } else {
          mfma_acc(a.s[0][s], kf[c][s], a.q[0][ds]);
          mfma_acc(a.s[1][s], kf[c][s], a.q[1][ds]);
          mfma_acc(a.s[2][s], kf[c][s], q3[c]);
        }
      }
    }
  }
  mfma_wait_result();  // 7 (gfx90a: 11) wait states after the last MFMA ...
  fence_acc(a, true);  // ... before any VALU/DS/VMEM touches O or S
  s_setprio<0>();
}

// Where the epilogue writes, built before the kv loop so that only these few uniform values (not
// the whole parameter block) stay in SGPRs across it.
struct OutPlan {
  rtc_buffer_rsrc o;   // this q block's O rows
  rtc_u32 o_row_bytes;
  char* aux;           // split part: its partials; whole item: LSE of row q0 (null: not requested)
  int rows;            // valid rows, | kSplitFlag for a split part (one SGPR fewer: gfx90a is at the limit)
};
constexpr int kSplitFlag = 1 << 16;

RTC_DEVICE OutPlan out_plan(const Gfx942Params& p, const Work& w, const Seq& s) {
  OutPlan op;
  op.o = uniform_rsrc(p.o + s.o_off + (rtc_i64)w.h * p.o_sh + (rtc_i64)w.q0 * p.o_ss, rows_span_bytes(w.rows, p.o_ss));
  op.o_row_bytes = (rtc_u32)(p.o_ss * 2);
  if (w.part >= 0)
    op.aux = (char*)p.workspace + p.vt_bytes + (rtc_i64)w.part * GFX942_PART_BYTES;
  else if (RTC_KV == RTC_KV_DENSE)
    op.aux = p.lse ? (char*)(p.lse + ((rtc_i64)w.b * p.heads + w.h) * p.seq_q + w.q0) : nullptr;
  else  // packed: [heads, total_q]
    op.aux = p.lse ? (char*)(p.lse + s.lse_off + (rtc_i64)w.h * s.lse_head_stride + w.q0) : nullptr;
  op.rows = w.rows | (w.part >= 0 ? kSplitFlag : 0);
  return op;
}

// Whether the rows of a workgroup see keys, for the epilogue (ZeroSumRow). Uniform values only, so
// nothing per lane is held across the last PV step: row r of the item sits at key r + diag_off.
struct RowKeys {
  bool any;  // false: no row of the item sees a key
  int diag_off, left, right, seq_k;  // RTC_MASK: the window, as in row_keys
};

RTC_DEVICE bool sees_a_key(const RowKeys& rk, int r) {
  if (!RTC_MASK || !rk.any) return rk.any;  // unmasked: every row sees the item's keys (nblk > 0)
  const rtc_i64 diag = (rtc_i64)r + rk.diag_off;
  const rtc_i64 lo = rk.left < 0 || diag - rk.left < 0 ? 0 : diag - rk.left;
  const rtc_i64 hi = rk.right < 0 || diag + rk.right > rk.seq_k - 1 ? rk.seq_k - 1 : diag + rk.right;
  return lo <= hi;
}

// Stage 3 (epilogue): row sums across lanes, then O / l in the rounding mode and the LSE, or the
// unnormalised partial (O, m, l) of a split part.
RTC_DEVICE void epilogue(const OutPlan& op, Acc& a, RowState& st, int wave, int lane_in, const RowKeys& rk) {
  rtc_u32 fenced = (rtc_u32)lane_in;
  reg_fence(fenced);  // lane-derived values are rebuilt here, not held across the kv loop
  const int lane = (int)fenced, quad = lane >> 4, xaddr = (lane ^ 32) << 2;
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    const float l = row_sum4(st.l[g], xaddr), m = st.m[g];
    const int r = 48 * wave + 16 * g + (lane & 15);
    if (r >= (op.rows & (kSplitFlag - 1))) continue;
    if (op.rows & kSplitFlag) {
#pragma unroll
      for (int t = 0; t < kHdTiles; ++t)
        global_store((rtc_f32x4*)op.aux + (r * GFX942_HEAD_DIM + 16 * t + 4 * quad) / 4, a.o[g][t]);
      if (quad == 0) {
        float* ml = (float*)(op.aux + GFX942_Q_ROWS * GFX942_HEAD_DIM * 4);
        global_store(ml + r, m);
        global_store(ml + GFX942_Q_ROWS + r, l);
      }
      continue;
    }
    // All scores -Inf: l = 0, ZeroSumRow's row (exactly, even where O holds 0 * NaN from a V NaN).
    const bool empty = l == 0.0f;
    const ZeroSumRow blank = ZeroSumRow::of(sees_a_key(rk, r));
    const float inv = empty ? 0.0f : rcp_f32(l);
#pragma unroll
    for (int t = 0; t < kHdTiles; ++t) {
      const rtc_f32x4 o = a.o[g][t];
      rtc_u32x2 v = {(rtc_u32)rtc_f32_to_bf16(o[0] * inv) | ((rtc_u32)rtc_f32_to_bf16(o[1] * inv) << 16),
                     (rtc_u32)rtc_f32_to_bf16(o[2] * inv) | ((rtc_u32)rtc_f32_to_bf16(o[3] * inv) << 16)};
      if (empty) v[0] = v[1] = blank.o;
      buffer_store_dwordx2(op.o, (rtc_u32)r * op.o_row_bytes + (rtc_u32)((16 * t + 4 * quad) * 2), 0u, v);
    }
    if (op.aux && quad == 0)
      global_store((float*)op.aux + r, empty ? blank.lse : (m + log2_f32(l)) * 0.693147180559945309f);
  }
}

// What stage 2 needs of the workgroup: uniform loop constants and this lane's place.
struct KvWalk {
  KRows kr;
  rtc_buffer_rsrc vt;
  rtc_i64 k_ss;
  int kb0, nblk, seq_k;
  float c;  // softmax scale in log2 units
  int wave, lane, xaddr;
  bool group_b;
  // RTC_MASK: this lane's first row's diagonal key (row + Sk - Sq; tile g adds 16g) and the window.
  int diag0, left, right;
};

// The window of tile g's row of this lane, as key bounds [lo, hi] (hi <= Sk - 1; empty: lo > hi).
RTC_DEVICE void row_keys(const KvWalk& kw, int g, int& lo, int& hi) {
  const rtc_i64 diag = (rtc_i64)kw.diag0 + 16 * g;  // 64-bit: a window of up to 2^31 - 1 keys
  const rtc_i64 l = kw.left < 0 || diag - kw.left < 0 ? 0 : diag - kw.left;
  const rtc_i64 h = kw.right < 0 || diag + kw.right > kw.seq_k - 1 ? kw.seq_k - 1 : diag + kw.right;
  lo = (int)(l < kw.seq_k ? l : kw.seq_k);
  hi = (int)(h > -1 ? h : -1);
}

// Stage 2 of iteration k, then its second barrier: softmax(k); B refills the K buffer both groups
// have finished with, A pulls V^T(k) into L1 for the PV of the next two half-steps. kMasked: block
// k is cut by some row's window (or is the last, partial one), so its scores outside get -Inf.
template <bool kLast, bool kMasked = false>
RTC_DEVICE void softmax_step(const KvWalk& kw, Acc& a, RowState& st, AttnSmem& sm, int k) {
  const int kb = kw.kb0 + k, valid = kw.seq_k - kb * GFX942_KV_ROWS;
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    if (kMasked) {
      int lo, hi;
      row_keys(kw, g, lo, hi);
      const int key0 = kb * GFX942_KV_ROWS;
      softmax_tile<kLast, true>(a.s[g], a.o[g], a.p[g], st.m[g], st.l[g], kw.c, kw.lane >> 4, valid, kw.xaddr,
                                lo - key0, hi - key0);
    } else {
      softmax_tile<kLast>(a.s[g], a.o[g], a.p[g], st.m[g], st.l[g], kw.c, kw.lane >> 4, valid, kw.xaddr);
    }
  }
  rtc_u32 warm = 0;
  if (kw.group_b) {
    if (k + 2 < kw.nblk) issue_k(sm, kw.kr, kw.k_ss, kb + 2, k & 1, kw.wave - 4, kw.lane);
  } else {
    rtc_u32 l = (rtc_u32)kw.lane;
    reg_fence(l);
    warm = buffer_load_dword(kw.vt, (rtc_u32)((kw.wave * 64 + (int)l) * 64),
                             readfirstlane((rtc_u32)kb * GFX942_VT_BLOCK_BYTES));
  }
  s_waitcnt_vmcnt<0>();  // the K DMA counts on vmcnt, not lgkmcnt
  keep_alive(warm);
  __syncthreads();
}

// Iterations [k_from, k_to) of the steady loop: softmax of block k - 1 (masked or not), then the
// MFMA step of block k. Returns k_to.
template <bool kMasked>
RTC_DEVICE int walk(const KvWalk& kw, Acc& a, RowState& st, AttnSmem& sm, int k_from, int k_to) {
  for (int k = k_from; k < k_to; ++k) {
    softmax_step<false, kMasked>(kw, a, st, sm, k - 1);
    // Stage 1: matrix core (the other group is in stage 2).
    const rtc_u32 vt_prev = readfirstlane((rtc_u32)(kw.kb0 + k - 1) * GFX942_VT_BLOCK_BYTES);
    mfma_step(a, sm, kw.vt, vt_prev, k & 1, true, true, kw.wave, kw.lane);
    __syncthreads();
  }
  return k_from < k_to ? k_to : k_from;
}

RTC_DEVICE void attn_stage(const Gfx942Params& p, AttnSmem& sm) {
#if RTC_KV == RTC_KV_DENSE
  const Work w = find_work(p);
  const Seq seq = seq_of(p, w.b);
#else
  Seq seq;
  const Work w = find_packed_work(p, seq);
  if (w.rows <= 0) return;  // past its sequence's end (uniform: before any barrier)
#endif
  const int lane = (int)lane_id(), wave = (int)readfirstlane(threadIdx.x >> 6);
  const bool group_b = wave >= 4;
  const int xaddr = (lane ^ 32) << 2, nblk = w.kb1 - w.kb0;
  const rtc_buffer_rsrc qr =
      uniform_rsrc(p.q + seq.q_off + (rtc_i64)w.h * p.q_sh + (rtc_i64)w.q0 * p.q_ss, rows_span_bytes(w.rows, p.q_ss));
  const int hk = kv_head(p, w.h);  // GQA/MQA: the K/V head of this q head
  const KRows kr = k_rows(p, seq, w.b, hk);
  // Every V^T access stays inside this item's padded blocks by construction, so the record count
  // can be a constant the compiler rematerialises instead of holding an SGPR for it.
  const rtc_buffer_rsrc vt = uniform_rsrc(vt_blocks(p, w, seq, hk), 0xFFFFFFFFll);
  const OutPlan op = out_plan(p, w, seq);
  const rtc_i64 k_ss = p.k_ss;
  const int seq_k = seq.len_k;
  const float c = p.scale_log2;
  Acc a;
  RowState st;
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    st.m[g] = kNegMax;
    st.l[g] = 0.0f;
#pragma unroll
    for (int t = 0; t < kHdTiles; ++t) a.o[g][t] = rtc_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  }
  // No row sees a key (a window, a sequence without keys, or an empty split part): zeros / an empty partial.
  if ((RTC_MASK || RTC_KV != RTC_KV_DENSE) && nblk == 0) {
    epilogue(op, a, st, wave, lane, RowKeys{false, 0, 0, 0, 0});
    return;
  }
  // Stage 0: K(0), K(1) in flight while Q loads; then group B falls one half-step behind.
  if (group_b) {
    issue_k(sm, kr, k_ss, w.kb0, 0, wave - 4, lane);
    if (nblk > 1) issue_k(sm, kr, k_ss, w.kb0 + 1, 1, wave - 4, lane);
  }
  load_q(a, sm, qr, p.q_ss, w.rows, wave, lane);
  s_waitcnt_vmcnt<0>();
  __syncthreads();
  if (group_b) __syncthreads();
  const KvWalk kw = {kr,
                     vt,
                     k_ss,
                     w.kb0,
                     nblk,
                     seq_k,
                     c,
                     wave,
                     lane,
                     xaddr,
                     group_b,
                     w.q0 + 48 * wave + (lane & 15) + seq_k - seq.len_q,
                     p.window_left,
                     p.window_right};
  // Iteration k is "MFMA step(k); barrier; softmax(k); barrier". The loop is rotated by half an
  // iteration: MFMA step 0 (QK only) before it, softmax(nblk-1) and the PV-only step after it.
  // So the loop body has neither the PV/QK switches nor the kv mask, which only the last block
  // needs (see softmax_tile). Under a window, the blocks a window cuts run the same body with the
  // masked softmax, in their own loops before and after the unmasked one.
  // soffsets through readfirstlane: clang 15 (hipRTC 5.2) does not legalise a VGPR soffset.
  mfma_step(a, sm, vt, 0u, 0, false, true, wave, lane);
  __syncthreads();
#if RTC_MASK
  const int fb = w.fb - w.kb0, fe = w.fe - w.kb0;  // full blocks, relative to kb0
  int k = walk<true>(kw, a, st, sm, 1, fb < nblk - 1 ? fb + 1 : nblk);
  k = walk<false>(kw, a, st, sm, k, fe < nblk - 1 ? fe + 1 : nblk);
  walk<true>(kw, a, st, sm, k, nblk);
  softmax_step<true, true>(kw, a, st, sm, nblk - 1);
#else
  walk<false>(kw, a, st, sm, 1, nblk);
  softmax_step<true>(kw, a, st, sm, nblk - 1);
#endif
  // The PV of the last block, alone: the same half-step as every other MFMA step.
  mfma_step(a, sm, vt, readfirstlane((rtc_u32)(w.kb1 - 1) * GFX942_VT_BLOCK_BYTES), 0, true, false, wave, lane);
  __syncthreads();
  s_waitcnt_vmcnt<0>();
  __syncthreads();
  if (!group_b) __syncthreads();  // matches group B's stagger barrier
  epilogue(op, a, st, wave, lane, RowKeys{true, w.q0 + seq_k - seq.len_q, kw.left, kw.right, kw.seq_k});
}

}  // namespace g942

RTC_KERNEL(GFX942_THREADS) attention_fwd_gfx942(Gfx942Params p) {
  RTC_SHARED(g942::Smem, sm);
  if (p.stage == GFX942_STAGE_VT)
    g942::vt_stage(p, sm);
  else if (p.stage == GFX942_STAGE_ATTN)
    g942::attn_stage(p, sm.attn);
  else if (RTC_KV == RTC_KV_DENSE)  // packed calls run no split
    g942::merge_stage(p);
}
RTC_EXPORT_KERNEL(attention_fwd_gfx942, Gfx942Params)
