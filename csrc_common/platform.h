// Platform prelude: the few names every kernel uses, on AMD (clang / hipRTC), NVIDIA (NVRTC) and the host emulator.
//
// Contract for kernels (nothing else of a vendor header may be used):
//   RTC_KERNEL(bounds)             extern "C" __global__ with a max-threads launch bound
//   RTC_KERNEL_ONE_BLOCK(bounds)   the same, resident alone: NVIDIA's ptxas may then use every register the block
//                                  can have (with a max-threads bound alone it trades spills for occupancy)
//   RTC_DEVICE                     device function qualifier (RTC_HD: host and device)
//   threadIdx / blockIdx / blockDim / gridDim   .x .y .z as usual
//   __syncthreads()                workgroup barrier with LDS/shared-memory fence
//   rtc_smem<T, N>                 a shared-memory array; access only through .ld(i) / .st(i, v) / .ld2(i, a, b)
//                                  so the emulator can bounds- and race-check every access
//   RTC_SHARED(Type, name)         declares the block's shared storage `Type& name`
//   rtc_gld(ptr) / rtc_gst(ptr, v) global-memory load / store of one value; plain on GPUs, checked
//                                  against the launch's tensors by the emulator (kernel, lane, address)
//   rtc_bf16_t, rtc_elem_t, rtc_i64, rtc_u32, rtc_u64, rtc_i32
//                                  rtc_elem_t: the raw bits of a 16-bit tensor element, bf16 or fp16 alike
//                                  (one type for both, so a parameter block is the same whatever the dtype;
//                                  a kernel reads the bits as its dtype define says)
//   RTC_WAVE                       lanes per wave/warp (64 on gfx9, 32 on NVIDIA)
//   RTC_GFX                        the AMD arch as its gfx hex digits (0x942, 0x90a, 0x950), on the GPU and the
//                                  emulator alike (RTC_EMU_ARCH); undefined on NVIDIA
//   RTC_EXPORT_KERNEL(name, P)     after each kernel: the emulator's launch entry (empty on GPUs)
#pragma once

#if defined(RTC_EMU)
#include "emu/prelude_host.h"
#else

// ---- integer types: hipRTC and NVRTC provide no <stdint.h> ----
typedef int rtc_i32;
typedef unsigned int rtc_u32;
typedef long long rtc_i64;
typedef unsigned long long rtc_u64;
typedef unsigned short rtc_bf16_t;   // raw bf16 bits
typedef unsigned short rtc_elem_t;   // raw bits of a 16-bit element: bf16 or fp16

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// ---------------------------------------------------------------- NVIDIA (NVRTC, nvcc)
#define RTC_NVIDIA 1
#define RTC_WAVE 32
#define RTC_DEVICE __device__ __forceinline__
#define RTC_HD __host__ __device__ __forceinline__
#define RTC_KERNEL(bounds) extern "C" __global__ void __launch_bounds__(bounds)
#define RTC_KERNEL_ONE_BLOCK(bounds) extern "C" __global__ void __launch_bounds__(bounds, 1)

#elif !defined(__HIP__) && !defined(__HIPCC_RTC__)
// ---------------------------------------------------------------- plain host C++ (g++, clang++)
// Host code shares the parameter block and the bf16 helpers; it never sees a kernel.
#define RTC_HOST 1
#define RTC_WAVE 64
#define RTC_DEVICE inline
#define RTC_HD inline

#else
// ---------------------------------------------------------------- AMD (clang -x hip, hipRTC)
#define RTC_AMD 1
#define RTC_WAVE 64
#if defined(__gfx90a__)
#define RTC_GFX 0x90a
#elif defined(__gfx950__)
#define RTC_GFX 0x950
#else
#define RTC_GFX 0x942
#endif
#if !defined(__HIPCC_RTC__)
// clang -x hip -nogpuinc: no HIP headers, so define the language pieces ourselves.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))

#define RTC_AMD_XYZ(name, fx, fy, fz)                                \
  struct name##_t {                                                  \
    __declspec(property(get = get_x)) unsigned x;                    \
    __declspec(property(get = get_y)) unsigned y;                    \
    __declspec(property(get = get_z)) unsigned z;                    \
    __device__ __forceinline__ unsigned get_x() const { return fx; } \
    __device__ __forceinline__ unsigned get_y() const { return fy; } \
    __device__ __forceinline__ unsigned get_z() const { return fz; } \
  };                                                                 \
  static constexpr __device__ name##_t name{};
RTC_AMD_XYZ(threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
            __builtin_amdgcn_workitem_id_z())
RTC_AMD_XYZ(blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
            __builtin_amdgcn_workgroup_id_z())
RTC_AMD_XYZ(blockDim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
            __builtin_amdgcn_workgroup_size_z())
RTC_AMD_XYZ(gridDim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
            __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
            __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
#undef RTC_AMD_XYZ

__device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
#endif  // !__HIPCC_RTC__
#define RTC_DEVICE __device__ __forceinline__
#define RTC_HD __host__ __device__ __forceinline__
#define RTC_KERNEL(bounds) extern "C" __global__ void __launch_bounds__(bounds)
#define RTC_KERNEL_ONE_BLOCK(bounds) RTC_KERNEL(bounds)
#endif  // vendor

// A shared-memory array. On GPUs .ld/.st are plain accesses; the emulator's version checks them.
template <typename T, int N>
struct rtc_smem {
  T data[N];
  RTC_DEVICE T ld(int i) const { return data[i]; }
  RTC_DEVICE void st(int i, T v) { data[i] = v; }
  // Elements i and i + 1 as one access: i even and the array aligned to 2 sizeof(T) (the caller's promise).
  RTC_DEVICE void ld2(int i, T& a, T& b) const {
    struct alignas(2 * sizeof(T)) Pair {
      T x, y;
    } p;
    __builtin_memcpy(&p, __builtin_assume_aligned(&data[i], 2 * sizeof(T)), sizeof(p));
    a = p.x, b = p.y;
  }
  static constexpr int size = N;
};
#define RTC_SHARED(Type, name)    \
  __shared__ Type name##_storage; \
  Type& name = name##_storage
#define RTC_EXPORT_KERNEL(name, Params)

template <typename T>
RTC_DEVICE T rtc_gld(const T* p) {
  return *p;
}
template <typename T>
RTC_DEVICE void rtc_gst(T* p, T v) {
  *p = v;
}

#endif  // RTC_EMU
