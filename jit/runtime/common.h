// Shared runtime plumbing: the RtcError exception, check helpers with file:line, logging and warn-once.
#pragma once
#include <string>
#include <stdexcept>
#include "rtc_abi.h"

namespace rtc {

// Every failure inside the runtime is an RtcError; the C ABI turns it into (status, message).
class RtcError : public std::runtime_error {
 public:
  RtcError(rtc_status s, const std::string& msg) : std::runtime_error(msg), status_(s) {}
  rtc_status status() const { return status_; }
 private:
  rtc_status status_;
};

[[noreturn]] void fail(rtc_status s, const std::string& msg, const char* file, int line);

// RTC_CHECK(cond, status, message-expression): throws with the source location appended, so a
// user report points at the failing check without a debugger.
#define RTC_CHECK(cond, status, msg)                               \
  do {                                                             \
    if (!(cond)) ::rtc::fail((status), (msg), __FILE__, __LINE__); \
  } while (0)
#define RTC_FAIL(status, msg) ::rtc::fail((status), (msg), __FILE__, __LINE__)

// The product's name and version come from the build (-DRTC_PRODUCT, -DRTC_VERSION, set by
// setup.py from the package), so the runtime names neither a product nor an op.
const std::string& product();        // the package name: temp dirs, cache dir, log prefix
const std::string& product_upper();  // upper case: environment prefix, cache entry magic
const char* version();

// <PRODUCT>_LOG=1: one line per event on stderr.
bool log_enabled();
void log_line(const std::string& msg);
// Warnings go to stderr; warn_once prints a given key's warning only the first time.
void warn(const std::string& msg);
void warn_once(const std::string& key, const std::string& msg);

double now_ms();
std::string fmt_ms(double ms);  // "12.3 ms"
std::string quote(const std::string& s);  // 'text' for messages
std::string to_hex(const void* data, size_t n);

}  // namespace rtc
