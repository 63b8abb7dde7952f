// On-disk code-object cache: dir policy, checked entries, atomic writes and per-key file locks.
#pragma once
#include <string>
#include <vector>
#include "cache_key.h"

namespace rtc {

// $<PRODUCT>_CACHE_DIR, else $XDG_CACHE_HOME/<product>, else ~/.cache/<product> (override wins).
std::string user_cache_dir(const char* override_dir);
// $<PRODUCT>_SYSTEM_CACHE entries, then the package dir set through rtc_set_package_cache_dir.
std::vector<std::string> system_cache_dirs();
void set_package_cache_dir(const std::string& dir);

// A dir we may load from: owned by us (or root for system dirs) and not writable by group or
// others, since anyone who can write it can plant code that we would run on the GPU.
bool dir_trusted(const std::string& dir, bool allow_root_owner, std::string* why);
// Creates the user dir (0700) when missing; false (with a warning once) when it is unusable.
bool prepare_user_dir(const std::string& dir);

// Reads and verifies an entry; a failing entry is reported once and, when remove_bad, deleted.
bool read_entry(const std::string& dir, const CacheKey& key, bool remove_bad, std::string* blob);
// Atomic write; returns the final path or "" (warned once per dir) when the dir is unwritable.
std::string write_entry(const std::string& dir, const CacheKey& key, const std::string& blob);

// Exclusive per-key lock on <dir>/<name>.lock via flock: the kernel drops it when the holder
// dies, so a crashed process never leaves a lock that blocks others.
class KeyLock {
 public:
  KeyLock(const std::string& dir, const std::string& name);
  ~KeyLock();
  bool held() const { return fd_ >= 0; }
 private:
  int fd_ = -1;
};

std::vector<std::string> list_entries(const std::string& dir);  // *.co file names
int clear_dir(const std::string& dir);                             // removes entries, locks, temps

}  // namespace rtc
