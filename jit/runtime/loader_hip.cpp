// HIP loader: code objects through a dlopened libamdhip64 (module API), no link-time ROCm.
#include "common.h"
#include "dynlib.h"
#include "loader.h"
#include <mutex>

namespace rtc {
namespace {

struct HipApi {
  DynLib lib;
  std::string why;
  int (*init)(unsigned) = nullptr;
  int (*device_count)(int*) = nullptr;
  int (*get_device)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*module_load_data)(void**, const void*) = nullptr;
  int (*module_get_function)(void**, void*, const char*) = nullptr;
  int (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                void**) = nullptr;
};

const HipApi& api() {
  static HipApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    if (!a.lib.open({"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"},
                    library_search_dirs(), &tried, false, "hipModuleLaunchKernel")) {
      a.why = "no HIP runtime; tried:\n" + tried;
      return;
    }
    try {
      a.lib.bind(a.init, "hipInit");
      a.lib.bind(a.device_count, "hipGetDeviceCount");
      a.lib.bind(a.get_device, "hipGetDevice");
      a.lib.bind(a.set_device, "hipSetDevice");
      a.lib.bind(a.error_string, "hipGetErrorString");
      a.lib.bind(a.module_load_data, "hipModuleLoadData");
      a.lib.bind(a.module_get_function, "hipModuleGetFunction");
      a.lib.bind(a.launch, "hipModuleLaunchKernel");
    } catch (const RtcError& e) {
      a.why = e.what();
    }
  });
  return a;
}

void check(int rc, rtc_status s, const std::string& what) {
  if (rc != 0) RTC_FAIL(s, what + " failed: " + api().error_string(rc) + " (hipError " + std::to_string(rc) + ")");
}

// Module calls act on the thread's current device; switch for the call and restore it, so the
// caller's (torch's) current device is left as it was.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(api().get_device(&old_), RTC_ERR_LOAD, "hipGetDevice");
    if (old_ != device) check(api().set_device(device), RTC_ERR_LOAD, "hipSetDevice(" + std::to_string(device) + ")");
  }
  ~DeviceGuard() { api().set_device(old_); }
 private:
  int old_ = 0;
};

class HipLoader : public Loader {
 public:
  std::string vendor() const override { return "hip"; }
  int device_count() override {
    const HipApi& a = api();
    int n = 0;
    if (!a.why.empty() || a.init(0) != 0 || a.device_count(&n) != 0) return 0;
    return n;
  }
  void* load(int device, const std::string& image) override {
    RTC_CHECK(api().why.empty(), RTC_ERR_UNAVAILABLE, api().why);
    RTC_CHECK(device >= 0 && device < device_count(), RTC_ERR_ARG,
              "device " + std::to_string(device) + " is out of range; HIP devices: " + std::to_string(device_count()));
    DeviceGuard g(device);
    void* mod = nullptr;
    check(api().module_load_data(&mod, image.data()), RTC_ERR_LOAD, "hipModuleLoadData");
    return mod;
  }
  void* function(int device, void* module, const std::string& symbol) override {
    DeviceGuard g(device);
    void* fn = nullptr;
    check(api().module_get_function(&fn, module, symbol.c_str()), RTC_ERR_LOAD,
          "hipModuleGetFunction(" + quote(symbol) + ")");
    return fn;
  }
  void launch(int device, void* fn, const LaunchDims& d, void* stream, const void* params, size_t size) override {
    DeviceGuard g(device);
    // The parameter block goes in as the raw kernarg buffer (HIP_LAUNCH_PARAM_BUFFER_*).
    void* extra[] = {reinterpret_cast<void*>(1), const_cast<void*>(params), reinterpret_cast<void*>(2), &size,
                     reinterpret_cast<void*>(3)};
    check(api().launch(fn, d.grid[0], d.grid[1], d.grid[2], d.block[0], d.block[1], d.block[2], d.shared_bytes, stream,
                       nullptr, extra),
          RTC_ERR_LAUNCH, "hipModuleLaunchKernel");
  }
};

}  // namespace

std::unique_ptr<Loader> make_hip_loader() { return std::make_unique<HipLoader>(); }

}  // namespace rtc
