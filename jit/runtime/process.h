// Runs a subprocess (no shell) and captures its combined stdout and stderr.
#pragma once
#include <string>
#include <vector>

namespace rtc {

struct ProcessResult {
  int exit_code = -1;      // -1 when it could not start; 128+N when killed by signal N
  bool timed_out = false;  // stopped after <PRODUCT>_COMPILE_TIMEOUT seconds
  std::string output;      // stdout and stderr, interleaved (+ a line naming the knob when stopped)
};

// argv[0] is looked up on PATH unless it contains '/'. log_path (a new file) receives the output.
// Every process run here is a compiler or a compiler's --version, so each is stopped (with its
// own children) after <PRODUCT>_COMPILE_TIMEOUT seconds. A SIGTERM that ends this process (its default
// action) or an exit while it runs stops it too: it never outlives its caller.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path);
// The first of names found as an executable (names with '/' are taken as paths); "" if none.
std::string find_executable(const std::vector<std::string>& names);
// Seconds a compile may take (<PRODUCT>_COMPILE_TIMEOUT), and the "<VAR>=N s" text messages show.
long compile_timeout_s();
std::string compile_timeout_text();

}  // namespace rtc
