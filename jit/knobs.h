// Every environment variable of rtcattn, declared once in one typed table (knobs.cpp).
#pragma once
#include <string>
#include <vector>

namespace rtc {

enum class KnobType { Bool, Path, PathList, Enum, Int };

struct Knob {
  const char* name;
  KnobType type;
  const char* default_text;   // shown in info; the value used when unset
  const char* choices;        // Enum: '|'-separated accepted values ("" allowed when listed)
  const char* help;
};

const std::vector<Knob>& knob_table();
// Normalized value as text ("" when unset). Throws RTC_ERR_ARG naming the variable, the value
// received and what is accepted when the value is malformed or the name is not declared.
std::string knob_text(const std::string& name);
bool knob_bool(const std::string& name);                    // unset -> false (or default)
std::vector<std::string> knob_paths(const std::string& name);  // ':'-separated, empties dropped
long knob_int(const std::string& name, long fallback);

}  // namespace rtc
