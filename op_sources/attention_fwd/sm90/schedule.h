// Packed sequences (RTC_KV != 0): the order in which the persistent CTAs take the tiles.
//
// A tile is (level m, sequence b, head h): the q rows [M m, M m + M) of one head of one (M: the plan's block_m)
// sequence. Levels go from the highest m-block down, so the tiles with the most work (the last
// m-blocks see the most keys under a causal mask, and only long sequences have high m-blocks) go
// first; inside a level, only the sequences that reach it, longest first, heads fastest (the heads
// of a GQA group share K/V in L2). Every CTA builds the same table in shared memory from
// cu_seqlens_q, a stable counting sort of the sequences by m-block count: no host sync, no second
// launch, and no tile past a sequence's end is ever handed out.
#pragma once
#include "attn_params.h"
#include "sm90/params.h"

namespace sm90 {

// The table's arrays, one after the other in `words` (so the CTA keeps one pointer to it):
//   pairs [1]            every (level, sequence) with rows: tiles = pairs * heads (first: its address is `words`)
//   count [batch]        m-blocks of each sequence (while building)
//   perm  [batch]        sequences by m-block count, descending, stable
//   cursor[levels + 1]   histogram, then the sort's write positions (while building)
//   above [levels + 1]   above[L] = sequences with more than L m-blocks = the (L, b) pairs of level L
//   before[levels + 1]   before[L] = pairs at levels > L, which come first
struct Schedule {
  const int* words;
  int batch, levels, pairs;  // pairs: every (level, sequence) with rows; tiles = pairs * heads

  RTC_DEVICE const int* perm() const { return words + 1 + batch; }
  RTC_DEVICE const int* before() const { return words + 1 + 2 * batch + 2 * (levels + 1); }

  // Tile t -> (m_block, head, batch): level L holds pairs [before[L], before[L] + above[L]), so L is the
  // smallest level with before[L] <= pair (before does not increase with L).
  RTC_DEVICE void decode(int t, int heads, int& m_block, int& head, int& seq) const {
    const int pair = t / heads;
    const int* bef = before();
    int lo = 0, hi = levels - 1;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (bef[mid] <= pair)
        hi = mid;
      else
        lo = mid + 1;
    }
    m_block = lo;
    seq = perm()[pair - bef[lo]];
    head = t - pair * heads;
  }
};

// out[v] = in[v+1] + ... + in[n-1] for v in [0, n); returns the sum of all. One warp, 32 values a step.
RTC_DEVICE int suffix_sum_exclusive(const int* in, int* out, int n, int lane) {
  int carry = 0;
  for (int top = n - 1; top >= 0; top -= 32) {
    const int v = top - lane;
    const int x = v >= 0 ? in[v] : 0;
    int y = x;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, y, off);
      if (lane >= off) y += t;
    }
    if (v >= 0) out[v] = carry + y - x;
    carry += __shfl_sync(0xffffffffu, y, 31);
  }
  return carry;
}

// Builds the table in `words` (SM90_SCHEDULE_BYTES of shared memory); every thread of the CTA calls it.
RTC_DEVICE Schedule build_schedule(const AttnParams& a, int levels, int* words, int block_m) {
  const int batch = a.batch, tid = threadIdx.x, lane = tid % 32;
  int* pairs = words;
  int* count = words + 1;
  int* perm = count + batch;
  int* cursor = perm + batch;
  int* above = cursor + levels + 1;
  int* before = above + levels + 1;
  for (int v = tid; v <= levels; v += blockDim.x) cursor[v] = 0;
  __syncthreads();
  for (int b = tid; b < batch; b += blockDim.x) {
    // Rows past max_seqlen_q are not computed (bad metadata; RTCATTN_CHECK=1 refuses it).
    const int len = seq_of(a, b).len_q, n = (len + block_m - 1) / block_m;
    count[b] = n < levels ? n : levels;
    atomicAdd(&cursor[count[b]], 1);
  }
  __syncthreads();
  if (tid < 32) {
    suffix_sum_exclusive(cursor, above, levels + 1, lane);
    __syncwarp();
    const int total = suffix_sum_exclusive(above, before, levels, lane);
    for (int v = lane; v <= levels; v += 32) cursor[v] = above[v];  // value v's first slot, descending
    __syncwarp();
    // Stable scatter, 32 sequences a step: equal counts keep their order (every CTA builds the same table).
    for (int c = 0; c < batch; c += 32) {
      const int b = c + lane, v = b < batch ? count[b] : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, v);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      if (v >= 0) perm[cursor[v] + rank] = b;
      __syncwarp();
      if (v >= 0 && rank == 0) cursor[v] += __popc(peers);
      __syncwarp();
    }
    if (lane == 0) *pairs = total;
  }
  __syncthreads();
  return Schedule{words, batch, levels, *pairs};
}

}  // namespace sm90
