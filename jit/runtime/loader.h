// One interface for every code-object loader (HIP, CUDA driver, host emulator) and the factory.
#pragma once
#include <memory>
#include <string>
#include "rtc_abi.h"

namespace rtc {

struct LaunchDims {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
  const rtc_mem_range* ranges;  // the launch's tensors (the emulator checks accesses against them)
  int n_ranges;
};

class Loader {
 public:
  virtual ~Loader() = default;
  virtual std::string vendor() const = 0;  // "hip", "cuda", "host"
  // Devices usable now; 0 (never an error) when the driver library or the device is absent.
  virtual int device_count() = 0;
  // Loads a code object on a device; returns an opaque module handle. Throws RTC_ERR_LOAD.
  virtual void* load(int device, const std::string& image) = 0;
  virtual void* function(int device, void* module, const std::string& symbol) = 0;
  // Launches fn with one by-value parameter block on stream (null = default stream).
  virtual void launch(int device, void* fn, const LaunchDims& dims, void* stream, const void* params,
                      size_t params_size) = 0;
};

std::unique_ptr<Loader> make_hip_loader();
std::unique_ptr<Loader> make_cuda_loader();
std::unique_ptr<Loader> make_host_loader();  // jit/loader_host.cpp

// The process-wide loader of a vendor; throws RTC_ERR_ARG for an unknown vendor.
Loader& get_loader(const std::string& vendor);

}  // namespace rtc
