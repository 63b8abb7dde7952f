// Negative test: only half of a wave reaches a wave-wide instruction.
#include "platform.h"
#include "isa_gfx9.h"

struct DivParams {
  rtc_u32* out;
};

RTC_KERNEL(128) divergent(DivParams p) {
  const rtc_u32 t = threadIdx.x;
  rtc_u32 v = t;
  if (blockIdx.x == 1 && t >= 64 && t < 96) v = ds_swizzle<0x401F>(v);  // wave 1, lanes 0..31 only
  rtc_gst(p.out + blockIdx.x * 128 + t, v);
}
RTC_EXPORT_KERNEL(divergent, DivParams)
