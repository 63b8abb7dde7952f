// Negative test: reads one row past the end of q through a checked global load.
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx9.h"

RTC_KERNEL(64) oob_read(AttnParams p) {
  const rtc_i64 row = threadIdx.x == 5 ? p.seq_q : 0;  // lane 5 reads row seq_q: past the tensor
  const rtc_bf16_t v = global_load(p.q + row * p.q_ss);
  global_store(p.o + threadIdx.x, v);
}
RTC_EXPORT_KERNEL(oob_read, AttnParams)
