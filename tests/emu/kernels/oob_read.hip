// Negative test: lane 5 reads one element past the end of x through a checked global load.
#include "platform.h"
#include "isa_gfx9.h"

struct OobParams {
  const rtc_bf16_t* x;  // n elements
  rtc_bf16_t* out;      // 64 elements
  int n;
};

RTC_KERNEL(64) oob_read(OobParams p) {
  const int i = threadIdx.x == 5 ? p.n : 0;  // lane 5 reads x[n]: past the tensor
  global_store(p.out + threadIdx.x, global_load(p.x + i));
}
RTC_EXPORT_KERNEL(oob_read, OobParams)
