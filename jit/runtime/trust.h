// Who may have written what the runtime loads: the trust rules of the cache dirs, their entries and logs,
// and the dirs of the <PRODUCT>_LIBRARY_PATH library search. One set of rules, so they cannot drift apart.
#pragma once
#include <string>
#include <sys/stat.h>

namespace rtc {

// A dir we may load from: owned by us (or root where allow_root_owner) and not writable by group or
// others, since anyone who can write it can plant code that we would run.
bool dir_trusted(const std::string& dir, bool allow_root_owner, std::string* why);
// "" when st (an lstat or fstat) is a regular file, not a symbolic link, owned by us or root and not
// writable by group or others; else why not.
std::string file_problem(const struct stat& st);
// Reads a file without trusting it: file_problem on `before` (the caller's lstat, so a missing file is the
// caller's case), then open with O_NOFOLLOW | O_NONBLOCK (a link or FIFO swapped in meanwhile is refused,
// never waited on), file_problem again on the open descriptor, which is what is read, at most kMaxReadBytes.
// Returns "" or why it was refused.
std::string read_trusted_file(const std::string& path, const struct stat& before, std::string* data);

}  // namespace rtc
