// Small file-system helpers: bounded reads, atomic and exclusive writes, mkdir -p, private temp dirs.
#pragma once
#include <cstddef>
#include <string>

namespace rtc {

// The largest file any reader here accepts: a cache entry (header + code object), a code object or
// a compiler log. Generous (code objects are a few MB); it only stops an endless or absurd file.
constexpr size_t kMaxReadBytes = size_t(256) << 20;
std::string size_text(size_t bytes);  // "256 MiB"

// Reads a regular file of at most max_bytes. Opened non-blocking and checked with fstat, so a FIFO
// or a device in its place is refused instead of blocking or growing memory without end.
bool read_file(const std::string& path, std::string* data, std::string* err, size_t max_bytes = kMaxReadBytes);
// The same on a descriptor the caller opened and checked; path only names it in messages.
bool read_fd(int fd, const std::string& path, std::string* data, std::string* err, size_t max_bytes);
// temp name "<path>.tmp.<pid>.<tid>" -> write -> fsync -> close -> rename.
bool write_file_atomic(const std::string& path, const std::string& data, std::string* err);
// Creates a new file (0600): never follows a link and never overwrites (O_EXCL | O_NOFOLLOW).
bool write_file(const std::string& path, const std::string& data, std::string* err);
bool make_dirs(const std::string& dir, unsigned mode, std::string* err);
// The temp base: $TMPDIR, else /tmp.
std::string temp_base();
// A fresh private dir (0700) under $TMPDIR named "<product>-<prefix>pid<pid>-XXXXXX", so that a
// later process can tell it from a live one's and sweep it once its process is gone. Throws
// RTC_ERR_UNAVAILABLE naming TMPDIR and the reason when none can be made.
std::string make_temp_dir(const std::string& prefix);
// A fresh private dir parent/<prefix>XXXXXX (mkdtemp: new, 0700, ours); "" with *err on failure.
std::string make_private_dir(const std::string& parent, const std::string& prefix, std::string* err);
void remove_tree(const std::string& dir);
// Include names must stay inside the dir they are written to.
bool safe_relative_name(const std::string& name);

// Temporaries left by killed processes. pid_of returns the pid a name of the caller's kind carries,
// else 0; entries of this user whose process is gone and that are older than kStaleTempSeconds are
// removed (files, or dirs with their contents).
constexpr long kStaleTempSeconds = 600;
void sweep_stale_temps(const std::string& dir, long (*pid_of)(const std::string& name));
long atomic_temp_pid(const std::string& name);  // "<file>.tmp.<pid>.<tid>" -> pid
long temp_dir_pid(const std::string& name);     // "<product>-<what>pid<pid>-XXXXXX" -> pid
// Whether pid names a live process (one of another user counts: EPERM).
bool process_alive(long pid);

}  // namespace rtc
