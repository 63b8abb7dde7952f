// Host side of the gfx942 backward (gfx942.hip): three launches of 256-thread blocks: delta a thread a query row,
// dK / dV a block per 64 keys of one K/V head, dQ a block per 64 query rows of one head.
#include "op.h"

namespace attention_bwd {
namespace {

constexpr PlainKernel kGfx942{"gfx942", 256, {256, 64, 64}};

}  // namespace

rtc::KernelHost gfx942_host() { return plain_host<kGfx942>(); }

}  // namespace attention_bwd
