// NVRTC backend: in-process compile to a CUBIN for sm_XX through a dlopened libnvrtc.
#include "common.h"
#include "compiler.h"
#include "dynlib.h"
#include "rtc_program.h"
#include <mutex>

namespace rtc {
namespace {

typedef void* nvrtcProgram;
struct NvrtcApi {
  DynLib lib;
  std::string why;
  int major = 0, minor = 0;
  int (*version)(int*, int*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*create)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile)(nvrtcProgram, int, const char* const*) = nullptr;
  int (*log_size)(nvrtcProgram, size_t*) = nullptr;
  int (*log)(nvrtcProgram, char*) = nullptr;
  int (*cubin_size)(nvrtcProgram, size_t*) = nullptr;
  int (*cubin)(nvrtcProgram, char*) = nullptr;
  int (*destroy)(nvrtcProgram*) = nullptr;
};

// libnvrtc dlopens libnvrtc-builtins.so.<major>.<minor> by bare name at compile time. From a pip
// wheel dir that name is not on the loader path, so load it from libnvrtc's own dir first: a later
// dlopen of the same soname then finds the already loaded copy.
void preload_builtins(const NvrtcApi& a) {
  std::string real = a.lib.real_path();
  size_t slash = real.rfind('/');
  if (slash == std::string::npos) return;
  std::string name = "libnvrtc-builtins.so." + std::to_string(a.major) + "." + std::to_string(a.minor);
  DynLib builtins;  // never closed: libnvrtc needs it for the life of the process
  builtins.open({real.substr(0, slash) + "/" + name}, {}, nullptr, true);
}

const NvrtcApi& api() {
  static NvrtcApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    if (!a.lib.open({"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}, library_search_dirs(), &tried, false,
                    "nvrtcCreateProgram")) {
      a.why = "no NVRTC library; tried:\n" + tried;
      return;
    }
    try {
      a.lib.bind(a.version, "nvrtcVersion");
      a.lib.bind(a.error_string, "nvrtcGetErrorString");
      a.lib.bind(a.create, "nvrtcCreateProgram");
      a.lib.bind(a.compile, "nvrtcCompileProgram");
      a.lib.bind(a.log_size, "nvrtcGetProgramLogSize");
      a.lib.bind(a.log, "nvrtcGetProgramLog");
      a.lib.bind(a.cubin_size, "nvrtcGetCUBINSize");
      a.lib.bind(a.cubin, "nvrtcGetCUBIN");
      a.lib.bind(a.destroy, "nvrtcDestroyProgram");
      a.version(&a.major, &a.minor);
      preload_builtins(a);
    } catch (const RtcError& e) {
      a.why = e.what();
    }
  });
  return a;
}

class NvrtcCompiler : public Compiler {
 public:
  std::string name() const override { return "nvrtc"; }
  std::string id() const override { return "nvrtc" + std::to_string(api().major) + "." + std::to_string(api().minor); }
  std::string version() const override { return api().lib.real_path() + " " + id(); }
  bool available(const std::string& arch, std::string* why) const override {
    if (!api().why.empty()) return *why = api().why, false;
    if (arch.compare(0, 3, "sm_") != 0)
      return *why = "NVRTC builds NVIDIA archs (sm_*) only, not " + quote(arch), false;
    return true;
  }
  CompileOutput compile(const CompileInput& in) const override;
};

CompileOutput NvrtcCompiler::compile(const CompileInput& in) const {
  const NvrtcApi& a = api();
  // A real sm_XX target makes NVRTC run ptxas and emit a CUBIN; -v keeps the register, spill
  // and shared-memory report in the log so tests can check it.
  return compile_on_worker(
      [&a, in] {
        return compile_in_memory(a, in, {"--gpu-architecture=" + in.arch, "--ptxas-options=-v"}, a.cubin_size, a.cubin,
                                 "nvrtc");
      },
      id());
}

}  // namespace

std::unique_ptr<Compiler> make_nvrtc_compiler() { return std::make_unique<NvrtcCompiler>(); }

}  // namespace rtc
