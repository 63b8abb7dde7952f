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
#include "gfx942/kv_cache.h"
#include "gfx942/score_mods.h"

namespace g942 {

// Where the item's K rows come from: its sequence's rows of its K/V head, row j at base + j * row bytes and
// rows [0, len) real; or (paged) the block table, one page per 16-row group. A quantized cache: the K workspace's
// expanded rows (gfx942/kv_cache.h), kBucket elements apart, paged or not.
#if RTC_KV == RTC_KV_PAGED && GFX942_K_FROM_CACHE
using KRows = PagedRows;
#else
struct KRows {
  rtc_u32 base_lo, base_hi;  // the address of row 0, in SGPRs
  int len;
};
#endif
RTC_DEVICE KRows k_rows(const Gfx942Params& p, const Seq& s, int b, int hk) {
#if RTC_KV == RTC_KV_PAGED && GFX942_K_FROM_CACHE
  return paged_rows(p, p.k, p.k_sb, p.k_ss, p.k_sh, b, hk, s.len_k);
#else
#if GFX942_K_FROM_CACHE
  const rtc_u64 base = (rtc_u64)(p.k + s.k_off + (rtc_i64)hk * p.k_sh);
#else
  const rtc_u64 base = kx_rows(p, s, b, hk);
#endif
  return KRows{readfirstlane((rtc_u32)base), readfirstlane((rtc_u32)(base >> 32)), s.len_k};
#endif
}

// The item's V^T blocks in the workspace (written by the V^T stage).
RTC_DEVICE const char* vt_blocks(const Gfx942Params& p, const Work& w, const Seq& s, int hk) {
#if RTC_KV == RTC_KV_DENSE
  return (const char*)p.workspace + ((rtc_i64)w.b * p.heads_k + hk) * p.nkb * kVtBlockBytes;
#else
  return (const char*)p.workspace + ((rtc_i64)hk * p.vt_head_blocks + vt_first_block(p, w.b, s)) * kVtBlockBytes;
#endif
}

// Stage 0 (prologue): the Q tiles into VGPRs (at 128: the third into this wave's LDS slot). Rows past Sq
// and columns past the call's head dim d load as zeros, and are never stored.
RTC_DEVICE void load_q(Acc& a, AttnSmem& sm, rtc_buffer_rsrc qr, rtc_i64 q_ss, int rows, int d, int wave, int lane) {
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
    const int r = kRowsPerWave * wave + 16 * g + (lane & 15);
#pragma unroll
    for (int ds = 0; ds < kDSteps; ++ds) {
      const int col = 16 * ds + 4 * (lane >> 4);
      rtc_u32x2 w = {0u, 0u};
      if (r < rows && col < d) w = buffer_load_dwordx2(qr, (rtc_u32)(r * q_ss * 2 + col * 2), 0u);
      const Frag f = as_frag(w[0], w[1]);
      if (g < kQRegTiles)
        a.q[g][ds] = f;
      else
        ds_write<Frag>(&sm.q3[wave][ds][lane], f);
    }
  }
}

