// Negative test: wave 1 reads LDS words wave 0 wrote, with no barrier in between.
#include "platform.h"

struct RaceParams {
  float* out;
};
struct RaceLds {
  rtc_smem<float, 128> v;
};

RTC_KERNEL(128) race(RaceParams p) {
  RTC_SHARED(RaceLds, sm);
  const int t = (int)threadIdx.x;
  sm.v.st(t, (float)t);
  // missing __syncthreads() here
  rtc_gst(p.out + t, sm.v.ld((t + 64) % 128));
}
RTC_EXPORT_KERNEL(race, RaceParams)
