// The JSON text of rtc_info_json: compilers, loaders, devices, knobs and cache dirs with entries.
#pragma once
#include <string>

namespace rtc {

std::string info_json();
std::string json_string(const std::string& s);  // quoted and escaped

}  // namespace rtc