// K block -> LDS buffer by DMA: each of the 4 waves of group B moves 16 rows, swizzled on the global side,
// through one buffer resource per row whose records are the row's first d columns (dbytes = 2d), or none for a
// row past the sequence: a lane whose dword lies past the call's head dim, or in such a row, reads 0, and its
// LDS dword becomes 0. So the columns between d and the pitch are zeros, and nothing past d is read.
// A DMA moves 64 dwords (one row at pitch 128, half a row at 256) or, at pitch 64, one row with 32 lanes.
// Paged: a 16-row group never straddles a page (pages hold a multiple of 16 rows), so it is one page's rows;
// a page id outside the pool reads zeros.
RTC_DEVICE void issue_k(AttnSmem& sm, const KRows& k, rtc_i64 k_ss, int kb, int buf, int wave4, int lane,
                        rtc_u32 dbytes) {
  constexpr int kLanesPerDma = kKRowDwords < 64 ? kKRowDwords : 64, kDmaPerRow = kKRowDwords / kLanesPerDma;
  rtc_u32 l = (rtc_u32)lane;
  const rtc_u64 row_bytes = (rtc_u64)k_ss * 2;
  const int j0 = kb * GFX942_KV_ROWS + wave4 * 16;
#if RTC_KV == RTC_KV_PAGED && GFX942_K_FROM_CACHE
  int rows;
  const rtc_u64 first = paged_group(k, j0, rows);
#else
  const rtc_u64 first = (((rtc_u64)k.base_hi << 32) | k.base_lo) + (rtc_u64)(rtc_i64)j0 * row_bytes;
  const int rows = k.len - j0;  // rows of the sequence from j0 on
#endif
  // The row's address in two SGPRs, advanced by one row each step: per-row resources cost scalar work only.
  rtc_u32 lo = readfirstlane((rtc_u32)first), hi = readfirstlane((rtc_u32)(first >> 32));
  const rtc_u32 rb_lo = readfirstlane((rtc_u32)row_bytes), rb_hi = readfirstlane((rtc_u32)(row_bytes >> 32));
  const int left = (int)readfirstlane((rtc_u32)rows);
  rtc_u32 dst = readfirstlane((rtc_u32)((buf * GFX942_KV_ROWS + wave4 * 16) * kKRowDwords * 4));
  // Fenced here, so the swizzled offsets, row addresses and M0 values are recomputed per call instead of
  // being hoisted out of the kv loop and held (spilled) across it.
  reg_fence(l);
  sreg_fence(dst);
  const rtc_u32 lane_byte = k_dma_src_byte((int)l, 0);  // row r's: lane_byte ^ (r & 15) << 3, one XOR
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    sreg_fence(lo);
    sreg_fence(hi);
    const rtc_buffer_rsrc rr = make_buffer_rsrc(lo, hi, r < left ? dbytes : 0u);
#pragma unroll
    for (int h = 0; h < kDmaPerRow; ++h) {
      if (kLanesPerDma == 64 || (int)l < kLanesPerDma)
        buffer_load_dword_lds(rr, (lane_byte ^ (rtc_u32)((r & 15) << 3)) + kLanesPerDma * 4 * h, 0u,
                              (char*)&sm.k[0][0] + dst);
      dst += kLanesPerDma * 4;
    }
    const rtc_u64 next = (((rtc_u64)hi << 32) | lo) + (((rtc_u64)rb_hi << 32) | rb_lo);
    lo = (rtc_u32)next;
    hi = (rtc_u32)(next >> 32);
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
RTC_DEVICE void qk_frags(const AttnSmem& sm, int buf, int ds, int wave, int lane, Frag (&kf)[kSub], Frag& q3) {
  rtc_u32 l = (rtc_u32)lane;
  reg_fence(l);
  if (kQLdsTiles) q3 = ds_read<Frag>(&sm.q3[wave][ds][l]);
#pragma unroll
  for (int s = 0; s < kSub; ++s) kf[s] = ds_read<Frag>((const char*)&sm.k[0][0] + k_frag_byte(buf, s, ds, (int)l));
}

// Stage 1 of an iteration: O^T += V^T(k-1) P^T(k-1), then S^T(k) = K(k) Q^T.
RTC_DEVICE void mfma_step(Acc& a, const AttnSmem& sm, rtc_buffer_rsrc vt, rtc_u32 vt_off, int buf, bool pv, bool qk,
                          int wave, int lane) {
  s_setprio<3>();
  fence_acc(a, false);  // every VALU write of O and P is above this line ...
  mfma_wait_read();     // ... and 2 wait states before the first MFMA reads them
  if (pv) {
    // V^T chunks through a kVRing-deep register ring: chunk c + kVRing - 1 is requested while chunk c feeds
    // 2 * kTilesPerWave MFMAs.
    constexpr int kChunks = 2 * kHdTiles;
    rtc_u32x4 v[kVRing];
#pragma unroll
    for (int c = 0; c + 1 < kVRing; ++c) v[c] = vt_chunk(vt, c, lane, vt_off);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (c + kVRing - 1 < kChunks) v[(c + kVRing - 1) % kVRing] = vt_chunk(vt, c + kVRing - 1, lane, vt_off);
      const int t = c >> 1, sp = c & 1;
      const Frag f0 = as_frag(v[c % kVRing][0], v[c % kVRing][1]), f1 = as_frag(v[c % kVRing][2], v[c % kVRing][3]);
#pragma unroll
      for (int g = 0; g < kTilesPerWave; ++g) mfma_acc(a.o[g][t], f0, a.p[g][2 * sp]);
#pragma unroll
      for (int g = 0; g < kTilesPerWave; ++g) mfma_acc(a.o[g][t], f1, a.p[g][2 * sp + 1]);
    }
  }
  if (qk) {
    // K (and at 128 the LDS Q tile) fragments through a kKRing-deep ring: step ds + kKRing - 1 is read while
    // step ds feeds 4 * kTilesPerWave MFMAs.
    Frag kf[kKRing][kSub], q3[kKRing];
#pragma unroll
    for (int ds = 0; ds + 1 < kKRing; ++ds) qk_frags(sm, buf, ds, wave, lane, kf[ds], q3[ds]);
#pragma unroll
    for (int ds = 0; ds < kDSteps; ++ds) {
      const int c = ds % kKRing, next = ds + kKRing - 1;
      if (next < kDSteps) qk_frags(sm, buf, next, wave, lane, kf[next % kKRing], q3[next % kKRing]);
#pragma unroll
      for (int s = 0; s < kSub; ++s) {
        if (ds == 0) {
#pragma unroll
          for (int g = 0; g < kQRegTiles; ++g) a.s[g][s] = mfma_zc(kf[c][s], a.q[g][0]);
          if (kQLdsTiles) a.s[kQRegTiles][s] = mfma_zc(kf[c][s], q3[c]);
        } else {
#pragma unroll
          for (int g = 0; g < kQRegTiles; ++g) mfma_acc(a.s[g][s], kf[c][s], a.q[g][ds]);
          if (kQLdsTiles) mfma_acc(a.s[kQRegTiles][s], kf[c][s], q3[c]);
        }
      }
    }
  }
  mfma_wait_result();  // 7 (gfx950: 8, gfx90a: 11) wait states after the last MFMA ...
  fence_acc(a, true);  // ... before any VALU/DS/VMEM touches O or S
  s_setprio<0>();
}

