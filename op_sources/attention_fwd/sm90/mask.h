// The sm_90a kernel's mask: the K/V blocks a tile visits and which of them a row's window cuts
// (tile_span), the key windows of a thread's two rows, and the -inf written over the scores outside
// them (a window, or the keys past a partial last block); before it, the score modifications of the variant
// (RTC_SCORE_MOD: the soft cap, ALiBi; score_mod_sm90.h), so that a hidden key stays -inf.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "kv_quant.h"  // RTC_KV_FP8
#include "sm90/pipeline.h"
#include "sm90/softmax.h"
#include "score_mod_sm90.h"

namespace sm90 {

// The K/V blocks of one tile (kv_span, attn_params.h) for its rows inside the sequence: [begin, end) are
// visited; blocks outside [full_begin, full_end) are cut by a row's window (or by the end of the keys) and get
// the per-element mask. Unmasked, every block is visited and only a partial last block is masked.
RTC_DEVICE KvSpan tile_span(const AttnParams& a, int row0) {
  const rtc_i64 r0 = row0 > 0 ? row0 : 0, r1 = (rtc_i64)row0 + kM < a.seq_q ? (rtc_i64)row0 + kM : a.seq_q;
  return kv_span(a, r0, r1 - r0, kN, RTC_MASK);
}

// Columns >= valid of this block get -inf; the row-max guard of online_softmax (sm90/softmax.h) keeps
// -inf - -inf away.
template <int N>
RTC_DEVICE void mask_cols(float (&s)[N], int valid) {
  const int c0 = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (8 * j + c0 + (k & 1) >= valid) s[4 * j + k] = neg_inf();
}

// The keys of the two rows a thread owns (row0 and row0 + 8) as 32-bit bounds: a row that sees no
// key gets lo > hi. Computed once per tile; the mask of a block then compares columns only.
struct KeyWindow {
  int lo[2], hi[2];
  RTC_DEVICE static KeyWindow of(const AttnParams& a, rtc_i64 row0) {
    KeyWindow w;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const KeyRange kr = key_range(a, row0 + 8 * i);
      w.lo[i] = (int)(kr.lo < a.seq_k ? kr.lo : a.seq_k);  // past every key: clamped, still > hi
      w.hi[i] = (int)(kr.hi > -1 ? kr.hi : -1);
    }
    return w;
  }
  RTC_DEVICE bool sees_a_key(int i) const { return lo[i] <= hi[i]; }
};

// Scores outside each row's key window get -inf (RTC_MASK); col0 is the block's first key, and
// columns past the last key fall outside too (hi <= Sk - 1).
template <int N>
RTC_DEVICE void mask_window(float (&s)[N], const KeyWindow& w, int col0) {
  const int c0 = col0 + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < N / 4; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int col = c0 + 8 * j + k;
        if (col < w.lo[i] || col > w.hi[i]) s[4 * j + 2 * i + k] = neg_inf();
      }
}

// Where a consumer warpgroup's window mask applies: the rows' key ranges and whether block n is cut.
struct WindowMask {
  KeyWindow rows;   // the keys of this thread's two rows
  int full_begin, full_end;
  RTC_DEVICE bool cuts(int n) const { return n < full_begin || n >= full_end; }
};

// ---- score modifications (RTC_SCORE_MOD), on a block's scores before its mask ----

// What the softmax takes (score_mod_sm90.h): t at scale 1 with a soft cap, and with ALiBi alone over an FP8 cache
// (its k_descale is in the tile's scale, which may be 0); else the raw score, or s' with ALiBi alone.
enum : bool { kScoreT = score_mod_t(RTC_KV_FP8) };  // enumerators: no global in the code object
// The soft cap's reciprocals on the SFU, of every 4 (score_mod_sm90.h): from the 192 bucket on, all of them. There the
// GEMMs of a score take 1.5 to 2 times as long as at 128, which leaves the SFU room for three instructions a score,
// and the FP32 pipe's longer chain spilled beside the 256 bucket's accumulators.
enum : int { kCapSfuOf4 = kD >= 192 ? 4 : kSoftcapSfuOf4 };

// A consumer warpgroup's modifications of one tile, computed once per tile (empty for a plain variant): the ALiBi
// factor of the tile's head, and diag0 = the diagonal (row + Sk - Sq) of the tile's row 0. The soft cap's constants and
// the scale are the tile's view's, read where they are used (an FP8 tile's carry its k_descale: sm90/scheduler.h), as
// the plain variant reads its scale: a register held across the tile for them spilled at 256.
struct TileMods {
#if RTC_SCORE_MOD
  float alibi_k;
  int diag0;
#endif
  RTC_DEVICE static TileMods of(const AttnParams& pa, const AttnParams& view, int batch, int head, int row0) {
    TileMods m;
#if RTC_SCORE_MOD
    m.alibi_k = RTC_ALIBI ? alibi_factor(alibi_slope(pa, batch, head), view.scale, kScoreT) : 0.f;
    m.diag0 = row0 + (view.seq_k - view.seq_q);  // in (-Sq, Sk)
#endif
    return m;
  }
};

// The block's scores at key col0 of the tile's view `a` modified in place (plain: nothing). Element (j, i, k) of the
// fragment is row 64 (wg - 1) + 16 warp + lane / 4 + 8 i of the tile, key col0 + 8 j + 2 (lane % 4) + k: its distance
// key - diag is a base of the thread plus 8 j + k - 8 i. The base is formed here from the thread index read here
// (tid_x_here), so that the distances are computed after the scores' wait, not held across the GEMMs.
template <int N>
RTC_DEVICE void modify_scores(float (&s)[N], const TileMods& m, int col0, const AttnParams& a) {
#if RTC_SCORE_MOD
  const Softcap cap = Softcap::of(a);
  const int tid = tid_x_here() % 128, lane = tid % 32;  // the consumer warpgroup's thread
  const int row = warp_uniform(tid_x_here() / 128 - 1) * 64 + (tid / 32) * 16 + lane / 4;
  const float base = (float)((rtc_i64)col0 + 2 * (lane % 4) - row - m.diag0);
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        float dt;
        float& x = s[4 * j + 2 * i + k];
        x = modded<kScoreT, kCapSfuOf4>(x, 4 * j + 2 * i + k, cap, a.scale_log2, m.alibi_k,
                                        base + (float)(8 * j + k - 8 * i), dt);
      }
#endif
}

// The softmax's scale of the scores (scale log2(e), times an FP8 tile's |k_descale|), and the LSE's factor of their
// max (scale): 1 and ln 2 where they are t.
RTC_DEVICE float softmax_scale_log2(const AttnParams& view) { return kScoreT ? 1.f : view.scale_log2; }
RTC_DEVICE float lse_scale(const AttnParams& view) { return kScoreT ? RTC_LN2_F : view.scale; }

}  // namespace sm90
