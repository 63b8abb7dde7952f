// Runs a subprocess (no shell) and captures its combined stdout and stderr.
#pragma once
#include <string>
#include <vector>

namespace rtc {

struct ProcessResult {
  int exit_code = -1;   // -1 when it could not start; 128+N when killed by signal N
  std::string output;   // stdout and stderr, interleaved
};

// argv[0] is looked up on PATH unless it contains '/'. log_path receives the output.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path);
// The first of names found as an executable (names with '/' are taken as paths); "" if none.
std::string find_executable(const std::vector<std::string>& names);

}  // namespace rtc