// What stage 2 needs of the workgroup: uniform loop constants and this lane's place.
struct KvWalk {
  KRows kr;
  rtc_buffer_rsrc vt;
  rtc_i64 k_ss;
  int kb0, nblk, seq_k;
  rtc_u32 dbytes;  // 2 x the call's head dim: the bytes of a K row the DMAs read
  float c;  // softmax scale in log2 units (FP8: times k_descale); score modifications: FP8's k_descale, or 1
  int wave, lane, xaddr;
  bool group_b;
  // RTC_MASK, ALiBi: this lane's first row's diagonal key (row + Sk - Sq; tile g adds 16g) and the window.
  int diag0, left, right;
#if RTC_KV_FP4
  KeyFactors key_factors;  // the item's keys' score factors (gfx942/kv_cache.h)
#endif
#if RTC_SCORE_MOD
  ModParams mods;          // the softmax scale and the soft cap's constants (score_mod.h)
  float slope_log2;        // the item's ALiBi slope (its (sequence, head)), log2 domain
#endif
#if RTC_DROPOUT
  const rtc_i64* rng;      // p.rng_state: the generator state (dropout.h), read per step (two SGPRs held, not four)
  rtc_u32 drop_threshold;  // p.drop_threshold (where these live: gfx942.hip)
  float drop_scale;        // p.drop_scale
  int bh;                  // b * heads + h: the Philox counter's last word
  int row0;                // this wave's first row within its sequence (a multiple of 16; tile g: + 16 g)
#endif
};
// Where the score modifications' loop constants live: SGPRs at 96 to 192 (the window variants sit near 256 VGPRs), VGPRs
// at 64 and 256, where gfx950's attention stage has no SGPR to spare (its FP4 and FP8 window variants kept a private
// segment) and VGPRs to spare.
constexpr bool kModsInVgprs = kBucket == 64 || kBucket == 256;

