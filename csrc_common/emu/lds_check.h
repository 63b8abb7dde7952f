// LDS bounds and race checks for every emulated shared-memory access, and rtc_smem / RTC_SHARED.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "workgroup.h"

namespace rtc_emu {

// A byte written by one wave and touched by another in the same barrier epoch is a race; within
// one wave, lanes run one after another between collectives, so a byte written by one lane and
// touched by another with no collective (wave sync) in between is reported too: on hardware its
// value would depend on instruction order the source does not fix.
inline void check_unit_write(ShadowEntry& s, uint32_t E, uint32_t WE, uint8_t W, uint8_t L, size_t off) {
  if (s.w_epoch == E && s.w_wave != W)
    fail("LDS race: write of byte offset %zu, which wave %d (lane %d) wrote in the same barrier "
         "interval (no __syncthreads between)",
         off, s.w_wave, s.w_lane);
  if (s.r_epoch == E) {
    if (s.r_wave != W)
      fail("LDS race: write of byte offset %zu, which %s read in the same barrier interval "
           "(write after read with no __syncthreads between)",
           off, s.r_wave == kMany ? "several waves" : "another wave");
    if (s.r_wepoch == WE && s.r_lane != L)
      fail("LDS race: write of byte offset %zu, which another lane of this wave read with no wave "
           "sync (collective, s_waitcnt, wave barrier) between",
           off);
  }
  s.w_epoch = E;
  s.w_wepoch = WE;
  s.w_wave = W;
  s.w_lane = L;
}

inline void check_unit_read(ShadowEntry& s, uint32_t E, uint32_t WE, uint8_t W, uint8_t L, size_t off) {
  if (s.w_epoch == E) {
    if (s.w_wave != W)
      fail("LDS race: read of byte offset %zu, which wave %d (lane %d) wrote in the same barrier "
           "interval (no __syncthreads between)",
           off, s.w_wave, s.w_lane);
    if (s.w_lane != L && s.w_wepoch == WE)
      fail("LDS race: read of byte offset %zu, which lane %d of this wave wrote with no wave sync "
           "(collective, s_waitcnt, wave barrier) between",
           off, s.w_lane);
  }
  if (s.r_epoch != E || (s.r_wave == W && s.r_wepoch != WE)) {
    s.r_epoch = E;
    s.r_wepoch = WE;
    s.r_wave = W;
    s.r_lane = L;
  } else if (s.r_wave != W) {
    s.r_wave = kMany;
  } else if (s.r_lane != L) {
    s.r_lane = kMany;
  }
}

inline void lds_access(const void* p, size_t bytes, bool write, const char* what) {
  Fiber* f = t_cur;
  Workgroup* wg = f->wg;
  const uintptr_t off = (uintptr_t)p - (uintptr_t)wg->lds.bytes;
  if (bytes == 0 || off >= (uintptr_t)kLdsBytes || bytes > (uintptr_t)kLdsBytes - off)
    fail("%s of %zu bytes at address %p is outside the workgroup's LDS (%d bytes at %p)", what, bytes, p, kLdsBytes,
         (const void*)wg->lds.bytes);
  const uint32_t E = wg->epoch, WE = wg->waves[f->wave].epoch;
  const uint8_t W = (uint8_t)f->wave, L = (uint8_t)f->lane;
  const size_t last = (off + bytes - 1) / kShadowGrain;
  for (size_t u = off / kShadowGrain; u <= last; ++u) {
    if (write)
      check_unit_write(wg->lds.shadow[u], E, WE, W, L, u * kShadowGrain);
    else
      check_unit_read(wg->lds.shadow[u], E, WE, W, L, u * kShadowGrain);
  }
}

// Byte offset of p inside the LDS (what an LDS address register holds on hardware).
inline uint32_t lds_offset(const void* p) {
  const uintptr_t off = (uintptr_t)p - (uintptr_t)t_cur->wg->lds.bytes;
  if (off >= (uintptr_t)kLdsBytes) fail("address %p is not inside the workgroup's LDS", p);
  return (uint32_t)off;
}

inline unsigned char* lds_at(uint32_t off) { return t_cur->wg->lds.bytes + off; }

template <class T>
T& lds_object() {
  static_assert(sizeof(T) <= (size_t)kLdsBytes, "RTC_SHARED type is larger than the 64 KiB LDS");
  return *reinterpret_cast<T*>(t_cur->wg->lds.bytes);
}

[[noreturn]] inline void smem_index_error(const char* op, int i, int n, size_t elem) {
  fail("rtc_smem<%zu-byte element, %d>::%s index %d is out of range [0, %d)", elem, n, op, i, n);
}

}  // namespace rtc_emu

// The checked shared-memory array of the platform contract: same layout as on GPUs.
template <typename T, int N>
struct rtc_smem {
  T data[N];
  T ld(int i) const {
    if ((unsigned)i >= (unsigned)N) ::rtc_emu::smem_index_error("ld", i, N, sizeof(T));
    ::rtc_emu::lds_access(&data[i], sizeof(T), false, "rtc_smem::ld");
    return data[i];
  }
  void st(int i, T v) {
    if ((unsigned)i >= (unsigned)N) ::rtc_emu::smem_index_error("st", i, N, sizeof(T));
    ::rtc_emu::lds_access(&data[i], sizeof(T), true, "rtc_smem::st");
    data[i] = v;
  }
  void ld2(int i, T& a, T& b) const {
    if ((unsigned)i >= (unsigned)(N - 1)) ::rtc_emu::smem_index_error("ld2", i, N, sizeof(T));
    if (i % 2 != 0 || reinterpret_cast<uintptr_t>(&data[i]) % (2 * sizeof(T)) != 0)
      ::rtc_emu::fail("rtc_smem<%zu-byte element, %d>::ld2 index %d: the pair is not %zu-byte aligned", sizeof(T), N, i,
                      2 * sizeof(T));
    ::rtc_emu::lds_access(&data[i], 2 * sizeof(T), false, "rtc_smem::ld2");
    a = data[i], b = data[i + 1];
  }
  static constexpr int size = N;
};

// One LDS buffer per workgroup, poisoned at workgroup start; the kernel's shared struct is laid
// over it. (One RTC_SHARED per kernel, as on GPUs where it is the block's whole static LDS.)
#define RTC_SHARED(Type, name) Type& name = ::rtc_emu::lds_object<Type>()
