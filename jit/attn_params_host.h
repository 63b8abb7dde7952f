// Includes csrc_common/attn_params.h from host C++ so host and kernels share one AttnParams.
#pragma once
// platform.h has a plain-host branch (neither __HIP__ nor __HIPCC_RTC__ nor CUDA defined), so the
// header compiles under g++ as is; sizes and offsets match the kernels' (LP64 on both sides).
#include "../csrc_common/attn_params.h"
static_assert(sizeof(void*) == 8, "AttnParams is shared with 64-bit GPU code: build the runtime for a 64-bit host");