#if RTC_DROPOUT
// Where a tile's keep bits are drawn (softmax.h, TileKeep): before its softmax up to 128 (3 q tiles: drawn inside it,
// gfx90a's 128 paged window variant spilled), inside it per sub-tile at 192 and 256 (drawn before it, gfx90a's 192
// varlen window variant spilled).
constexpr bool kDrawTileFirst = kBucket <= 128;
#endif

// The window of tile g's row of this lane, as key bounds [lo, hi] (hi <= Sk - 1; empty: lo > hi).
RTC_DEVICE void row_keys(const KvWalk& kw, int g, int& lo, int& hi) {
#if GFX942_K_FROM_CACHE && !RTC_SCORE_MOD
  const rtc_i64 diag = (rtc_i64)kw.diag0 + 16 * g;  // 64-bit: a window of up to 2^31 - 1 keys
#else
  // Widened here, per masked block: a quantized variant's compile (and a score-modified one's) hoisted the 64-bit
  // row out of the window's first loop and, at 256 VGPRs, spilled it.
  int diag0 = kw.diag0;
  reg_fence(diag0);
  const rtc_i64 diag = (rtc_i64)diag0 + 16 * g;
#endif
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
#if RTC_KV_FP4
  // FP4: the keys' scales with the softmax scale (score modifications: alone), per score (gfx942/kv_cache.h); FP8's
  // descale is in kw.c.
  const KeyScales c = key_scales(kw.key_factors, kb, kw.lane >> 4);
#else
  const float c = kw.c;
#endif
#if RTC_SCORE_MOD
  // The distance of this lane's first key of the block from its first row's diagonal, and the modifications'
  // constants, from fenced values: what they give is derived per step, not hoisted out of the loop and held (the 128
  // and 192 window variants sit at 256 VGPRs; the FP4 ones spilled).
  KvWalk fenced = kw;
  reg_fence(fenced.lane);
  reg_fence(fenced.diag0);
  const KvWalk& kt = fenced;  // the tiles' constants: the window's key indices too come from the fenced lane
  const AttnParams mods = step_mod_params<kModsInVgprs>(kw.mods);
  const int dist0 = key_distance(kb * GFX942_KV_ROWS + 4 * (kt.lane >> 4), kt.diag0);
  // Every tile's scores dequantized first (a quantized cache's factors; fenced there, so that FP4's 16 VGPRs of them
  // are dead before the first tile's modifications); the modifications take the dequantized score (score_mod.h).
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g)
#pragma unroll
    for (int sub = 0; sub < kSub; ++sub) {
      a.s[g][sub] *= score_scale(c, sub);
      if (RTC_KV_FP4) reg_fence(a.s[g][sub]);
    }
#elif RTC_DROPOUT
  // The tiles' constants from a fenced lane id, as the modifications' above: the window's key indices and the draws'
  // counters and word selection are derived per step, not hoisted out of the loop and held (the 192 window variants,
  // near 256 VGPRs, spilled them).
  KvWalk fenced = kw;
  reg_fence(fenced.lane);
  const KvWalk& kt = fenced;
#else
  const KvWalk& kt = kw;
#endif
#if RTC_DROPOUT
  // The generator's state, loaded per step through a fenced pointer: the round keys and what else derives from the
  // seed and offset are computed per step, not held in SGPRs across the loop.
  const rtc_i64* rng = kw.rng;
  sreg_fence(rng);
  const DropoutState ds = {(rtc_u64)scalar_load(rng), (rtc_u64)scalar_load(rng + 1)};
