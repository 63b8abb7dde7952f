// On-disk code-object cache: dir policy, checked entries, atomic writes and per-key file locks.
#pragma once
#include <string>
#include <vector>
#include "cache_key.h"
#include "key_lock.h"
#include "trust.h"

namespace rtc {

// $<PRODUCT>_CACHE_DIR, else $XDG_CACHE_HOME/<product>, else ~/.cache/<product> (override wins).
std::string user_cache_dir(const char* override_dir);
// $<PRODUCT>_SYSTEM_CACHE entries, then the package dir set through rtc_set_package_cache_dir.
std::vector<std::string> system_cache_dirs();
void set_package_cache_dir(const std::string& dir);

// Creates the user dir (0700) when missing; false (with a warning once) when it is unusable. The
// first call per dir also sweeps the temporaries that killed processes left there.
bool prepare_user_dir(const std::string& dir);
// The same making and checking, quietly: "" when the dir is usable, else the rest of a sentence that starts
// with "cache dir <dir> " ("is unusable (mkdir ...: ...)", "is not used because it is writable by ...").
std::string user_dir_problem(const std::string& dir);

// Reads and verifies an entry: the file itself (regular, not a link, owned by us or root, not
// group/other-writable, at most kMaxReadBytes), its header, key, checksum and code object. A
// failing entry is reported once and, when remove_bad (the user dir), deleted.
bool read_entry(const std::string& dir, const CacheKey& key, bool remove_bad, std::string* blob);
// Atomic write; returns the final path or "" (warned once per dir) when the dir is unwritable.
std::string write_entry(const std::string& dir, const CacheKey& key, const std::string& blob);
// The entry format, for the writer, the reader and the parser's test hook: parse_entry returns ""
// when data is the entry of key_text, else why not (never throws, whatever the bytes).
std::string entry_bytes(const std::string& key_text, const std::string& blob);
std::string parse_entry(const std::string& data, const std::string& key_text, std::string* blob);

std::vector<std::string> list_entries(const std::string& dir);  // *.co file names
// Removes what this runtime wrote into dir (its entries, their logs, locks and temps: see disk_cache.cpp) and
// returns how many files; warns for each file named like one that it leaves. A missing dir has nothing; a dir
// the runtime would not use (dir_trusted) is refused with RTC_ERR_ARG.
int clear_dir(const std::string& dir);

}  // namespace rtc
