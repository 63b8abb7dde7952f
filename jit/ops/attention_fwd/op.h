// Host pieces the attention_fwd kernels share: the parameter block from the arguments, launch ranges, one launch.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "args.h"
#include "attn_params.h"
#include "op_registry.h"
#include "rtc_abi.h"

namespace attention_fwd {

// The checks every kernel relies on (attention_fwd's validate; the backward's call is checked as its forward).
void validate_args(const AttentionFwdArgs& a);
// Bytes a strided [B, S, H, D] view of `unit`-byte elements spans, or -1 when that overflows 63 bits.
int64_t view_bytes(int64_t b, int64_t s, int64_t h, int64_t d, const int64_t (&st)[3], int64_t unit);
// Appends the memory a strided [B, S, H, D] view of `elem`-byte elements reaches (nothing for a null base).
void add_view(std::vector<rtc_mem_range>& out, const void* base, size_t elem, int64_t b, int64_t s, int64_t h,
              int64_t d, const int64_t (&st)[3]);
// The kernels' common parameter block, filled from checked arguments.
AttnParams fill_params(const AttentionFwdArgs& a);
// The global memory a launch of these arguments may touch: q, k, v, o views, lse, workspace.
std::vector<rtc_mem_range> tensor_ranges(const AttentionFwdArgs& a);
// Launches program once with the by-value parameter block (params, size).
void launch(uint64_t program, const rtc::LaunchTarget& t, const AttentionFwdArgs& a, const unsigned (&grid)[3],
            unsigned block, unsigned shared_bytes, const void* params, size_t size);
// The same launch given the memory it may touch (ranges): the backward's, which adds the gradients' views.
void launch_within(uint64_t program, const rtc::LaunchTarget& t, const std::vector<rtc_mem_range>& ranges,
                   const unsigned (&grid)[3], unsigned block, unsigned shared_bytes, const void* params, size_t size);
// Why `kernel` cannot take tensor `name` at ptr with strides st (elements) when it needs 16-byte aligned rows and
// strides that are multiples of align_elems in [0, 2^38); empty when it can.
std::string aligned_why_not(const char* kernel, const char* name, const void* ptr, const int64_t (&st)[3],
                            int64_t align_elems);
// Throws RTC_ERR_ARG unless the call's workspace holds `need` bytes (none needed: anything goes), naming `kernel` (e.g.
// "the gfx942 kernel") and the size rtc_op_workspace_bytes gives.
void require_workspace(const AttentionFwdArgs& a, int64_t need, const std::string& kernel);
// The KV split of a decode kernel's host (gfx942_decode.cpp, sm90_decode.cpp): tail_split > 1 forces that many parts
// (at most DECODE_MAX_SPLITS, whatever max_splits says); 0, or the NO_TAIL knob with a planned split, is none; -1
// plans when can_plan: the fewest parts of the least cost(g) over g = 1 .. the most (steps / min_steps_per_part,
// max_splits when >= 1: flash-attn's num_splits, DECODE_MAX_SPLITS), else none.
int decode_splits(const AttentionFwdArgs& a, int64_t steps, int min_steps_per_part, bool can_plan,
                  const std::function<double(int64_t)>& cost);
// {"key": value, ...} from (key, integer) pairs.
std::string json_object(const std::vector<std::pair<std::string, int64_t>>& fields);

// The kernels' host descriptors (baseline.cpp, gfx942.cpp, gfx942_decode.cpp, sm90.cpp, sm90_decode.cpp), registered
// by op.cpp.
rtc::KernelHost baseline_host();
rtc::KernelHost gfx942_host();
rtc::KernelHost gfx942_decode_host();
rtc::KernelHost gfx950_decode_host();  // the gfx942 decode kernel's native FP4 path (gfx950): its host, another name
rtc::KernelHost sm90_host();
rtc::KernelHost sm90_decode_host();

}  // namespace attention_fwd