#endif
#pragma unroll
  for (int g = 0; g < kTilesPerWave; ++g) {
#if RTC_DROPOUT
    // Tile g's rows kw.row0 + 16 g + lane % 16, its keys kb * 64 + 16 sub + 4 quad + i.
    const TileDropout draws = {(rtc_u32)ds.seed,
                               (rtc_u32)(ds.seed >> 32),
                               ds.offset + (rtc_u64)(16 * kb),
                               (rtc_u32)(8 * ((kw.row0 >> 4) + g)),
                               (rtc_u32)kw.bh,
                               kw.drop_threshold,
                               kt.lane};
    const TileKeep<kDrawTileFirst> drop = TileKeep<kDrawTileFirst>::of(draws, kw.drop_scale);
#else
    const NoDropout drop = {};
#endif
#if RTC_SCORE_MOD
    // The tile's modified scores (gfx942/score_mods.h), before the softmax masks them: tile g's row is 16 g past the
    // lane's first.
    modify_scores(a.s[g], mods, kw.slope_log2, dist0 - 16 * g);
#endif
    if (kMasked) {
      int lo, hi;
      row_keys(kw, g, lo, hi);
      const int key0 = kb * GFX942_KV_ROWS;
      softmax_tile<kLast, true>(a.s[g], a.o[g], a.p[g], st.m[g], st.l[g], softmax_scale_of(c), kt.lane >> 4, valid,
                                kw.xaddr, lo - key0, hi - key0, drop);
    } else {
      softmax_tile<kLast>(a.s[g], a.o[g], a.p[g], st.m[g], st.l[g], softmax_scale_of(c), kt.lane >> 4, valid, kw.xaddr,
                          0, 0, drop);
    }
  }
  // Group A: one dword per 64-byte line of V^T(k), 64 lines per wave and round (the block is a multiple of
  // 4 KiB): ceil(lines / 256) rounds, a wave past the block's end skipping its load.
  constexpr int kWarmRounds = (kVtBlockBytes / 64 + 255) / 256;
  rtc_u32 warm[kWarmRounds];
#pragma unroll
  for (int i = 0; i < kWarmRounds; ++i) warm[i] = 0;
  if (kw.group_b) {
    if (k + 2 < kw.nblk) issue_k(sm, kw.kr, kw.k_ss, kb + 2, k & 1, kw.wave - 4, kw.lane, kw.dbytes);
  } else {
    rtc_u32 l = (rtc_u32)kw.lane;
    reg_fence(l);
#pragma unroll
    for (int i = 0; i < kWarmRounds; ++i) {
      const int line = (4 * i + kw.wave) * 64 + (int)l;
      if (kVtBlockBytes % (256 * 64) == 0 || (4 * i + kw.wave) * 64 * 64 < kVtBlockBytes)
        warm[i] = buffer_load_dword(kw.vt, (rtc_u32)(line * 64), readfirstlane((rtc_u32)kb * kVtBlockBytes));
    }
  }
  s_waitcnt_vmcnt<0>();  // the K DMA counts on vmcnt, not lgkmcnt
#pragma unroll
  for (int i = 0; i < kWarmRounds; ++i) keep_alive(warm[i]);
  __syncthreads();
}

// Iterations [k_from, k_to) of the steady loop: softmax of block k - 1 (masked or not), then the
// MFMA step of block k. Returns k_to.
template <bool kMasked>
RTC_DEVICE int walk(const KvWalk& kw, Acc& a, RowState& st, AttnSmem& sm, int k_from, int k_to) {
  // Bounds and counter in SGPRs: the window's bounds come from divisions that clang may leave in VGPRs (and then
  // count in one), and hipRTC may derive the V^T offsets from a second counter it keeps in a VGPR.
  const int k_end = (int)readfirstlane((rtc_u32)k_to);
  for (int k = (int)readfirstlane((rtc_u32)k_from); k < k_end; ++k) {
    const int kf = (int)readfirstlane((rtc_u32)k);
    softmax_step<false, kMasked>(kw, a, st, sm, kf - 1);
    // Stage 1: matrix core (the other group is in stage 2).
    const rtc_u32 vt_prev = readfirstlane((rtc_u32)(kw.kb0 + kf - 1) * kVtBlockBytes);
    mfma_step(a, sm, kw.vt, vt_prev, kf & 1, true, true, kw.wave, kw.lane);
    __syncthreads();
  }
  return k_from < k_to ? k_to : k_from;
}

}  // namespace g942
