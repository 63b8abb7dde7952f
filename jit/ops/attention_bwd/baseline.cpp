// Host side of the portable baseline backward: three launches of 128-thread blocks (baseline.hip): delta a thread a
// query row, dK / dV a block per 16 keys of one K/V head, dQ a block per 16 query rows of one head.
#include "op.h"

namespace attention_bwd {
namespace {

constexpr PlainKernel kBaseline{"baseline", 128, {128, 16, 16}};

}  // namespace

rtc::KernelHost baseline_host() { return plain_host<kBaseline>(); }

}  // namespace attention_bwd
