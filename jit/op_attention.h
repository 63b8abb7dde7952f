// The attention op's host entry points behind rtc_attention_fwd / rtc_attention_workspace_bytes.
#pragma once
#include <cstdint>
#include <string>
#include "rtcattn_c.h"

namespace rtc {

// "" when kernel kind takes these runtime arguments (vendor, alignment, strides), else why not.
std::string attention_supports(const char* kind, const rtc_attention_args* a, const char* vendor);
int64_t attention_workspace_bytes(const char* kind, const rtc_attention_args* a);
// Returns RTC_OK or throws RtcError.
int attention_fwd(uint64_t program, const char* kind, const rtc_attention_args* a, const char* vendor,
                  int device, void* stream);

}  // namespace rtc
