// hipRTC backend: in-process compile through libhiprtc.so (ROCm >= 6) or libamdhip64.so (ROCm 5).
#include "common.h"
#include "compiler.h"
#include "dynlib.h"
#include "rtc_program.h"
#include <cstdio>
#include <mutex>

namespace rtc {
namespace {

typedef void* hiprtcProgram;
struct HiprtcApi {
  DynLib lib;
  std::string why;  // set when unusable
  int major = 0, minor = 0;
  const char* (*error_string)(int) = nullptr;
  int (*create)(hiprtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile)(hiprtcProgram, int, const char* const*) = nullptr;
  int (*log_size)(hiprtcProgram, size_t*) = nullptr;
  int (*log)(hiprtcProgram, char*) = nullptr;
  int (*code_size)(hiprtcProgram, size_t*) = nullptr;
  int (*code)(hiprtcProgram, char*) = nullptr;
  int (*destroy)(hiprtcProgram*) = nullptr;
};

// hiprtcVersion is no use here (ROCm 5.2 answers 9.0), so the ROCm version comes from
// hipRuntimeGetVersion (in libamdhip64: major*10^7 + minor*10^5 + patch) or else from the
// versioned file name of the library (libhiprtc.so.6.2.x). Unknown stays 0.0, which counts as
// "< 6" below, the safe side.
void detect_version(HiprtcApi* a) {
  int (*runtime_version)(int*) = nullptr;
  runtime_version = reinterpret_cast<int (*)(int*)>(a->lib.symbol("hipRuntimeGetVersion"));
  int v = 0;
  if (runtime_version && runtime_version(&v) == 0 && v > 0) {
    a->major = v / 10000000;
    a->minor = (v / 100000) % 100;
    return;
  }
  std::string real = a->lib.real_path();
  size_t so = real.rfind(".so.");
  if (so != std::string::npos && sscanf(real.c_str() + so + 4, "%d.%d", &a->major, &a->minor) < 1) a->major = 0;
}

const HiprtcApi& api() {
  static HiprtcApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    if (!a.lib.open({"libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5", "libamdhip64.so.5",
                     "libamdhip64.so"},
                    library_search_dirs(), &tried, false, "hiprtcCreateProgram")) {
      a.why = "no hipRTC library; tried:\n" + tried;
      return;
    }
    try {
      a.lib.bind(a.error_string, "hiprtcGetErrorString");
      a.lib.bind(a.create, "hiprtcCreateProgram");
      a.lib.bind(a.compile, "hiprtcCompileProgram");
      a.lib.bind(a.log_size, "hiprtcGetProgramLogSize");
      a.lib.bind(a.log, "hiprtcGetProgramLog");
      a.lib.bind(a.code_size, "hiprtcGetCodeSize");
      a.lib.bind(a.code, "hiprtcGetCode");
      a.lib.bind(a.destroy, "hiprtcDestroyProgram");
      detect_version(&a);
    } catch (const RtcError& e) {
      a.why = e.what();
    }
  });
  return a;
}

bool rocm5_knows(const std::string& arch) {
  static const char* known[] = {"gfx900",  "gfx902",  "gfx904",  "gfx906",  "gfx908",  "gfx909",
                                "gfx90a",  "gfx90c",  "gfx1010", "gfx1011", "gfx1012", "gfx1030",
                                "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035"};
  for (const char* k : known)
    if (arch == k) return true;
  return false;
}

class HiprtcCompiler : public Compiler {
 public:
  std::string name() const override { return "hiprtc"; }
  std::string id() const override { return "hiprtc" + std::to_string(api().major) + "." + std::to_string(api().minor); }
  std::string version() const override { return api().lib.real_path() + " " + id(); }
  bool available(const std::string& arch, std::string* why) const override {
    const HiprtcApi& a = api();
    if (!a.why.empty()) return *why = a.why, false;
    if (arch.compare(0, 3, "gfx") != 0 || arch.find("-emu") != std::string::npos)
      return *why = "hipRTC builds AMD archs (gfx*) only, not " + quote(arch), false;
    // hipRTC < 6 (comgr of ROCm 5) aborts the process (SIGABRT inside comgr) for an arch missing
    // from its ISA table - gfx940-942 among them - instead of returning an error, so it is only
    // ever asked for the archs that table is known to hold.
    if (a.major < 6 && !rocm5_knows(arch.substr(0, arch.find(':'))))
      return *why =
                 id() + " cannot target " + arch + " (ROCm 5 knows gfx9xx up to gfx90c and gfx10xx; needs ROCm >= 6)",
             false;
    return true;
  }
  CompileOutput compile(const CompileInput& in) const override;
};

CompileOutput HiprtcCompiler::compile(const CompileInput& in) const {
  const HiprtcApi& a = api();
  // comgr under hipRTC 5.2 crashes (SIGSEGV) when two threads compile at once, so compiles are
  // serialized per process; parallel warm-ups get their speed-up from processes or from clang.
  // The lock is taken on the worker: a compile abandoned after a timeout still holds it until it ends.
  static std::mutex compile_mu;
  return compile_on_worker(
      [&a, in] {
        std::lock_guard<std::mutex> lock(compile_mu);
        return compile_in_memory(a, in, {"--offload-arch=" + in.arch, "-O3"}, a.code_size, a.code, "hiprtc");
      },
      id());
}

}  // namespace

std::unique_ptr<Compiler> make_hiprtc_compiler() { return std::make_unique<HiprtcCompiler>(); }

}  // namespace rtc
