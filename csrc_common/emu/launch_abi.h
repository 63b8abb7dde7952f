// The C interface between the host loader and an emulated kernel's shared object.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RTC_EMU_ABI_VERSION 2

// A global-memory range the kernel may touch (checked loads/stores and buffer accesses, whose
// num_records rules apply first). A launch that passes none has no valid global memory: any
// global access of its kernel is reported.
typedef struct rtc_emu_range {
  const void* base;
  unsigned long long bytes;
} rtc_emu_range;

// Fiber stacks kept by the loader between launches, process-wide (a launch then maps, guards and first-touches no
// stack pages: the OS zeroes each page at its first touch). take: a region of `count` stacks of `stack_bytes`, each
// with its lowest `guard_bytes` already inaccessible, that an earlier launch gave back, or null (the kernel maps its
// own). give: 1 when the loader keeps the region for a later launch, 0 when it declines (the kernel unmaps it). The
// loader bounds what it keeps; it never reads or writes the stacks.
typedef void* (*rtc_emu_take_stacks_fn)(unsigned long long count, unsigned long long stack_bytes,
                                        unsigned long long guard_bytes);
typedef int (*rtc_emu_give_stacks_fn)(void* base, unsigned long long count, unsigned long long stack_bytes,
                                      unsigned long long guard_bytes);

// What the host loader passes to rtc_emu_launch_<kernel>.
typedef struct rtc_emu_launch {
  int abi_version;                 // RTC_EMU_ABI_VERSION
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;           // dynamic LDS; the emulator's LDS is one 64 KiB buffer anyway
  int host_threads;                // workgroups run on this many host threads (0 = one per core)
  const rtc_emu_range* ranges;     // the global ranges of the launch (its tensors, from the launcher)
  int n_ranges;
  unsigned long long stats[4];     // out: fiber switches, barriers, collectives, workgroups
  rtc_emu_take_stacks_fn take_stacks;  // null: every launch maps its own stacks
  rtc_emu_give_stacks_fn give_stacks;
} rtc_emu_launch;

// Each kernel's entry (RTC_EXPORT_KERNEL): 0 on success, else non-zero with a message in err.
typedef int (*rtc_emu_entry_fn)(rtc_emu_launch* launch, const void* params, size_t params_size, char* err, size_t errn);

#ifdef __cplusplus
}
#endif
