// File-system helpers used by the cache and the compilers.
#include "fsutil.h"
#include "common.h"
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rtc {

static std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

bool read_file(const std::string& path, std::string* data, std::string* err) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = errno_text(path);
    return false;
  }
  data->clear();
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno_text(path);
      close(fd);
      return false;
    }
    data->append(buf, size_t(n));
  }
  close(fd);
  return true;
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

bool write_file(const std::string& path, const std::string& data, std::string* err) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
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
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                    std::to_string(long(syscall(SYS_gettid)));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *err = dir + " is not a directory";
    return false;
  }
  return true;
}

std::string make_temp_dir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + product() + "-" + prefix + "XXXXXX";
  if (!mkdtemp(&tmpl[0])) return "";
  return tmpl;
}

void remove_tree(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      std::string p = dir + "/" + n;
      struct stat st {};
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

}  // namespace rtc
