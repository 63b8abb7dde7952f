// What every decode kernel shares with its host: the parameter block (AttnParams plus the launch plan: stage, packed
// rows, KV split), the work item of 16 packed q rows, the limits, and the layout of a split part's partial result.
// The kernels' own shapes are in their params.h (gfx942_decode/, sm90_decode/).
#pragma once
#include "attn_params.h"

#define DECODE_ROWS 16          // packed q rows per work item: the M rows of one MFMA / MMA tile
#define DECODE_MAX_Q 16  // query rows per sequence a decode kernel takes (why_not): decode and speculative decoding
#define DECODE_MAX_SPLITS 1024  // KV parts per work item at most (forced or planned)

// One split part's partial result: unnormalised fp32 O [16 rows][bucket], then m [16], l [16]; of it, a row of the
// call moves decode_part_row_bytes (its O row, m and l: the gfx942 kernel writes and reads back those rows only).
RTC_HD constexpr long long decode_part_row_bytes(int bucket) { return (long long)(bucket + 2) * 4; }
RTC_HD constexpr long long decode_part_bytes(int bucket) { return DECODE_ROWS * decode_part_row_bytes(bucket); }

// Bytes a [rows, heads, d] view of 16-bit elements (row stride ss, head stride sh, both >= 0) spans from its first
// element: the q or o rows of one (sequence, K/V head).
RTC_HD rtc_i64 decode_group_span_bytes(rtc_i64 rows, rtc_i64 ss, rtc_i64 heads, rtc_i64 sh, rtc_i64 d) {
  return rows <= 0 || heads <= 0 ? 0 : ((rows - 1) * ss + (heads - 1) * sh + d) * 2;
}

enum DecodeStage { DECODE_STAGE_ATTN = 0, DECODE_STAGE_MERGE = 1 };

// A work item is 16 packed q rows of one (sequence, K/V head): packed row R = i * group + g is query row i of q head
// hk * group + g, so every q head of a K/V head and every query row of a sequence share one pass over its K/V.
// Items are numbered (b * heads_k + hk) * chunks + chunk; the attention stage runs splits parts of each, part taking
// a contiguous share of the item's KV steps. With splits > 1 the parts write partials to the workspace and the merge
// stage combines them in part order.
struct DecodeParams : AttnParams {
  int stage;  // DecodeStage
  int group;  // q heads per K/V head (heads / heads_k)
  int chunks;  // work items per (sequence, K/V head): ceil(group * seq_q / 16)
  int splits;  // KV parts per work item (1: no partials, no merge)
};
