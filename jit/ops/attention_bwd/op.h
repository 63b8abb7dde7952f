// Host pieces the attention_bwd kernels share: the forward call of a backward call, the parameter block, one launch.
#pragma once
#include <cstdint>
#include <string>
#include "args.h"
#include "bwd_params.h"
#include "../attention_fwd/op.h"

namespace attention_bwd {

// The forward call whose gradients a backward call asks for: the shared fields, copied by the forward's list.
AttentionFwdArgs forward_call(const AttentionBwdArgs& a);
// Bytes of delta (fp32, the LSE's layout) in the workspace.
int64_t delta_bytes(const AttentionBwdArgs& a);
// The kernels' parameter block, filled from checked arguments (stage BWD_STAGE_DELTA).
BwdParams fill_params(const AttentionBwdArgs& a);
// Launches program with the by-value parameter block; the memory it may touch: the forward's tensors and the
// gradients'.
void launch(uint64_t program, const rtc::LaunchTarget& t, const AttentionBwdArgs& a, const unsigned (&grid)[3],
            unsigned block, unsigned shared_bytes, const BwdParams& params);

rtc::KernelHost gfx942_host();
rtc::KernelHost baseline_host();
rtc::KernelHost sm90_host();

}  // namespace attention_bwd
