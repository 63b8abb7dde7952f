// The knob table: name, type, default and meaning of every <PRODUCT>_* variable, with checked parsing.
#include "knobs.h"
#include "common.h"
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace rtc {

namespace {

std::vector<Knob>& registry() {
  static std::vector<Knob> table = {
      {"CACHE_DIR", KnobType::Path, "", "",
       "user code-object cache dir (default $XDG_CACHE_HOME/<product>, else ~/.cache/<product>)"},
      {"SYSTEM_CACHE", KnobType::PathList, "", "", "read-only cache dirs searched after the user dir, ':'-separated"},
      {"REBUILD", KnobType::Bool, "0", "", "ignore cached entries and compile again"},
      {"LOG", KnobType::Bool, "0", "", "log lookups, compiles and loads with timings"},
      {"NO_COMPILE", KnobType::Bool, "0", "", "make any compile an error (proves a warm cache)"},
      {"CLANG", KnobType::Path, "", "",
       "clang++ of the compiler named clang (gfx942, gfx90a; default: clang++-21..18, clang++ on PATH)"},
      {"CLANG22", KnobType::Path, "", "",
       "clang++ of the compiler named clang22 (gfx950; default: clang++-22 on PATH)"},
      {"HOST_CXX", KnobType::Path, "", "", "host C++ compiler for the emulator (default: g++, then c++)"},
      {"EMU_SANITIZE", KnobType::Bool, "0", "",
       "build emulated kernels with -fsanitize=address,undefined (the process must preload the sanitizer "
       "runtimes; see README, Sanitizers)"},
      {"EMULATE", KnobType::Enum, "", "|gfx942|gfx90a|gfx950", "run CPU tensors on the wave emulator of this arch"},
      {"LIBRARY_PATH", KnobType::PathList, "", "",
       "extra dirs searched for libnvrtc/libhiprtc/libamdhip64/libcuda, ':'-separated"},
      // A timeout has no "no limit" value: a hung compiler or lock holder must never block a caller forever,
      // and a week is far beyond any real compile or wait.
      {"COMPILE_TIMEOUT", KnobType::Int, "600", "1..604800",
       "seconds a compile may take: clang and g++ are killed after it, a hipRTC/NVRTC compile is abandoned"},
      {"LOCK_TIMEOUT", KnobType::Int, "900", "1..604800",
       "seconds to wait for another process compiling the same key before giving up with its pid"},
      {"KERNEL", KnobType::Name, "", "",
       "run only the kernel of this name from each op's manifest entry (no fallback; an error if it cannot serve)"},
      {"RECORD", KnobType::Path, "", "",
       "append one JSON line per distinct variant launched (op, arch, kernel, variant, call) to this file"},
  };
  return table;
}

}  // namespace

KnobRegistration::KnobRegistration(const Knob& k) { registry().push_back(k); }

const std::vector<Knob>& knob_table() { return registry(); }

std::string knob_env_name(const std::string& name) { return product_upper() + "_" + name; }

static const Knob& find_knob(const std::string& name) {
  for (const Knob& k : knob_table())
    if (name == k.name || name == knob_env_name(k.name)) return k;
  std::string names;
  for (const Knob& k : knob_table()) names += (names.empty() ? "" : ", ") + knob_env_name(k.name);
  RTC_FAIL(RTC_ERR_ARG, "unknown knob " + quote(name) + "; declared knobs: " + names);
}

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

static std::string parse_bool(const Knob& k, const std::string& raw) {
  std::string v = lower(raw);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return "1";
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return "0";
  RTC_FAIL(RTC_ERR_ARG, knob_env_name(k.name) + "=" + quote(raw) +
                            " is not a boolean; accepted: 1, 0, true, false, yes, no, on, off");
}

static std::string parse_enum(const Knob& k, const std::string& raw) {
  std::string v = lower(raw), choices = k.choices, shown;
  size_t start = 0;
  while (true) {
    size_t bar = choices.find('|', start);
    std::string c = choices.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    if (v == c) return c;
    shown += (shown.empty() ? "" : ", ") + (c.empty() ? std::string("'' (unset)") : c);
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  RTC_FAIL(RTC_ERR_ARG, knob_env_name(k.name) + "=" + quote(raw) + " is not accepted; accepted: " + shown);
}

// The accepted range of an Int knob, from its choices text "min..max".
static void int_range(const Knob& k, long* lo, long* hi) {
  const std::string c = k.choices;
  size_t dots = c.find("..");
  *lo = std::strtol(c.c_str(), nullptr, 10);
  *hi = dots == std::string::npos ? *lo : std::strtol(c.c_str() + dots + 2, nullptr, 10);
}

// Plain decimal digits only: strtol alone would take leading white space and a '+' but stop at trailing
// ones, and clamp an overflow to LONG_MAX; each of those is refused here instead.
static std::string parse_int(const Knob& k, const std::string& raw) {
  long lo = 0, hi = 0;
  int_range(k, &lo, &hi);
  const std::string accepted = "; accepted: an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  const size_t digits_from = raw[0] == '-' ? 1 : 0;
  RTC_CHECK(raw.size() > digits_from && raw.find_first_not_of("0123456789", digits_from) == std::string::npos,
            RTC_ERR_ARG, knob_env_name(k.name) + "=" + quote(raw) + " is not an integer" + accepted);
  errno = 0;
  long v = std::strtol(raw.c_str(), nullptr, 10);
  RTC_CHECK(errno != ERANGE && v >= lo && v <= hi, RTC_ERR_ARG,
            knob_env_name(k.name) + "=" + quote(raw) + " is out of range" + accepted);
  return std::to_string(v);
}

static std::string parse_name(const Knob& k, const std::string& raw) {
  bool ok = !raw.empty();
  for (char c : raw) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  RTC_CHECK(ok, RTC_ERR_ARG,
            knob_env_name(k.name) + "=" + quote(raw) + " is not a name; accepted: letters, digits and '_'");
  return raw;
}

std::string knob_text(const std::string& name) {
  const Knob& k = find_knob(name);
  const char* env = std::getenv(knob_env_name(k.name).c_str());
  if (!env) return "";
  std::string raw = env;
  switch (k.type) {
    case KnobType::Bool: return parse_bool(k, raw);
    case KnobType::Enum: return parse_enum(k, raw);
    case KnobType::Int: return raw.empty() ? raw : parse_int(k, raw);
    case KnobType::Name: return raw.empty() ? raw : parse_name(k, raw);
    case KnobType::Path:
    case KnobType::PathList:
      RTC_CHECK(raw.find('\n') == std::string::npos, RTC_ERR_ARG,
                knob_env_name(k.name) + "=" + quote(raw) + " contains a newline; accepted: a file-system path");
      return raw;
  }
  return raw;
}

bool knob_bool(const std::string& name) { return knob_text(name) == "1"; }

std::vector<std::string> knob_paths(const std::string& name) {
  std::vector<std::string> out;
  std::string v = knob_text(name);
  size_t start = 0;
  while (start <= v.size()) {
    size_t colon = v.find(':', start);
    std::string part = v.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!part.empty()) out.push_back(part);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

long knob_int(const std::string& name) {
  std::string v = knob_text(name);
  return std::strtol(v.empty() ? find_knob(name).default_text : v.c_str(), nullptr, 10);
}

}  // namespace rtc
