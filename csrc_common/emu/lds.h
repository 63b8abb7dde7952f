// The emulated LDS of one workgroup: 64 KiB of bytes plus a shadow used by the race check.
#pragma once
#include <stdint.h>

namespace rtc_emu {

constexpr int kLdsBytes = 65536;  // LDS per workgroup on gfx90a and gfx942
constexpr int kShadowGrain = 2;   // bytes per shadow entry: bf16 stores of neighbours stay apart

// Last writer and last reader of one 2-byte unit. Epochs are barrier generations; wepochs count
// the writer's (reader's) wave collectives, which order lanes of one wave.
struct ShadowEntry {
  uint32_t w_epoch, w_wepoch, r_epoch, r_wepoch;
  uint8_t w_wave, w_lane, r_wave, r_lane;  // r_wave/r_lane = kMany when several read
};
constexpr uint8_t kMany = 0xFF;

struct Lds {
  alignas(64) unsigned char bytes[kLdsBytes];
  ShadowEntry shadow[kLdsBytes / kShadowGrain];
};

}  // namespace rtc_emu
