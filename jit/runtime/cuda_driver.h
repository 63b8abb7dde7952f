// The CUDA driver API entry points the runtime uses, dlopened once (libcuda.so.1) and shared.
#pragma once
#include "common.h"
#include "dynlib.h"
#include <string>

namespace rtc {

struct CudaDriver {
  DynLib lib;
  std::string why;  // set when unusable (no driver, cuInit failed)
  int init_rc = -1;
  int (*init)(unsigned) = nullptr;
  int (*device_count)(int*) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*device_attribute)(int*, int, int) = nullptr;
  int (*primary_retain)(void**, int) = nullptr;
  int (*ctx_push)(void*) = nullptr;
  int (*ctx_pop)(void**) = nullptr;
  int (*error_string)(int, const char**) = nullptr;
  int (*module_load_data)(void**, const void*) = nullptr;
  int (*module_get_function)(void**, void*, const char*) = nullptr;
  int (*func_set_attribute)(void*, int, int) = nullptr;
  int (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                void**) = nullptr;
  int (*memset_d32_async)(uint64_t, unsigned, size_t, void*) = nullptr;  // cuMemsetD32Async
  // cuTensorMapEncodeTiled (CUDA >= 12); null on an older driver.
  int (*encode_tiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const unsigned*, const unsigned*,
                      int, int, int, int) = nullptr;
};

const CudaDriver& cuda_driver();

// Throws RtcError(s) naming `what` and the driver's message when rc is not CUDA_SUCCESS.
void cuda_check(int rc, rtc_status s, const std::string& what);

// Fills n 32-bit words at a device address with value, in stream order, in the device's primary
// context (the one the launches use): for op host code that must reset scratch before a kernel.
void cuda_memset_d32(int device, void* ptr, unsigned value, size_t n, void* stream);

}  // namespace rtc
