// Platform prelude under the CPU wave emulator: the contract names of platform.h as host C++.
#pragma once
#include "host_math.h"
#include <stdint.h>
#include <string.h>

#ifndef RTC_EMU_ARCH
#define RTC_EMU_ARCH 0x942  // hex, so that `#if RTC_EMU_ARCH == 0x90a` works in the preprocessor
#endif
#if RTC_EMU_ARCH != 0x942 && RTC_EMU_ARCH != 0x90a && RTC_EMU_ARCH != 0x950
#error "RTC_EMU_ARCH must be 0x942 (gfx942), 0x90a (gfx90a) or 0x950 (gfx950)"
#endif
#define RTC_GFX RTC_EMU_ARCH  // platform.h's name for the arch, on the GPU and here

typedef int rtc_i32;
typedef unsigned int rtc_u32;
typedef long long rtc_i64;
typedef unsigned long long rtc_u64;
typedef unsigned short rtc_bf16_t;  // raw bf16 bits
typedef unsigned short rtc_elem_t;  // raw bits of a 16-bit element: bf16 or fp16 (platform.h)

#define RTC_WAVE 64
#define RTC_DEVICE inline
#define RTC_HD inline
// Kernels become plain functions run by every fiber; the launch entry is RTC_EXPORT_KERNEL's.
// The launch bound is not enforced: the host loader checks only the 1024-thread hardware limit.
#define RTC_KERNEL(bounds) static void
#define RTC_KERNEL_ONE_BLOCK(bounds) static void

#include "grid.h"
#include "lds_check.h"

// Per work-item ids: each fiber reads its own (the current fiber of this host thread).
#define threadIdx (::rtc_emu::t_cur->tid)
#define blockIdx (::rtc_emu::t_cur->wg->bid)
#define blockDim (::rtc_emu::t_cur->wg->bdim)
#define gridDim (::rtc_emu::t_cur->wg->gdim)

inline void __syncthreads() { ::rtc_emu::barrier(); }

// Global memory through the platform contract: every access is checked against the launch's tensors.
template <typename T>
inline T rtc_gld(const T* p) {
  ::rtc_emu::check_global(p, sizeof(T), "global load");
  return *p;
}
template <typename T>
inline void rtc_gst(T* p, T v) {
  ::rtc_emu::check_global(p, sizeof(T), "global store");
  *p = v;
}
