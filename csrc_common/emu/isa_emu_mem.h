// The memory wrappers of isa_gfx9.h under the emulator: buffer loads/stores with num_records, LDS DMA, checked global
// and LDS access.
#pragma once
#include <string.h>
#include "isa_host.h"
#include "lds_check.h"
#include "global_ranges.h"

namespace rtc_emu {

inline isa::BufferDesc buffer_desc(rtc_buffer_rsrc r, const char* what) {
  uint32_t w[4];
  for (int i = 0; i < 4; ++i) w[i] = (uint32_t)r[i];
  isa::BufferDesc d = isa::decode_rsrc(w);
  if (d.stride != 0)
    fail("%s: buffer resource with stride %u; only raw (stride 0) buffers are emulated", what, d.stride);
  return d;
}

// Copies `dwords` dwords at voffset + soffset; dwords past num_records read as 0.
inline void buffer_read(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset, rtc_u32* out, int dwords,
                        const char* what) {
  const isa::BufferDesc d = buffer_desc(r, what);
  for (int i = 0; i < dwords; ++i) {
    const uint64_t off = (uint64_t)voffset + soffset + 4u * i;
    out[i] = 0;
    if (!isa::dword_in_range(d, off)) continue;
    const void* p = (const void*)(d.base + off);
    check_global(p, 4, what);
    memcpy(&out[i], p, 4);
  }
}

inline void buffer_write(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset, const rtc_u32* in, int dwords,
                         const char* what) {
  const isa::BufferDesc d = buffer_desc(r, what);
  for (int i = 0; i < dwords; ++i) {
    const uint64_t off = (uint64_t)voffset + soffset + 4u * i;
    if (!isa::dword_in_range(d, off)) continue;  // dropped, as on hardware
    void* p = (void*)(d.base + off);
    check_global(p, 4, what);
    memcpy(p, &in[i], 4);
  }
}

}  // namespace rtc_emu

RTC_ISA unsigned char buffer_load_ubyte(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset) {
  const ::rtc_emu::isa::BufferDesc d = ::rtc_emu::buffer_desc(r, "buffer_load_ubyte");
  const uint64_t off = (uint64_t)voffset + soffset;
  if (off + 1 > (uint64_t)d.num_records) return 0;  // past num_records: 0, as a dword load's dwords
  const unsigned char* p = (const unsigned char*)(d.base + off);
  ::rtc_emu::check_global(p, 1, "buffer_load_ubyte");
  return *p;
}
RTC_ISA rtc_u32 buffer_load_dword(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset) {
  rtc_u32 v;
  ::rtc_emu::buffer_read(r, voffset, soffset, &v, 1, "buffer_load_dword");
  return v;
}
RTC_ISA rtc_u32x2 buffer_load_dwordx2(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset) {
  rtc_u32 v[2];
  ::rtc_emu::buffer_read(r, voffset, soffset, v, 2, "buffer_load_dwordx2");
  return rtc_u32x2{v[0], v[1]};
}
RTC_ISA rtc_u32x4 buffer_load_dwordx4(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset) {
  rtc_u32 v[4];
  ::rtc_emu::buffer_read(r, voffset, soffset, v, 4, "buffer_load_dwordx4");
  return rtc_u32x4{v[0], v[1], v[2], v[3]};
}
RTC_ISA void buffer_store_dword(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset, rtc_u32 v) {
  ::rtc_emu::buffer_write(r, voffset, soffset, &v, 1, "buffer_store_dword");
}
RTC_ISA void buffer_store_dwordx2(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset, rtc_u32x2 v) {
  const rtc_u32 w[2] = {v[0], v[1]};
  ::rtc_emu::buffer_write(r, voffset, soffset, w, 2, "buffer_store_dwordx2");
}
RTC_ISA void buffer_store_dwordx4(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset, rtc_u32x4 v) {
  const rtc_u32 w[4] = {v[0], v[1], v[2], v[3]};
  ::rtc_emu::buffer_write(r, voffset, soffset, w, 4, "buffer_store_dwordx4");
}

// buffer_load_dword ... lds: lane l's dword lands at lds_base + 4*l (M0 = lds_base). The copy is
// done at issue; s_waitcnt vmcnt(0) and a barrier must still come before other waves read it.
RTC_ISA void buffer_load_dword_lds(rtc_buffer_rsrc r, rtc_u32 voffset, rtc_u32 soffset, void* lds_base) {
  rtc_u32 v;
  ::rtc_emu::buffer_read(r, voffset, soffset, &v, 1, "buffer_load_dword lds");
  unsigned char* dst = (unsigned char*)lds_base + 4 * ::rtc_emu::t_cur->lane;
  ::rtc_emu::lds_access(dst, 4, true, "buffer_load_dword lds");
  memcpy(dst, &v, 4);
}

// Plain global loads/stores (global_load_dword*, global_store_dword*), range-checked against the
// launch's tensors.
template <class T>
RTC_ISA T global_load(const T* p) {
  ::rtc_emu::check_global(p, sizeof(T), "global load");
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
// s_load (isa_gfx9.h): a global load as far as the emulator can tell, range-checked the same way.
template <class T>
RTC_ISA T scalar_load(const T* p) {
  ::rtc_emu::check_global(p, sizeof(T), "scalar load");
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
RTC_ISA void global_store(T* p, T v) {
  ::rtc_emu::check_global(p, sizeof(T), "global store");
  memcpy(p, &v, sizeof(T));
}

// ds_read_b32/b64/b128 and ds_write_*: raw LDS access at a pointer into the RTC_SHARED storage.
template <class T>
RTC_ISA T ds_read(const void* lds_ptr) {
  ::rtc_emu::lds_access(lds_ptr, sizeof(T), false, "ds_read");
  T v;
  memcpy(&v, lds_ptr, sizeof(T));
  return v;
}
template <class T>
RTC_ISA void ds_write(void* lds_ptr, T v) {
  ::rtc_emu::lds_access(lds_ptr, sizeof(T), true, "ds_write");
  memcpy(lds_ptr, &v, sizeof(T));
}
