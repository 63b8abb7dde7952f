// The gfx942 kernel's companion stages: V -> V^T fragment layout into the workspace, and the tail-split merge.
#pragma once
#include "platform.h"
#include "bf16_round.h"
#include "isa_gfx9.h"
#include "gfx942/tiles.h"
#include "gfx942/sequences.h"
#include "gfx942/softmax.h"
#include "gfx942/kv_cache.h"

namespace g942 {

// V^T block out_block from the 64 V rows of block n of sequence s (K/V head h): stage the rows in LDS
// (rows past the sequence's keys, and columns past the call's head dim, as zeros: 0 x garbage can be NaN in PV),
// then write the bucket's 16-byte chunks in the PV fragment order. Wave w stages rows w, w + 8, ..., its lanes
// the row's dwords, 64 at a time. A quantized cache's V rows are expanded into the same staging rows
// (gfx942/kv_cache.h).
RTC_DEVICE void vt_block(const Gfx942Params& p, Smem& sm, const Seq& s, int b, int h, int n, rtc_i64 out_block) {
  constexpr int kRowDwords = kBucket / 2;
  const int tid = threadIdx.x;
#if !GFX942_K_FROM_CACHE
  // A quantized cache: V's rows expanded into the staging rows (gfx942/kv_cache.h; K: vt_stage).
  (void)out_block;
  expand_v_block(p, sm.vt, s, b, h, n);
#else
  constexpr int kRounds = (kRowDwords + 63) / 64;
  const int lane = tid & 63, dwords = p.head_dim / 2;
  const int len = s.len_k;
  // Row kv of load j is this wave's row + 8j: uniform, so each paged load has one page.
  const int wave_row = n * GFX942_KV_ROWS + (int)readfirstlane((rtc_u32)tid >> 6);
#if RTC_KV == RTC_KV_PAGED
  const PagedRows pr = paged_rows(p, p.v, p.v_sb, p.v_ss, p.v_sh, b, h, len);
#else
  const rtc_buffer_rsrc vr =
      uniform_rsrc(p.v + s.v_off + (rtc_i64)h * p.v_sh, rows_span_bytes(len, p.v_ss, p.head_dim));
#endif
  for (int j = 0; j < 8; ++j) {
    const int kv = wave_row + 8 * j;
#if RTC_KV == RTC_KV_PAGED
    // Uniform (kv is), so built by every lane: its page's resource (no records past the keys), the row's byte.
    const rtc_buffer_rsrc vr = page_rsrc(pr, kv, p.head_dim);
    const rtc_u32 row_byte = page_row_byte(pr, kv);
#else
    const rtc_u32 row_byte = (rtc_u32)((rtc_i64)kv * p.v_ss * 2);
#endif
    for (int i = 0; i < kRounds; ++i) {
      const int dw = lane + 64 * i;
      if (kRowDwords % 64 != 0 && dw >= kRowDwords) continue;
      rtc_u32 w = 0;
      if (kv < len && dw < dwords) w = buffer_load_dword(vr, row_byte + dw * 4, 0u);
      ds_write<rtc_u32>(&sm.vt[(kv - n * GFX942_KV_ROWS) * kRowDwords + dw], w);
    }
  }
#endif
  __syncthreads();
  rtc_elem_t* ws = (rtc_elem_t*)p.workspace;
  const rtc_buffer_rsrc out = uniform_rsrc(ws + out_block * (kVtBlockBytes / 2), kVtBlockBytes);
  constexpr int kChunks = 2 * kHdTiles * 64;  // 16 bytes each
  for (int j = 0; j < (kChunks + GFX942_THREADS - 1) / GFX942_THREADS; ++j) {
    const int c = tid + GFX942_THREADS * j, t = c >> 7, sp = (c >> 6) & 1, cl = c & 63;
    if (kChunks % GFX942_THREADS != 0 && c >= kChunks) break;
    const int hd = 16 * t + (cl & 15);
    rtc_u32 h16[8];
    for (int s2 = 0; s2 < 2; ++s2)
      for (int i = 0; i < 4; ++i) {
        const int kv = 16 * (2 * sp + s2) + 4 * (cl >> 4) + i;
        const rtc_u32 w = ds_read<rtc_u32>(&sm.vt[kv * kRowDwords + (hd >> 1)]);
        h16[4 * s2 + i] = (hd & 1) ? (w >> 16) : (w & 0xFFFFu);
      }
    const rtc_u32x4 v = {h16[0] | (h16[1] << 16), h16[2] | (h16[3] << 16), h16[4] | (h16[5] << 16),
                         h16[6] | (h16[7] << 16)};
    buffer_store_dwordx4(out, (rtc_u32)(c * 16), 0u, v);
  }
}

// Dense: one workgroup per (b, K/V head, 64-row block). Varlen: one per block of a K/V head's run, its
// sequence found from cu_seqlens_k (blocks between sequences exit). Paged: gfx942_paged_vt_stride
// workgroups per (b, K/V head), each walking the sequence's blocks with that stride. Every key of every
// sequence is transposed, whatever max_seqlen_k says.
RTC_DEVICE void vt_stage(const Gfx942Params& p, Smem& sm) {
  const int blk = blockIdx.x;
#if RTC_KV == RTC_KV_DENSE
  const int bh = blk / p.nkb, n = blk - bh * p.nkb, b = bh / p.heads_k, h = bh - b * p.heads_k;
  vt_block(p, sm, seq_of(p, b), b, h, n, (rtc_i64)bh * p.nkb + n);
#elif RTC_KV == RTC_KV_VARLEN
  if (p.batch <= 0) return;  // no sequence owns a block (and cu_seqlens_k has one entry)
  const int h = uniform_i32(blk / p.vt_head_blocks), j = uniform_i32(blk - h * p.vt_head_blocks);
  const int b = uniform_i32(vt_block_owner(p, j));
  const Seq s = seq_of(p, b);
  const int n = uniform_i32(j - vt_first_block(p, b, s));
  if (n < 0 || n >= kv_blocks(s.len_k)) return;  // a pad block between sequences
  vt_block(p, sm, s, b, h, n, (rtc_i64)h * p.vt_head_blocks + j);
#if !GFX942_K_FROM_CACHE
  expand_k_blocks(p, s, b, h, n, n + 1, 1, (rtc_i64)h * p.vt_head_blocks + j - n);  // and K's block
#endif
#else
  const int stride = gfx942_paged_vt_stride(p.seq_k, p.nkb);
  const int bh = uniform_i32(blk / stride), n0 = uniform_i32(blk - bh * stride);
  const int b = uniform_i32(bh / p.heads_k), h = uniform_i32(bh - b * p.heads_k);
  const Seq s = seq_of(p, b);
  const rtc_i64 first = (rtc_i64)h * p.vt_head_blocks + vt_first_block(p, b, s);
  for (int n = n0; n < kv_blocks(s.len_k); n += stride) {
    if (n != n0) __syncthreads();  // every wave has read the previous block out of LDS
    vt_block(p, sm, s, b, h, n, first + n);
  }
#if !GFX942_K_FROM_CACHE
  expand_k_blocks(p, s, b, h, n0, kv_blocks(s.len_k), stride, first);  // and K's, in a loop of its own
#endif
#endif
}

// Merge of the split parts of one tail item, 16 q rows per workgroup, in part order (never
// atomics): O = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p, M = max_p m_p. 32 lanes per row, 4 columns
// each per pass of 128 columns, up to the call's head dim.
RTC_DEVICE void merge_stage(const Gfx942Params& p) {
  const int tid = threadIdx.x, per_item = kQRows / GFX942_MERGE_ROWS;
  const int j = blockIdx.x / per_item, r = (blockIdx.x - j * per_item) * GFX942_MERGE_ROWS + (tid >> 5);
  const int item = p.n_prefix + j;
  const int bh = item / p.nqb, b = bh / p.heads, h = bh - b * p.heads;
  const int q0 = item_q0(p, item), rows = p.seq_q - q0 < kQRows ? p.seq_q - q0 : kQRows;
  // Built by every lane before any lane leaves: readfirstlane is wave-wide.
  const rtc_buffer_rsrc outr = uniform_rsrc(p.o + (rtc_i64)b * p.o_sb + (rtc_i64)h * p.o_sh + (rtc_i64)q0 * p.o_ss,
                                            rows_span_bytes(rows, p.o_ss, p.head_dim));
  if (r >= rows) return;
  const char* parts = (const char*)p.workspace + p.vt_bytes + (rtc_i64)j * p.split_g * kPartBytes;
  const int ml = kQRows * kBucket * 4;
  float mx = kNegMax;
  for (int g = 0; g < p.split_g; ++g)
    mx = __builtin_fmaxf(mx, global_load((const float*)(parts + (rtc_i64)g * kPartBytes + ml) + r));
  // All scores -Inf: ZeroSumRow's row, whatever 0 * NaN left in acc.
  const KeyRange keys = key_range(p, q0 + r);
  const ZeroSumRow blank = ZeroSumRow::of(!RTC_MASK || keys.lo <= keys.hi);
  float lsum = 0.0f;
  for (int col = (tid & 31) * 4; col < p.head_dim; col += 128) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    lsum = 0.0f;
    for (int g = 0; g < p.split_g; ++g) {
      const char* part = parts + (rtc_i64)g * kPartBytes;
      const float w = exp2_f32(global_load((const float*)(part + ml) + r) - mx);
      lsum += w * global_load((const float*)(part + ml) + kQRows + r);
      const rtc_f32x4 o = global_load((const rtc_f32x4*)part + (r * kBucket + col) / 4);
      for (int i = 0; i < 4; ++i) acc[i] += w * o[i];
    }
    const bool empty = lsum == 0.0f;
    const float inv = empty ? 0.0f : rcp_f32(lsum);
    rtc_u32x2 packed = {o_pair(acc[0] * inv, acc[1] * inv), o_pair(acc[2] * inv, acc[3] * inv)};
    if (empty) packed[0] = packed[1] = blank.o;
    buffer_store_dwordx2(outr, (rtc_u32)(((rtc_i64)r * p.o_ss + col) * 2), 0u, packed);
  }
  if (p.lse && (tid & 31) == 0)  // column 0 is below every head dim: this lane summed lsum above
    global_store(p.lse + ((rtc_i64)b * p.heads + h) * p.seq_q + q0 + r,
                 lsum == 0.0f ? blank.lse : (mx + log2_f32(lsum)) * 0.693147180559945309f);
}

}  // namespace g942
