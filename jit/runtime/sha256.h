// SHA-256 (FIPS 180-4), used for cache keys and entry checksums.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace rtc {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::string hex();  // finishes the hash; the object must not be updated afterwards
 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t n);
inline std::string sha256_hex(const std::string& s) { return sha256_hex(s.data(), s.size()); }

}  // namespace rtc
