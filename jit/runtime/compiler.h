// One interface for every kernel compiler (clang, hipRTC, NVRTC, host emulator) and the factory.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "cache_key.h"

namespace rtc {

struct CompileInput {
  std::string arch;           // gfx942, gfx90a, sm_90a, gfx942-emu, ...
  std::string kernel_symbol;
  SourceText main;
  std::vector<SourceText> headers;
  std::vector<std::string> options;  // -D defines and per-arch flags
};

struct CompileOutput {
  std::string binary;  // code object (hsaco / cubin / host shared object)
  std::string log;     // compiler log, kept even on success (NVRTC: ptxas -v resource usage)
};

class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual std::string name() const = 0;     // "clang", "clang22", "hiprtc", "nvrtc", "host"
  virtual std::string id() const = 0;       // short identity for file names: "clang19"
  virtual std::string version() const = 0;  // full identity text for the cache key
  // Whether this compiler can build for arch here; *why says why not.
  virtual bool available(const std::string& arch, std::string* why) const = 0;
  // Throws CompileFailure with the log when the source does not compile; RtcError otherwise.
  virtual CompileOutput compile(const CompileInput& in) const = 0;
};

// Thrown by compile() on a source error: the log travels with it so the caller can save the
// failing source and report key, arch, log and path together.
struct CompileFailure {
  std::string log;
};

// Backends; each returns an object even when its library/binary is missing (available() says so).
std::unique_ptr<Compiler> make_clang_compiler();    // <PRODUCT>_CLANG, else clang++-21..18 on PATH
std::unique_ptr<Compiler> make_clang22_compiler();  // <PRODUCT>_CLANG22, else clang++-22 on PATH (gfx950)
std::unique_ptr<Compiler> make_hiprtc_compiler();
std::unique_ptr<Compiler> make_nvrtc_compiler();
std::unique_ptr<Compiler> make_host_compiler();  // jit/compiler_host.cpp

// The compiler for arch: spec is "auto" (the default order for the arch: gfx950 clang22 then clang, other gfx*
// hiprtc, clang then clang22, sm_* nvrtc, *-emu host), one name, or a ','-separated order such as the manifest's
// "hiprtc,clang". Throws RTC_ERR_UNAVAILABLE listing each candidate and why it was skipped.
const Compiler& select_compiler(const std::string& spec, const std::string& arch);
// Every backend, for info.
std::vector<const Compiler*> all_compilers();

// Why bytes are not a code object for arch ("" when they are): a 64-bit little-endian ELF whose
// e_machine is the arch's (AMDGPU 224 for gfx*, CUDA 190 for sm_*, this host's for *-emu). Checked
// before anything is cached or loaded, so a compiler that exits 0 with garbage caches nothing.
std::string code_object_problem(const std::string& arch, const std::string& bytes);

}  // namespace rtc
