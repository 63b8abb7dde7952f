// Negative test: wave 1 returns early and never reaches the barrier the others wait at.
#include "platform.h"

struct SkipParams {
  float* out;
};

RTC_KERNEL(256) barrier_skip(SkipParams p) {
  if (threadIdx.x >= 64 && threadIdx.x < 128) return;
  __syncthreads();
  rtc_gst(p.out + threadIdx.x, 1.0f);
}
RTC_EXPORT_KERNEL(barrier_skip, SkipParams)
