// The gfx942 decode kernel's shapes per head-dim bucket, shared by host and kernel; the parameter block DecodeParams,
// the work item and the partials' layout are every decode kernel's (decode_params.h).
#pragma once
#include "decode_params.h"

#define DECODE_THREADS 64      // one wave per workgroup
#define DECODE_MERGE_BATCH 16  // split parts whose partials a merge lane loads at once (one memory round trip)

// The merge's lanes are 16 packed rows x 4 column quads; an item whose rows of the call fill fewer than 16 (a GQA group
// of 4 at Sq 1 holds 4) gives the spare row lanes to parts: its live rows rounded up to a power of two, R, and
// 16 / R part groups, each lane merging every (16 / R)-th part, the groups then combined across lanes. The merge's
// round trips: ceil(splits / (DECODE_MERGE_BATCH x groups)). live_rows: the item's rows of the call, 1..16.
RTC_HD constexpr int decode_merge_rows(int live_rows) {
  return live_rows <= 1 ? 1 : live_rows <= 2 ? 2 : live_rows <= 4 ? 4 : live_rows <= 8 ? 8 : 16;
}
RTC_HD constexpr int decode_merge_groups(int live_rows) { return 16 / decode_merge_rows(live_rows); }

// 16-key sub-tiles per KV step, by head-dim bucket: a step's K and V are loaded into registers at once
// (bucket / 4 VGPRs per sub-tile), so the step shrinks as the bucket grows: 4 at 64, 2 up to 192, 1 at 256 (96 at
// 4 sub-tiles took 260 VGPRs + AGPRs: one wave per SIMD).
RTC_HD constexpr int decode_subs(int bucket) { return bucket <= 64 ? 4 : bucket <= 192 ? 2 : 1; }
RTC_HD constexpr int decode_step_keys(int bucket) { return 16 * decode_subs(bucket); }
// KV steps whose K and V loads a wave keeps in flight, by arch (gfx: as decode_min_waves below), bucket and cache
// format: the loop holds that many steps' registers (a ring) and refills a step's as soon as it is consumed with the
// rows of the step that many ahead, so a step waits for loads issued that many steps earlier. FP4's rows take a
// quarter of a 16-bit row's registers, so it keeps 3 steps in flight (2 at 256 on gfx90a, where 3 spill, and where
// the arch is unknown) (the softmax still runs per step: the same steps and bits as the 16-bit variant); the others 1
// (FP8 at 2 cost more waves than its loads gained: docs/NOTES.md). The split planner prices a part's steps with the
// same figure.
RTC_HD constexpr int decode_ahead(int bucket, int kv_dtype, int gfx) {
  return rtc_kv_fp4(kv_dtype) ? (bucket <= 192 || gfx == 0x942 || gfx == 0x950 ? 3 : 2) : 1;
}

// A load offset past every K / V buffer resource of the kernel (the host refuses a span above it): a lane whose key
// or columns the call does not have loads from here and reads zeros, with no branch around its load. A load under a
// branch may be skipped, so clang's wait counting takes it for possibly the last load issued and waits for every
// load at the next use of an older one (vmcnt(0)), where an unconditional load lets it wait for just that one.
RTC_HD constexpr unsigned decode_no_row() { return 0xFFFFFFF0u; }

// The V^T tile's row pitch in elements (16 keys + 4: 8-byte aligned reads), and the LDS a workgroup takes: one
// 16-key V^T tile of the bucket's columns, 16-bit elements (mainloop.h's Smem).
#define DECODE_VT_PITCH 20
RTC_HD constexpr int decode_lds_bytes(int bucket) { return bucket * DECODE_VT_PITCH * 2; }

// Waves per SIMD the kernel is built for, by arch (gfx: RTC_GFX's hex digits, the argument block's gfx_arch on the
// host; 0 unknown), bucket and cache format: 2 up to 128, and above it 2 for FP4 (its bytes take a quarter of a 16-bit
// row's registers) and 1 otherwise (a step's K and V registers need more than 256: FP8 fits on gfx942 and gfx950 but
// spills on gfx90a); on gfx950, 3 up to 128 (clang-22 fits every format and dtype in 168 VGPRs there; on gfx942 an
// fp16 query over FP8 spills and FP4 gained nothing, on gfx90a several spill: docs/NOTES.md). The kernel asks for them
// (amdgpu_waves_per_eu), which bounds its registers to 256 a wave where it asks 2 (168 at 3), and under that bound
// clang gives the MFMAs VGPR accumulators: no AGPR copies around O's rescale each step. The split planner counts the
// same waves.
RTC_HD constexpr int decode_min_waves(int bucket, int kv_dtype, int gfx) {
  return bucket <= 128 ? (gfx == 0x950 ? 3 : 2) : rtc_kv_fp4(kv_dtype) ? 2 : 1;
}
