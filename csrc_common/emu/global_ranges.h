// The global-memory ranges a launch may touch (given by the launcher) and the check of every global access.
#pragma once
#include <stdint.h>
#include "workgroup.h"

namespace rtc_emu {

// Appends [base, base + bytes) to out[*n] (room for one more is the caller's); an empty range is dropped.
inline void add_range(Range* out, int* n, const void* base, unsigned long long bytes) {
  if (!base || bytes == 0) return;
  const uintptr_t lo = (uintptr_t)base;
  out[(*n)++] = Range{lo, lo + (uintptr_t)bytes};
}

// Every global access of a kernel (rtc_gld/rtc_gst, global_load/global_store, and each in-range
// dword of a buffer load/store) must fall inside a range the launcher registered; a launch with no
// ranges has no valid global memory. An error names the kernel, lane and address.
inline void check_global(const void* p, size_t bytes, const char* what) {
  const Workgroup* wg = t_cur->wg;
  if (wg->n_ranges == 0)
    fail("%s of %zu bytes at global address %p: the launch gave no global ranges, so no global memory "
         "is valid (pass each buffer's (address, bytes) to the launch)",
         what, bytes, p);
  const uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < wg->n_ranges; ++i)
    if (a >= wg->ranges[i].lo && a + bytes <= wg->ranges[i].hi && a + bytes >= a) return;
  fail("%s of %zu bytes at global address %p is outside every tensor of the launch", what, bytes, p);
}

}  // namespace rtc_emu
