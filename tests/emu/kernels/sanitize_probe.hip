// Planted bugs for sanitized builds (tests/cpu/test_sanitize.py), made by lane 5 only. mode 1: a read one
// element past the end of x through a plain dereference, which the emulator's range check does not see
// (only ASan does); mode 2: a shift by 40 bits of an int (UBSan). mode 0: no bug.
#include "platform.h"

struct SanitizeProbeParams {
  const int* x;  // n elements
  int* out;      // 64 elements
  int n;
  int mode;
};

RTC_KERNEL(64) sanitize_probe(SanitizeProbeParams p) {
  const int t = (int)threadIdx.x;
  int v = p.x[t == 5 && p.mode == 1 ? p.n : t];
  if (t == 5 && p.mode == 2) v = v << (p.n - 260);
  rtc_gst(p.out + t, v);
}
RTC_EXPORT_KERNEL(sanitize_probe, SanitizeProbeParams)
