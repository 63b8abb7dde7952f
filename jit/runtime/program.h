// Programs: built code objects held for the life of the process, found through the cache chain.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include "cache_key.h"
#include "compiler.h"
#include "loader.h"
#include "rtc_abi.h"

namespace rtc {

// A program's code object and where it came from.
struct Code {
  std::string binary, path;  // path: the cache file ("" when held in memory only)
  std::string log;  // compiler log (NVRTC: ptxas -v register/spill report); from <entry>.log on a cache hit
  int origin = RTC_FROM_COMPILE;  // rtc_origin: compile, user cache or system cache
};

struct Program {
  CacheKey key;
  std::string kernel_symbol;
  // Replaced once when a cached entry fails to load (program_function), so read it through
  // program_code(). Replaced code is kept for the life of the process: bytes handed out stay valid.
  std::shared_ptr<const Code> code;
  // What that rebuild needs; fixed once the program is stored.
  CompileInput input;
  const Compiler* compiler = nullptr;
  std::string cache_dir;
  bool rebuilt = false;
};

// Lookup order: in-process map -> user dir -> system dirs -> compile (honours the env knobs).
void build_program(const rtc_build_request& req, const char* cache_dir, rtc_build_result* out);
const Program& get_program(uint64_t handle);  // throws RTC_ERR_ARG for an unknown handle
std::shared_ptr<const Code> program_code(uint64_t handle);  // the current code; throws like get_program
// The kernel function of a program on (vendor, device), loading the module on first use.
void* program_function(uint64_t handle, Loader& loader, int device);
// rtc_launch without the C wrapper: throws RtcError.
void launch_program(uint64_t handle, const rtc_launch_config* cfg, const void* params, size_t size);

}  // namespace rtc
