// The sm_90a kernel's dropout (RTC_DROPOUT; the mask is csrc_common/dropout.h's): after a block's softmax, P is packed
// for P V as without dropout and the dropped elements zeroed; the kept ones' 1 / (1 - p) multiplies O with 1 / l in
// the epilogue (FlashAttention's order: one product a row, not one a score). The row sums and the LSE are the
// undropped ones (numerics §13).
//
// The mask's Philox blocks are this fragment's: a thread holds, of each 16-key group of a block, rows r, r + 8 and
// keys 2t, 2t + 1, 2t + 8, 2t + 9 (t = lane % 4), in registers s[8 g .. 8 g + 7] in the order of the call's eight
// halves (packed: words 4 g .. 4 g + 3). So one call draws eight of its elements, none wasted and nothing exchanged:
// kN / 16 calls a block.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "dropout.h"
#include "ptx_sm90.h"

namespace sm90 {

// What a consumer warpgroup's thread needs of the mask for one tile (held only by a variant with dropout): the
// counter's row word of the thread's rows and its (sequence, head) word. The call's (seed, offset) is read from
// rng_state at each block (an L1 hit), not held across the tile: four registers more spilled at 256. The tile's rows
// start on a 16-row group (tile_row0 aligns the masked ones), so a thread's rows r, r + 8 are one Philox block's.
struct TileDrop {
  rtc_u32 row_word, bh_word;
  // row: the thread's first row in the tile's sequence (its second is row + 8; row % 16 < 8).
  RTC_DEVICE static TileDrop of(const AttnParams& pa, int batch, int head, int row) {
    TileDrop d;
    d.row_word = (rtc_u32)(8 * (row >> 4) + (row & 7));
    d.bh_word = (rtc_u32)(batch * pa.heads + head);
    return d;
  }
};

// The packed P of the block of keys from col0 (a multiple of 16) with its dropped elements zeroed: the eight elements
// of each 16-key group (words 4 g .. 4 g + 3, their halves in the call's order) from one Philox call of counter
// offset + 4 (key / 16) + lane % 4, the calls side by side (each is ten dependent rounds). Done after the block's
// softmax and packing, when the fp32 scores' registers are free: the 256 bucket's masked variants had none to spare
// before. Formed while the block's GEMMs ran instead (the warp waits for them there), the open variants were slower
// (docs/NOTES.md, issue 25 step 2).
template <int W>
RTC_DEVICE void drop_packed(rtc_u32 (&pk)[W], const TileDrop& d, int col0, const AttnParams& pa) {
#if RTC_DROPOUT
  const rtc_u64 seed = (rtc_u64)__ldg(pa.rng_state), offset = (rtc_u64)__ldg(pa.rng_state + 1);
  const rtc_u64 ctr0 = offset + (rtc_u64)(4 * (col0 >> 4) + (int)(tid_x_here() % 4));
  const KeepHalves keep = KeepHalves::of(pa.drop_threshold);
#pragma unroll
  for (int g = 0; g < W / 4; ++g) {
    const rtc_u64 ctr = ctr0 + (rtc_u64)(4 * g);
    const Philox4 r =
        philox4x32_10((rtc_u32)ctr, (rtc_u32)(ctr >> 32), d.row_word, d.bh_word, (rtc_u32)seed, (rtc_u32)(seed >> 32));
#pragma unroll
    for (int w = 0; w < 4; ++w) pk[4 * g + w] &= keep.mask(r.v[w]);
  }
#endif
}

}  // namespace sm90
