// File-system helpers used by the cache and the compilers.
#include "fsutil.h"
#include "common.h"
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <mutex>
#include <set>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rtc {

static std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string size_text(size_t bytes) {
  if (bytes >= (size_t(1) << 20) && bytes % (size_t(1) << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

bool read_fd(int fd, const std::string& path, std::string* data, std::string* err, size_t max_bytes) {
  struct stat st{};
  if (fstat(fd, &st) != 0) return *err = errno_text(path), false;
  if (!S_ISREG(st.st_mode)) return *err = path + " is not a regular file", false;
  std::string too_big = path + " is larger than " + size_text(max_bytes);
  if (size_t(st.st_size) > max_bytes) return *err = too_big, false;
  data->clear();
  data->reserve(size_t(st.st_size));
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return *err = errno_text(path), false;
    // The file may grow while we read: the cap holds for what is read, not only for fstat's size.
    if (data->size() + size_t(n) > max_bytes) return *err = too_big, false;
    data->append(buf, size_t(n));
  }
  return true;
}

bool read_file(const std::string& path, std::string* data, std::string* err, size_t max_bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return *err = errno_text(path), false;
  bool ok = read_fd(fd, path, data, err, max_bytes);
  close(fd);
  return ok;
}

static bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// Every file we write is new: O_EXCL fails on anything already there, O_NOFOLLOW on a planted
// link, so a write can never land in a file someone else chose.
static const int kNewFile = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

bool write_file(const std::string& path, const std::string& data, std::string* err) {
  int fd = open(path.c_str(), kNewFile, 0600);
  if (fd < 0 || !write_all(fd, data)) {
    *err = errno_text(path);
    if (fd >= 0) close(fd);
    return false;
  }
  close(fd);
  return true;
}

// Readers must never see a half-written entry: the data goes to a temp name that no other process
// or thread can share (pid + tid), is fsynced so a crash cannot leave a renamed but empty file,
// closed, and only then renamed over the final name (rename is atomic within one file system).
bool write_file_atomic(const std::string& path, const std::string& data, std::string* err) {
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(long(syscall(SYS_gettid)));
  int fd = open(tmp.c_str(), kNewFile, 0644);
  if (fd < 0 && errno == EEXIST) {  // left by a killed process whose pid and tid we now have
    unlink(tmp.c_str());
    fd = open(tmp.c_str(), kNewFile, 0644);
  }
  if (fd < 0) {
    *err = errno_text(tmp);
    return false;
  }
  bool ok = write_all(fd, data) && fsync(fd) == 0;
  if (!ok) *err = errno_text(tmp);
  if (close(fd) != 0 && ok) {
    ok = false;
    *err = errno_text(tmp);
  }
  if (ok && rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    *err = errno_text(path);
  }
  if (!ok) unlink(tmp.c_str());
  return ok;
}

bool make_dirs(const std::string& dir, unsigned mode, std::string* err) {
  if (dir.empty()) {
    *err = "empty path";
    return false;
  }
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string part = dir.substr(0, pos);
    if (mkdir(part.c_str(), mode) != 0 && errno != EEXIST) {
      *err = errno_text("mkdir " + part);
      return false;
    }
  }
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *err = dir + " is not a directory";
    return false;
  }
  return true;
}

std::string temp_base() {
  const char* base = std::getenv("TMPDIR");
  return base && *base ? base : "/tmp";
}

std::string make_private_dir(const std::string& parent, const std::string& prefix, std::string* err) {
  std::string tmpl = parent + "/" + prefix + "XXXXXX";
  if (mkdtemp(&tmpl[0])) return tmpl;
  *err = std::strerror(errno);
  return "";
}

// Sweeps each temp base once per process: the first temp dir made there pays for one readdir.
static void sweep_temp_base_once(const std::string& base) {
  static std::mutex mu;
  static std::set<std::string> swept;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!swept.insert(base).second) return;
  }
  sweep_stale_temps(base, temp_dir_pid);
}

std::string make_temp_dir(const std::string& prefix) {
  std::string base = temp_base(), err;
  sweep_temp_base_once(base);
  std::string dir = make_private_dir(base, product() + "-" + prefix + "pid" + std::to_string(getpid()) + "-", &err);
  RTC_CHECK(
      !dir.empty(), RTC_ERR_UNAVAILABLE,
      "cannot create a temp dir in TMPDIR=" + base + ": " + err + " (set TMPDIR to a writable dir with free space)");
  return dir;
}

void remove_tree(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      std::string p = dir + "/" + n;
      struct stat st{};
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        remove_tree(p);
      else
        unlink(p.c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

bool safe_relative_name(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

// Digits of s from pos up to end (or the end of s) as a pid; 0 when they are not all digits.
static long pid_at(const std::string& s, size_t pos, size_t end) {
  if (end == std::string::npos) end = s.size();
  if (pos >= end || end - pos > 9) return 0;
  long pid = 0;
  for (size_t i = pos; i < end; ++i) {
    if (s[i] < '0' || s[i] > '9') return 0;
    pid = pid * 10 + (s[i] - '0');
  }
  return pid;
}

long atomic_temp_pid(const std::string& name) {
  size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return 0;
  size_t dot = name.find('.', at + 5);
  if (dot == std::string::npos || pid_at(name, dot + 1, std::string::npos) == 0) return 0;  // the tid
  return pid_at(name, at + 5, dot);
}

long temp_dir_pid(const std::string& name) {
  std::string head = product() + "-";
  size_t last = name.rfind('-');
  if (name.compare(0, head.size(), head) != 0 || last == std::string::npos || name.size() - last != 7) return 0;
  size_t mark = name.rfind("-pid", last - 1);
  if (mark == std::string::npos || mark < head.size() - 1) return 0;
  return pid_at(name, mark + 4, last);
}

bool process_alive(long pid) { return kill(pid_t(pid), 0) == 0 || errno == EPERM; }

// A process in another pid namespace that shares the dir looks dead to us; the age limit keeps its
// live temporaries (a compile dir is written when the compile starts) safe from the sweep.
void sweep_stale_temps(const std::string& dir, long (*pid_of)(const std::string& name)) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  time_t now = time(nullptr);
  uid_t me = geteuid();
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name, path = dir + "/" + name;
    long pid = pid_of(name);
    struct stat st{};
    if (pid <= 0 || lstat(path.c_str(), &st) != 0 || st.st_uid != me) continue;
    if (now - st.st_mtime < kStaleTempSeconds || process_alive(pid)) continue;
    if (S_ISDIR(st.st_mode))
      remove_tree(path);
    else
      unlink(path.c_str());
    log_line("removed " + path + ", a temporary of process " + std::to_string(pid) + " that is gone");
  }
  closedir(d);
}

}  // namespace rtc
