// The host loader: dlopens an emulated kernel's shared object and runs its grid on the CPU.
#include "common.h"
#include "fsutil.h"
#include "emu/launch_abi.h"
#include "loader.h"
#include <dlfcn.h>
#include <unistd.h>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rtc {
namespace host_emu {

// One dlopen'ed kernel object. The bytes go to a private temp file that is unlinked right after
// dlopen, so nothing is left behind and no other user can swap the file between write and load.
class HostModule {
 public:
  explicit HostModule(const std::string& bytes) {
    dir_ = make_temp_dir("emu-");
    RTC_CHECK(!dir_.empty(), RTC_ERR_LOAD, "cannot create a temp dir for the emulated kernel");
    const std::string path = dir_ + "/kernel.so";
    std::string err;
    bool ok = write_file(path, bytes, &err);
    if (ok) handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* dl = handle_ ? nullptr : dlerror();
    remove_tree(dir_);
    RTC_CHECK(ok, RTC_ERR_LOAD, "cannot write the emulated kernel object: " + err);
    RTC_CHECK(handle_ != nullptr, RTC_ERR_LOAD,
              std::string("dlopen of the emulated kernel object failed: ") + (dl ? dl : "?"));
  }
  ~HostModule() {
    if (handle_) dlclose(handle_);
  }
  HostModule(const HostModule&) = delete;
  HostModule& operator=(const HostModule&) = delete;

  rtc_emu_entry_fn entry(const std::string& symbol) const {
    const std::string name = "rtc_emu_launch_" + symbol;
    void* f = dlsym(handle_, name.c_str());
    RTC_CHECK(f != nullptr, RTC_ERR_LOAD,
              "the emulated kernel object has no entry " + quote(name) + " (is RTC_EXPORT_KERNEL(" + symbol +
                  ", ...) after the kernel?)");
    return reinterpret_cast<rtc_emu_entry_fn>(f);
  }

 private:
  std::string dir_;
  void* handle_ = nullptr;
};

struct Function {
  rtc_emu_entry_fn entry;
  std::string symbol;
};

// Fiber stacks kept between launches (launch_abi.h): the regions the kernels give back, at most kKeptStacks of them
// in the process (each a workgroup's stacks: the pages its fibers touched stay committed), handed out again to a
// launch asking for the same layout. Never read or written here; released when the process ends.
struct KeptStacks {
  struct Region {
    void* base;
    unsigned long long count, stack_bytes, guard_bytes;
  };
  static constexpr size_t kKeptStacks = 8;
  std::mutex mu;
  std::vector<Region> regions;
};
KeptStacks& kept_stacks() {
  static KeptStacks* k = new KeptStacks();  // never destroyed: kernels of other threads may give back at exit
  return *k;
}
void* take_stacks(unsigned long long count, unsigned long long stack_bytes, unsigned long long guard_bytes) {
  KeptStacks& k = kept_stacks();
  std::lock_guard<std::mutex> lock(k.mu);
  for (size_t i = 0; i < k.regions.size(); ++i) {
    const KeptStacks::Region r = k.regions[i];
    if (r.count == count && r.stack_bytes == stack_bytes && r.guard_bytes == guard_bytes) {
      k.regions.erase(k.regions.begin() + long(i));
      return r.base;
    }
  }
  return nullptr;
}
int give_stacks(void* base, unsigned long long count, unsigned long long stack_bytes, unsigned long long guard_bytes) {
  KeptStacks& k = kept_stacks();
  std::lock_guard<std::mutex> lock(k.mu);
  if (k.regions.size() >= KeptStacks::kKeptStacks) return 0;
  k.regions.push_back(KeptStacks::Region{base, count, stack_bytes, guard_bytes});
  return 1;
}

// Runs the whole grid before returning: the host "stream" is synchronous.
void run(const Function& fn, const LaunchDims& dims, const void* params, size_t params_size) {
  rtc_emu_launch l{};
  l.abi_version = RTC_EMU_ABI_VERSION;
  l.take_stacks = &take_stacks;
  l.give_stacks = &give_stacks;
  for (int i = 0; i < 3; ++i) {
    l.grid[i] = dims.grid[i];
    l.block[i] = dims.block[i];
  }
  l.shared_bytes = dims.shared_bytes;
  std::vector<rtc_emu_range> ranges;  // launch_abi.h is compiled into every kernel: it has its own type
  for (int i = 0; i < dims.n_ranges; ++i) ranges.push_back(rtc_emu_range{dims.ranges[i].base, dims.ranges[i].bytes});
  l.ranges = ranges.data();
  l.n_ranges = int(ranges.size());
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  l.host_threads = cores > 0 ? (int)cores : 1;
  char err[2048] = {0};
  const double t0 = now_ms();
  int rc = fn.entry(&l, params, params_size, err, sizeof(err));
  RTC_CHECK(rc == 0, RTC_ERR_LAUNCH, std::string("emulated ") + err);
  if (log_enabled()) {
    const double ms = now_ms() - t0;
    log_line("host launch " + fn.symbol + ": " + std::to_string(ms) + " ms, " + std::to_string(l.stats[3]) +
             " workgroups, " + std::to_string(l.stats[1]) + " barriers, " + std::to_string(l.stats[2]) +
             " wave collectives, " + std::to_string(l.stats[0]) + " fiber switches");
  }
}

class HostLoader : public Loader {
 public:
  std::string vendor() const override { return "host"; }
  int device_count() override { return 1; }

  void* load(int device, const std::string& image) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    modules_.emplace_back(new HostModule(image));
    return modules_.back().get();
  }

  void* function(int device, void* module, const std::string& symbol) override {
    check_device(device);
    RTC_CHECK(module != nullptr, RTC_ERR_LOAD, "host loader: null module for " + quote(symbol));
    rtc_emu_entry_fn e = static_cast<HostModule*>(module)->entry(symbol);
    std::lock_guard<std::mutex> lock(mu_);
    functions_.push_back(Function{e, symbol});
    return &functions_.back();
  }

  void launch(int device, void* fn, const LaunchDims& dims, void* stream, const void* params,
              size_t params_size) override {
    (void)stream;
    check_device(device);
    RTC_CHECK(fn != nullptr, RTC_ERR_LAUNCH, "host loader: null function");
    run(*static_cast<const Function*>(fn), dims, params, params_size);
  }

 private:
  static void check_device(int device) {
    RTC_CHECK(device == 0, RTC_ERR_ARG, "device " + std::to_string(device) + " is not a host device; accepted: 0");
  }
  std::mutex mu_;
  std::deque<std::unique_ptr<HostModule>> modules_;  // live for the process, like GPU modules
  std::deque<Function> functions_;                   // deque: handles stay valid as it grows
};

}  // namespace host_emu

std::unique_ptr<Loader> make_host_loader() { return std::unique_ptr<Loader>(new host_emu::HostLoader()); }

}  // namespace rtc
