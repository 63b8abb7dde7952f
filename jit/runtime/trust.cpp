// The trust rules declared in trust.h.
#include "trust.h"
#include "fsutil.h"
#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace rtc {

static std::string mode_text(mode_t mode) {
  char text[8];
  snprintf(text, sizeof text, "%03o", unsigned(mode & 07777));  // all bits: 1777, not 777
  return text;
}

// Who may have written what we load: this user, or root where allow_root.
static std::string owner_problem(const struct stat& st, bool allow_root) {
  uid_t me = geteuid();
  if (st.st_uid == me || (allow_root && st.st_uid == 0)) return "";
  return "it is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(me) + ")" +
         (allow_root ? " or root" : "");
}

static std::string writable_problem(const struct stat& st) {
  if (!(st.st_mode & (S_IWGRP | S_IWOTH))) return "";
  return std::string("it is writable by ") + ((st.st_mode & S_IWOTH) ? "other users" : "its group") + " (mode " +
         mode_text(st.st_mode) + "; fix with chmod go-w)";
}

bool dir_trusted(const std::string& dir, bool allow_root_owner, std::string* why) {
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = "it is not a directory";
    return false;
  }
  *why = owner_problem(st, allow_root_owner);
  if (why->empty()) *why = writable_problem(st);
  return why->empty();
}

std::string file_problem(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
  if (!S_ISREG(st.st_mode)) return "it is not a regular file";
  std::string why = owner_problem(st, true);
  return why.empty() ? writable_problem(st) : why;
}

// The size cap is checked here and by read_fd: fstat's size first, then what is actually read.
static std::string readable_problem(const struct stat& st) {
  std::string why = file_problem(st);
  if (why.empty() && size_t(st.st_size) > kMaxReadBytes) why = "it is larger than " + size_text(kMaxReadBytes);
  return why;
}

std::string read_trusted_file(const std::string& path, const struct stat& before, std::string* data) {
  std::string why = readable_problem(before), err;
  if (!why.empty()) return why;
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open it: ") + std::strerror(errno);
  struct stat st{};
  why = fstat(fd, &st) == 0 ? readable_problem(st) : std::string("fstat failed: ") + std::strerror(errno);
  if (why.empty() && !read_fd(fd, path, data, &err, kMaxReadBytes)) why = err;
  close(fd);
  return why;
}

}  // namespace rtc
