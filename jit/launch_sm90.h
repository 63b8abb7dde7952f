// Host side of the sm_90a fast attention kernel (launch geometry, workspace), implemented in launch_sm90.cpp.
#pragma once
#include <stdint.h>
#include <string>
#include "rtcattn_c.h"

struct AttnParams;

namespace rtc {

// Launches the sm90 kernel of `program` for the filled parameter block p (op_attention.cpp fills
// every field from a; tail_split there is the caller's request: -1 plan, 0 off, >1 forced).
// Launch through rtc_launch(program, ...). Returns RTC_OK or throws RtcError; a non-zero return
// is reported as RTC_ERR_LAUNCH.
int launch_sm90(uint64_t program, AttnParams* p, const rtc_attention_args* a, const char* vendor,
                int device, void* stream);
// Why the sm90 kernel cannot take these runtime arguments (vendor, head dim, pointer alignment,
// strides, tile count), or "" when it can. Needs no driver, so dispatch can ask before building.
std::string why_not_sm90(const rtc_attention_args* a, const char* vendor);
// Scratch bytes the sm90 kernel needs for these args (0 when none).
int64_t workspace_bytes_sm90(const rtc_attention_args* a);

}  // namespace rtc
