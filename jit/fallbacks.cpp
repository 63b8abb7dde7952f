// Weak stand-ins for parts built in other files (host emulator, sm90 launch), so the library links
// and reports "unavailable" when those files are absent; a real definition replaces them at link.
#include "common.h"
#include "compiler.h"
#include "launch_sm90.h"
#include "loader.h"

namespace rtc {
namespace {

class MissingHostCompiler : public Compiler {
 public:
  std::string name() const override { return "host"; }
  std::string id() const override { return "host-missing"; }
  std::string version() const override { return "host emulator not built"; }
  bool available(const std::string&, std::string* why) const override {
    *why = "host emulator not built (jit/compiler_host.cpp absent)";
    return false;
  }
  CompileOutput compile(const CompileInput&) const override {
    RTC_FAIL(RTC_ERR_UNAVAILABLE, "host emulator not built (jit/compiler_host.cpp absent)");
  }
};

class MissingHostLoader : public Loader {
 public:
  std::string vendor() const override { return "host"; }
  int device_count() override { return 0; }
  void* load(int, const std::string&) override { return unavailable(); }
  void* function(int, void*, const std::string&) override { return unavailable(); }
  void launch(int, void*, const LaunchDims&, void*, const void*, size_t) override { unavailable(); }
 private:
  [[noreturn]] static void* unavailable() {
    RTC_FAIL(RTC_ERR_UNAVAILABLE, "host emulator not built (jit/loader_host.cpp absent)");
  }
};

}  // namespace

__attribute__((weak)) std::unique_ptr<Compiler> make_host_compiler() {
  return std::make_unique<MissingHostCompiler>();
}
__attribute__((weak)) std::unique_ptr<Loader> make_host_loader() {
  return std::make_unique<MissingHostLoader>();
}
__attribute__((weak)) int launch_sm90(uint64_t, AttnParams*, const rtc_attention_args*, const char*, int,
                                      void*) {
  RTC_FAIL(RTC_ERR_UNAVAILABLE, "kernel kind 'sm90' is not built (jit/launch_sm90.cpp absent)");
}
__attribute__((weak)) int64_t workspace_bytes_sm90(const rtc_attention_args*) { return 0; }

}  // namespace rtc
