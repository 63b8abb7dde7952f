// The sm_90a decode kernel's masks: the keys each of a thread's two packed rows sees, and the scores of a stage that
// fall outside them set to -inf before the softmax; before the mask, the variant's score modifications (RTC_SCORE_MOD:
// the soft cap, ALiBi; score_mod_sm90.h), so that a hidden key stays -inf.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "sm90_decode/params.h"
#include "sm90_decode/scheduler.h"
#include "sm90/softmax.h"  // neg_inf
#include "score_mod_sm90.h"

namespace sm90dec {

// Packed row r (< 16 row_tiles) of the item: query row i of q head hk * group + g, and the keys [lo, hi] it sees (aligned
// bottom-right to its sequence; unmasked: all of the sequence's keys). i = -1: a row past the item's rows, which sees
// no key and writes nothing.
struct RowKeys {
  int i, g;
  rtc_i64 lo, hi;
};

RTC_DEVICE RowKeys row_keys(const Sm90DecodeParams& p, const Work& w, const Seq& seq, int r) {
  const int packed = w.chunk * DECODE_ROWS * p.row_tiles + r, i = packed / p.group;
  RowKeys k = {-1, packed - i * p.group, 0, -1};
  if (i < w.i0 || i >= w.i1) return k;
  k.i = i;
  if (RTC_MASK) {
    const KeyRange kr = key_range(seq_view(p, seq), i);
    k.lo = kr.lo;
    k.hi = kr.hi;
  } else {
    k.hi = (rtc_i64)seq.len_k - 1;
  }
  return k;
}

// Scores of the stage at key `key0` (this warp's 16 keys: fragment column 8 j + 2 (lane % 4) + c of n-tile j) outside
// their row's keys become -inf. Unmasked stages whose keys all lie in the sequence skip it (the caller's test).
RTC_DEVICE void mask_scores(float (&s)[8], const RowKeys (&rk)[2], rtc_i64 key0, int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const rtc_i64 key = key0 + 8 * j + 2 * (lane % 4) + c;
        if (key < rk[i].lo || key > rk[i].hi) s[4 * j + 2 * i + c] = sm90::neg_inf();
      }
}

// ---- score modifications (RTC_SCORE_MOD), on a block's scores (dequantized) before its mask ----

// What the softmax takes (score_mod_sm90.h): t at scale 1 with a soft cap; else the raw score, or s' with ALiBi alone
// (the scale is never 0 here: an FP8 cache's k_descale multiplies the scores themselves).
enum : bool { kScoreT = sm90::score_mod_t(false) };  // enumerators: no global in the code object

// The modifications of a thread's two packed rows (empty for a plain variant), computed once per work item: the soft
// cap's constants, and per row its head's ALiBi factor and d0 = key - diag at the fragment's first column of key 0.
struct RowMods {
#if RTC_SCORE_MOD
  sm90::Softcap cap;
  float alibi_k[2], d0[2];
#endif
  RTC_DEVICE static RowMods of(const Sm90DecodeParams& p, const Work& w, const Seq& seq, const RowKeys (&rk)[2],
                               int lane) {
    RowMods m;
#if RTC_SCORE_MOD
    m.cap = sm90::Softcap::of(p);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m.alibi_k[i] =
          RTC_ALIBI ? sm90::alibi_factor(sm90::alibi_slope(p, w.b, w.hk * p.group + rk[i].g), p.scale, kScoreT) : 0.f;
      m.d0[i] = (float)(2 * (lane % 4) - ((rtc_i64)rk[i].i + seq.len_k - seq.len_q));  // a row past the item's: masked
    }
#endif
    return m;
  }
};

// A 16-key block's scores at key key0 (fragment index 4 j + 2 i + c: row i, key key0 + 8 j + 2 (lane % 4) + c)
// modified in place (plain: nothing).
RTC_DEVICE void modify_scores(float (&s)[8], const RowMods& m, int key0) {
#if RTC_SCORE_MOD
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float base = (float)key0 + m.d0[i];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float dt;
        float& x = s[4 * j + 2 * i + c];
        x = sm90::modded<kScoreT>(x, 2 * i + c, m.cap, 1.f, m.alibi_k[i], base + (float)(8 * j + c), dt);
      }
  }
#endif
}

// The softmax's scale of the scores, and the LSE's factor of their max: 1 and ln 2 where they are t.
RTC_DEVICE float softmax_scale_log2(const Sm90DecodeParams& p) { return kScoreT ? 1.f : p.scale_log2; }
RTC_DEVICE float lse_scale(const Sm90DecodeParams& p) { return kScoreT ? RTC_LN2_F : p.scale; }

}  // namespace sm90dec
