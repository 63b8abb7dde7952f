// Programs: built code objects held for the life of the process, found through the cache chain.
#pragma once
#include <cstdint>
#include <string>
#include "cache_key.h"
#include "compiler.h"
#include "loader.h"
#include "rtc_abi.h"

namespace rtc {

struct Program {
  CacheKey key;
  std::string binary, path, kernel_symbol;
  std::string log;  // compiler log (NVRTC: ptxas -v register/spill report); from <entry>.log on a cache hit
};

// Lookup order: in-process map -> user dir -> system dirs -> compile (honours the env knobs).
void build_program(const rtc_build_request& req, const char* cache_dir, rtc_build_result* out);
const Program& get_program(uint64_t handle);  // throws RTC_ERR_ARG for an unknown handle
// The kernel function of a program on (vendor, device), loading the module on first use.
void* program_function(uint64_t handle, Loader& loader, int device);
// rtc_launch without the C wrapper: throws RtcError.
void launch_program(uint64_t handle, const rtc_launch_config* cfg, const void* params, size_t size);

}  // namespace rtc
