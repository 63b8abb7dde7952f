// The gfx942 kernel's KV loop pieces: where an item's K rows and V^T blocks come from, the Q prologue, the
// K DMA into LDS, the MFMA step (O^T += V^T P^T, S^T = K Q^T) and the softmax step with its barrier, and
// the walk over a run of KV blocks; gfx942.hip's attn_stage puts them together.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"
#include "isa_gfx942.h"
#include "gfx942/params.h"
#include "gfx942/tiles.h"
#include "gfx942/softmax.h"
#include "gfx942/sequences.h"
#include "gfx942/scheduler.h"

namespace g942 {

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

}  // namespace g942
