// Implementation of the shared plumbing declared in common.h.
#include "common.h"
#include "knobs.h"
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>

#ifndef RTC_PRODUCT
#error "build the runtime with -DRTC_PRODUCT=\"<package name>\" and -DRTC_VERSION=\"<version>\" (setup.py does)"
#endif

namespace rtc {

const std::string& product() {
  static const std::string name = RTC_PRODUCT;
  return name;
}

const std::string& product_upper() {
  static const std::string upper = [] {
    std::string s = RTC_PRODUCT;
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }();
  return upper;
}

const char* version() { return RTC_VERSION; }

void fail(rtc_status s, const std::string& msg, const char* file, int line) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  throw RtcError(s, msg + " [" + base + ":" + std::to_string(line) + "]");
}

bool log_enabled() { return knob_bool("LOG"); }

void log_line(const std::string& msg) {
  if (log_enabled()) std::fprintf(stderr, "[%s] %s\n", product().c_str(), msg.c_str());
}

void warn(const std::string& msg) { std::fprintf(stderr, "[%s] warning: %s\n", product().c_str(), msg.c_str()); }

void warn_once(const std::string& key, const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(key).second) warn(msg);
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::string fmt_ms(double ms) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

std::string to_hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  const unsigned char* p = static_cast<const unsigned char*>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

}  // namespace rtc
