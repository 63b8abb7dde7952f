// CUDA loader: CUBINs through the dlopened driver API (libcuda.so.1), beside torch's primary context.
#include "common.h"
#include "cuda_driver.h"
#include "dynlib.h"
#include "loader.h"
#include <map>
#include <mutex>

namespace rtc {

const CudaDriver& cuda_driver() {
  static CudaDriver a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    if (!a.lib.open({"libcuda.so.1", "libcuda.so"}, library_search_dirs(), &tried, false, "cuLaunchKernel")) {
      a.why = "no CUDA driver; tried:\n" + tried;
      return;
    }
    try {
      a.lib.bind(a.init, "cuInit");
      a.lib.bind(a.device_count, "cuDeviceGetCount");
      a.lib.bind(a.device_get, "cuDeviceGet");
      a.lib.bind(a.device_attribute, "cuDeviceGetAttribute");
      a.lib.bind(a.primary_retain, "cuDevicePrimaryCtxRetain");
      a.lib.bind(a.ctx_push, "cuCtxPushCurrent_v2");
      a.lib.bind(a.ctx_pop, "cuCtxPopCurrent_v2");
      a.lib.bind(a.error_string, "cuGetErrorString");
      a.lib.bind(a.module_load_data, "cuModuleLoadData");
      a.lib.bind(a.module_get_function, "cuModuleGetFunction");
      a.lib.bind(a.func_set_attribute, "cuFuncSetAttribute");
      a.lib.bind(a.launch, "cuLaunchKernel");
      a.lib.bind(a.memset_d32_async, "cuMemsetD32Async");
      a.encode_tiled = reinterpret_cast<decltype(a.encode_tiled)>(a.lib.symbol("cuTensorMapEncodeTiled"));
      a.init_rc = a.init(0);
      if (a.init_rc != 0) a.why = "cuInit failed (CUresult " + std::to_string(a.init_rc) + ")";
    } catch (const RtcError& e) {
      a.why = e.what();
    }
  });
  return a;
}

void cuda_check(int rc, rtc_status s, const std::string& what) {
  if (rc == 0) return;
  const char* text = "unknown error";
  if (cuda_driver().error_string) cuda_driver().error_string(rc, &text);
  RTC_FAIL(s, what + " failed: " + text + " (CUresult " + std::to_string(rc) + ")");
}

namespace {

const CudaDriver& api() { return cuda_driver(); }

void check(int rc, rtc_status s, const std::string& what) { cuda_check(rc, s, what); }

// Retained once per device and never released: modules loaded in it live as long as the process.
void* primary_context(int device) {
  static std::mutex mu;
  static std::map<int, void*> contexts;
  std::lock_guard<std::mutex> lock(mu);
  auto it = contexts.find(device);
  if (it != contexts.end()) return it->second;
  int dev = 0;
  check(api().device_get(&dev, device), RTC_ERR_LOAD, "cuDeviceGet(" + std::to_string(device) + ")");
  void* ctx = nullptr;
  check(api().primary_retain(&ctx, dev), RTC_ERR_LOAD, "cuDevicePrimaryCtxRetain");
  return contexts[device] = ctx;
}

// Work happens in the device's primary context, the one torch uses, pushed for the call and
// popped after, so the caller's current context is untouched.
class ContextGuard {
 public:
  explicit ContextGuard(int device) {
    check(api().ctx_push(primary_context(device)), RTC_ERR_LOAD, "cuCtxPushCurrent");
  }
  ~ContextGuard() {
    void* ctx = nullptr;
    api().ctx_pop(&ctx);
  }
};

// Above 48 KiB a kernel must opt in to its dynamic shared memory before the launch: once per
// function and size, recorded only when the driver accepted it.
void ensure_shared_limit(void* fn, unsigned bytes) {
  const int kMaxDynamicShared = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  static std::mutex mu;
  static std::map<void*, unsigned> raised;
  std::lock_guard<std::mutex> lock(mu);
  unsigned& have = raised[fn];
  if (bytes <= 48 * 1024 || have >= bytes) return;
  check(api().func_set_attribute(fn, kMaxDynamicShared, int(bytes)), RTC_ERR_LAUNCH,
        "cuFuncSetAttribute(max dynamic shared = " + std::to_string(bytes) + ")");
  have = bytes;
}

}  // namespace

void cuda_memset_d32(int device, void* ptr, unsigned value, size_t n, void* stream) {
  ContextGuard g(device);
  check(api().memset_d32_async(reinterpret_cast<uint64_t>(ptr), value, n, stream), RTC_ERR_LAUNCH,
        "cuMemsetD32Async(" + std::to_string(n) + " words)");
}

namespace {

class CudaLoader : public Loader {
 public:
  std::string vendor() const override { return "cuda"; }
  int device_count() override {
    int n = 0;
    if (!api().why.empty() || api().device_count(&n) != 0) return 0;
    return n;
  }
  void* load(int device, const std::string& image) override {
    RTC_CHECK(api().why.empty(), RTC_ERR_UNAVAILABLE, api().why);
    RTC_CHECK(device >= 0 && device < device_count(), RTC_ERR_ARG,
              "device " + std::to_string(device) + " is out of range; CUDA devices: " + std::to_string(device_count()));
    ContextGuard g(device);
    void* mod = nullptr;
    check(api().module_load_data(&mod, image.data()), RTC_ERR_LOAD, "cuModuleLoadData");
    return mod;
  }
  void* function(int device, void* module, const std::string& symbol) override {
    ContextGuard g(device);
    void* fn = nullptr;
    check(api().module_get_function(&fn, module, symbol.c_str()), RTC_ERR_LOAD,
          "cuModuleGetFunction(" + quote(symbol) + ")");
    return fn;
  }
  void launch(int device, void* fn, const LaunchDims& d, void* stream, const void* params, size_t size) override {
    ContextGuard g(device);
    ensure_shared_limit(fn, d.shared_bytes);
    // Every kernel takes one by-value struct parameter: kernelParams holds its address, and the
    // driver copies it with the size and alignment the cubin declares. (The raw-buffer form,
    // CU_LAUNCH_PARAM_BUFFER_*, garbled the 64-byte aligned CUtensorMap block of the sm90 kernel.)
    (void)size;
    void* args[] = {const_cast<void*>(params)};
    check(api().launch(fn, d.grid[0], d.grid[1], d.grid[2], d.block[0], d.block[1], d.block[2], d.shared_bytes, stream,
                       args, nullptr),
          RTC_ERR_LAUNCH, "cuLaunchKernel");
  }
};

}  // namespace

std::unique_ptr<Loader> make_cuda_loader() { return std::make_unique<CudaLoader>(); }

}  // namespace rtc
