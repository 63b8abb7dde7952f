// Host side of the gfx942 fast attention kernel (plan, workspace size, the V^T / attention / merge launches).
#pragma once
#include <stdint.h>
#include <string>
#include "rtcattn_c.h"

struct AttnParams;

namespace rtc {

// The tail-split plan of one call: pure function of the problem, num_cus and tail_split.
struct Gfx942Plan {
  int nqb = 0, nkb = 0;      // q blocks (384 rows) and kv blocks (64 rows) per (b, h)
  int64_t items = 0;         // B*H*nqb workgroup-sized work items
  int n_prefix = 0;          // items run whole
  int tail = 0;              // items split (0: none)
  int split_g = 1;           // parts per split item
  int n_swz = 0;             // prefix workgroups under the XCD swizzle
  int64_t vt_bytes = 0, workspace_bytes = 0;
};

// tail_split: -1 = the planner decides, 0 = off, > 1 = that many parts (capped at nkb) for the
// last round's items. num_cus <= 0 means unknown: the planner then does not split.
Gfx942Plan plan_gfx942(const rtc_attention_args* a);
int64_t workspace_bytes_gfx942(const rtc_attention_args* a);
// "" when the gfx942 kernel takes these arguments, else why not (dispatch then falls back).
std::string why_not_gfx942(const rtc_attention_args* a, const char* vendor);
// Launches V^T, the attention stage and (when split) the merge on one stream. Returns RTC_OK or
// throws RtcError.
int launch_gfx942(uint64_t program, AttnParams* p, const rtc_attention_args* a, const char* vendor,
                  int device, void* stream);

}  // namespace rtc
