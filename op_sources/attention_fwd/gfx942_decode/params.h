// The gfx942 decode kernel's shapes per head-dim bucket, shared by host and kernel; the parameter block DecodeParams,
// the work item and the partials' layout are every decode kernel's (decode_params.h).
#pragma once
#include "decode_params.h"

#define DECODE_THREADS 64      // one wave per workgroup
#define DECODE_MERGE_BATCH 16  // split parts whose partials the merge loads at once (one memory round trip)

// 16-key sub-tiles per KV step, by head-dim bucket: a step's K and V are loaded into registers at once
// (bucket / 4 VGPRs per sub-tile), so the step shrinks as the bucket grows: 4 at 64, 2 up to 192, 1 at 256 (96 at
// 4 sub-tiles took 260 VGPRs + AGPRs: one wave per SIMD).
RTC_HD constexpr int decode_subs(int bucket) { return bucket <= 64 ? 4 : bucket <= 192 ? 2 : 1; }
RTC_HD constexpr int decode_step_keys(int bucket) { return 16 * decode_subs(bucket); }

// Waves per SIMD the kernel is built for, by bucket: 2 up to 128, 1 above (where a step's K and V registers need more
// than 256). The kernel asks for them (amdgpu_waves_per_eu), which bounds its registers to 256 a wave up to 128, and
// under that bound clang gives the MFMAs VGPR accumulators: no AGPR copies around O's rescale each step.
RTC_HD constexpr int decode_min_waves(int bucket) { return bucket <= 128 ? 2 : 1; }
