// Every environment variable, declared once and typed: the runtime's own in knobs.cpp, an op's with a
// KnobRegistration in that op's host code. Names are written without the product prefix ("LOG" is
// <PRODUCT>_LOG); messages always show the full variable name.
#pragma once
#include <string>
#include <vector>

namespace rtc {

enum class KnobType { Bool, Path, PathList, Enum, Int, Name };

struct Knob {
  const char* name;           // without the prefix: "CACHE_DIR"
  KnobType type;
  const char* default_text;   // shown in info; the value used when unset
  const char* choices;        // Enum: '|'-separated accepted values ("" allowed when listed); Int: "min..max"
  const char* help;
};

// Declares a knob from outside knobs.cpp (an op's own setting); a static object of this type in the
// op's host code does it before main().
struct KnobRegistration {
  explicit KnobRegistration(const Knob& k);
};

const std::vector<Knob>& knob_table();
std::string knob_env_name(const std::string& name);  // "LOG" -> "<PRODUCT>_LOG"
// Normalized value as text ("" when unset). name is the short name or the full variable name.
// Throws RTC_ERR_ARG naming the variable, the value received and what is accepted when the value is
// malformed or the name is not declared.
std::string knob_text(const std::string& name);
bool knob_bool(const std::string& name);                    // unset -> false (or default)
std::vector<std::string> knob_paths(const std::string& name);  // ':'-separated, empties dropped
long knob_int(const std::string& name);  // unset -> the declared default

}  // namespace rtc
