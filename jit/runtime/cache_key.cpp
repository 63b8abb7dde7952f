// Canonical key text, digest and readable cache file name.
#include "cache_key.h"
#include "sha256.h"
#include <algorithm>

namespace rtc {

// Length-prefixed fields, so no choice of names or texts can make two source sets collide.
static void add_field(Sha256& h, const std::string& s) {
  h.update(std::to_string(s.size()) + ":");
  h.update(s);
}

std::string hash_sources(const SourceText& main, std::vector<SourceText> headers) {
  std::sort(headers.begin(), headers.end(), [](const SourceText& a, const SourceText& b) { return a.name < b.name; });
  Sha256 h;
  add_field(h, main.name);
  add_field(h, main.text);
  for (const SourceText& s : headers) {
    add_field(h, s.name);
    add_field(h, s.text);
  }
  return h.hex();
}

static std::string one_line(const std::string& s) {
  std::string out = s;
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

std::string CacheKey::text() const {
  std::string t = "op=" + op + "\nvariant=" + variant + "\narch=" + arch + "\nkernel_symbol=" + kernel_symbol +
                  "\ncompiler_id=" + compiler_id + "\ncompiler_version=" + one_line(compiler_version) + "\n";
  for (const std::string& o : options) t += "option=" + one_line(o) + "\n";
  t += "source_sha256=" + source_sha256 + "\npackage_version=" + package_version + "\n";
  return t;
}

std::string CacheKey::digest() const { return sha256_hex(text()); }

// File names must stay portable and readable: anything outside [A-Za-z0-9._+-] becomes '_'.
static std::string safe(const std::string& s) {
  std::string out = s.empty() ? "none" : s;
  for (char& c : out)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '+' && c != '-') c = '_';
  return out;
}

std::string CacheKey::file_name() const {
  return safe(op) + "-" + safe(variant) + "-" + safe(arch) + "-" + safe(compiler_id) + "-" + digest().substr(0, 8) +
         ".co";
}

}  // namespace rtc
