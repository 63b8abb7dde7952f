// Disk cache implementation: entry format "<PRODUCT>-CODE-OBJECT 1", key text, blob checksum.
#include "disk_cache.h"
#include "common.h"
#include "knobs.h"
#include "sha256.h"
#include "fsutil.h"
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdlib>
#include <mutex>

namespace rtc {

static const std::string& magic() {
  static const std::string m = product_upper() + "-CODE-OBJECT 1\n";
  return m;
}
static std::mutex g_pkg_mu;
static std::string g_package_dir;

std::string user_cache_dir(const char* override_dir) {
  if (override_dir && *override_dir) return override_dir;
  std::string env = knob_text("CACHE_DIR");
  if (!env.empty()) return env;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/" + product();
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/" + product();
}

void set_package_cache_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_pkg_mu);
  g_package_dir = dir;
}

std::vector<std::string> system_cache_dirs() {
  std::vector<std::string> dirs = knob_paths("SYSTEM_CACHE");
  std::lock_guard<std::mutex> lock(g_pkg_mu);
  if (!g_package_dir.empty()) dirs.push_back(g_package_dir);
  return dirs;
}

bool dir_trusted(const std::string& dir, bool allow_root_owner, std::string* why) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = "it is not a directory";
    return false;
  }
  uid_t me = geteuid();
  if (st.st_uid != me && !(allow_root_owner && st.st_uid == 0)) {
    *why = "it is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
           std::to_string(me) + ")";
    return false;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    snprintf(mode, sizeof mode, "%03o", unsigned(st.st_mode & 0777));
    *why = std::string("it is writable by ") + ((st.st_mode & S_IWOTH) ? "other users" : "its group") +
           " (mode " + mode + "; fix with chmod go-w)";
    return false;
  }
  return true;
}

bool prepare_user_dir(const std::string& dir) {
  std::string err;
  if (!make_dirs(dir, 0700, &err)) {
    warn_once("dir:" + dir, "cache dir " + dir + " is unusable (" + err +
                                "); code objects are kept in memory only");
    return false;
  }
  std::string why;
  if (!dir_trusted(dir, false, &why)) {
    warn_once("dir:" + dir, "cache dir " + dir + " is not used because " + why +
                                "; code objects are kept in memory only");
    return false;
  }
  return true;
}

// Parses one entry; returns "" when valid, else the reason it was rejected.
static std::string check_entry(const std::string& data, const CacheKey& key, std::string* blob) {
  size_t magic_len = magic().size();
  if (data.compare(0, magic_len, magic()) != 0) return "bad magic";
  char sha[65] = {0};
  unsigned long long blob_size = 0, key_size = 0;
  int used = 0;
  if (sscanf(data.c_str() + magic_len, "blob-sha256 %64s\nblob-size %llu\nkey-size %llu\n%n", sha,
             &blob_size, &key_size, &used) != 3 || used == 0)
    return "unreadable header";
  size_t body = magic_len + size_t(used);
  if (data.size() != body + key_size + blob_size) return "truncated or padded entry";
  if (data.compare(body, key_size, key.text()) != 0) return "key text differs (hash collision?)";
  *blob = data.substr(body + key_size);
  if (sha256_hex(*blob) != sha) return "checksum mismatch";
  return "";
}

bool read_entry(const std::string& dir, const CacheKey& key, bool remove_bad, std::string* blob) {
  std::string path = dir + "/" + key.file_name(), data, err;
  if (!read_file(path, &data, &err)) return false;
  std::string why = check_entry(data, key, blob);
  if (why.empty()) return true;
  warn_once("entry:" + path, "cache entry " + path + " is invalid (" + why + "); discarded and rebuilt");
  if (remove_bad) unlink(path.c_str());
  return false;
}

std::string write_entry(const std::string& dir, const CacheKey& key, const std::string& blob) {
  std::string key_text = key.text();
  std::string data = magic() + "blob-sha256 " + sha256_hex(blob) +
                     "\nblob-size " + std::to_string(blob.size()) + "\nkey-size " +
                     std::to_string(key_text.size()) + "\n" + key_text + blob;
  std::string path = dir + "/" + key.file_name(), err;
  if (!write_file_atomic(path, data, &err)) {
    warn_once("write:" + dir, "cannot write to cache dir " + dir + " (" + err +
                                  "); code objects are kept in memory only");
    return "";
  }
  return path;
}

KeyLock::KeyLock(const std::string& dir, const std::string& name) {
  std::string path = dir + "/" + name + ".lock";
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) return;
  while (flock(fd_, LOCK_EX) != 0) {
    if (errno != EINTR) {
      close(fd_);
      fd_ = -1;
      return;
    }
  }
}

KeyLock::~KeyLock() {
  if (fd_ >= 0) close(fd_);  // closing the descriptor releases the flock
}

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> list_entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (ends_with(n, ".co") && n[0] != '.') out.push_back(n);
  }
  closedir(d);
  return out;
}

int clear_dir(const std::string& dir) {
  int removed = 0;
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    bool ours = ends_with(n, ".co") || ends_with(n, ".co.lock") || ends_with(n, ".co.log") ||
                n.find(".co.tmp.") != std::string::npos || n.find(".co.log.tmp.") != std::string::npos;
    if (ours && unlink((dir + "/" + n).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

}  // namespace rtc
