// Benchmark kernel: nothing but barriers and wave collectives, to time fiber switches alone.
#include "platform.h"
#include "isa_gfx9.h"

struct SwitchParams {
  rtc_u32* out;
  int iters;
};

RTC_KERNEL(256) switch_bench(SwitchParams p) {
  rtc_u32 v = threadIdx.x;
  for (int i = 0; i < p.iters; ++i) {
    __syncthreads();
    v += readfirstlane(v);
  }
  p.out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
RTC_EXPORT_KERNEL(switch_bench, SwitchParams)
