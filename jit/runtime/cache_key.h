// The cache key: a value type with named fields, its canonical text, hash and readable file name.
#pragma once
#include <string>
#include <vector>

namespace rtc {

struct SourceText {
  std::string name;  // include name
  std::string text;
};

struct CacheKey {
  std::string op, variant, arch, kernel_symbol;
  std::string compiler_id;       // short, for the file name: "clang19", "hiprtc5.2", "nvrtc13.0"
  std::string compiler_version;  // full identity text (binary path + --version, library version)
  std::vector<std::string> options;
  std::string source_sha256;     // over the kernel text and every header, names included
  std::string package_version;

  std::string text() const;       // canonical "field=value" lines; stored in each entry header
  std::string digest() const;     // SHA-256 of text()
  std::string file_name() const;  // op-variant-arch-compiler-<8 hex>.co
};

// Hash of a source set; headers are sorted by name so their order in the request does not matter.
std::string hash_sources(const SourceText& main, std::vector<SourceText> headers);

}  // namespace rtc
