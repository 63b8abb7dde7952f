// Disk cache implementation: entry format "<PRODUCT>-CODE-OBJECT 1", key text, blob checksum.
#include "disk_cache.h"
#include "common.h"
#include "compiler.h"
#include "knobs.h"
#include "sha256.h"
#include "fsutil.h"
#include "trust.h"
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

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

static long cache_temp_pid(const std::string& name) {
  bool ours = name.find(".co.tmp.") != std::string::npos || name.find(".co.log.tmp.") != std::string::npos;
  return ours ? atomic_temp_pid(name) : 0;
}

static void sweep_once(const std::string& dir) {
  static std::mutex mu;
  static std::set<std::string> swept;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!swept.insert(dir).second) return;
  }
  sweep_stale_temps(dir, cache_temp_pid);
}

std::string user_dir_problem(const std::string& dir) {
  std::string err, why;
  if (!make_dirs(dir, 0700, &err)) return "is unusable (" + err + ")";
  if (!dir_trusted(dir, false, &why)) return "is not used because " + why;
  return "";
}

bool prepare_user_dir(const std::string& dir) {
  std::string problem = user_dir_problem(dir);
  if (!problem.empty()) {
    warn_once("dir:" + dir, "cache dir " + dir + " " + problem + "; code objects are kept in memory only");
    return false;
  }
  sweep_once(dir);
  return true;
}

// ---- the entry format ------------------------------------------------------------------------

std::string entry_bytes(const std::string& key_text, const std::string& blob) {
  return magic() + "blob-sha256 " + sha256_hex(blob) + "\nblob-size " + std::to_string(blob.size()) + "\nkey-size " +
         std::to_string(key_text.size()) + "\n" + key_text + blob;
}

// Takes text at *pos when data has it there.
static bool take(const std::string& data, size_t* pos, const std::string& text) {
  if (data.size() - *pos < text.size() || data.compare(*pos, text.size(), text) != 0) return false;
  *pos += text.size();
  return true;
}

// A size field as the writer writes it: 1 to 19 decimal digits (so it cannot overflow), no sign,
// space or leading zero, then '\n'. Anything else is a damaged or forged header.
static bool take_size(const std::string& data, size_t* pos, unsigned long long* value) {
  size_t i = *pos;
  *value = 0;
  while (i < data.size() && i - *pos < 20 && data[i] >= '0' && data[i] <= '9') *value = *value * 10 + (data[i++] - '0');
  size_t digits = i - *pos;
  if (digits == 0 || digits > 19 || (digits > 1 && data[*pos] == '0') || i >= data.size() || data[i] != '\n')
    return false;
  *pos = i + 1;
  return true;
}

static bool take_sha(const std::string& data, size_t* pos, std::string* sha) {
  *sha = data.substr(*pos, 64);
  if (sha->size() != 64 || sha->find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  *pos += 64;
  return true;
}

std::string parse_entry(const std::string& data, const std::string& key_text, std::string* blob) {
  size_t pos = 0;
  std::string sha;
  unsigned long long blob_size = 0, key_size = 0;
  if (!take(data, &pos, magic())) return "bad magic";
  if (!take(data, &pos, "blob-sha256 ") || !take_sha(data, &pos, &sha)) return "unreadable blob-sha256 line";
  if (!take(data, &pos, "\nblob-size ") || !take_size(data, &pos, &blob_size)) return "unreadable blob-size line";
  if (!take(data, &pos, "key-size ") || !take_size(data, &pos, &key_size)) return "unreadable key-size line";
  // Subtractions only: the sizes are whatever the file says, and their sum could wrap past 2^64.
  size_t rest = data.size() - pos;
  if (key_size > rest || blob_size != rest - key_size)
    return "its header gives key-size " + std::to_string(key_size) + " + blob-size " + std::to_string(blob_size) +
           " but " + std::to_string(rest) + " bytes follow (truncated or padded entry)";
  if (key_size != key_text.size() || data.compare(pos, key_size, key_text) != 0)
    return "key text differs (hash collision?)";
  blob->assign(data, pos + key_size, blob_size);
  if (sha256_hex(*blob) != sha) return "checksum mismatch";
  return "";
}

// ---- reading and writing entries -------------------------------------------------------------

bool read_entry(const std::string& dir, const CacheKey& key, bool remove_bad, std::string* blob) {
  std::string path = dir + "/" + key.file_name(), data;
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) return false;  // not there: a miss
  std::string why = read_trusted_file(path, st, &data);
  if (why.empty()) why = parse_entry(data, key.text(), blob);
  if (why.empty()) why = code_object_problem(key.arch, *blob);
  if (why.empty()) return true;
  warn_once("entry:" + path, "cache entry " + path + " is invalid (" + why + "); " +
                                 (remove_bad ? "discarded and rebuilt" : "not loaded from there"));
  if (remove_bad) unlink(path.c_str());
  return false;
}

std::string write_entry(const std::string& dir, const CacheKey& key, const std::string& blob) {
  std::string path = dir + "/" + key.file_name(), err;
  if (!write_file_atomic(path, entry_bytes(key.text(), blob), &err)) {
    warn_once("write:" + dir,
              "cannot write to cache dir " + dir + " (" + err + "); code objects are kept in memory only");
    return "";
  }
  return path;
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

// ---- clear: only what the runtime wrote ------------------------------------------------------
//
// clear runs with the user's rights in a dir where anyone with access may have put names of their own,
// so a name alone proves nothing: an entry is a regular file of this user that starts with the entry
// magic; its log is the file named after it; a lock or a temp is named after an entry and also either
// sits beside one of ours or has the content (a lock: empty or a pid) or name (a temp: pid and tid) that
// the runtime gives it. Never a link, never another user's file, never a file of a dir the runtime
// itself would refuse.

namespace {

// Up to n bytes from the start of a regular file of this user (lstat, then O_NOFOLLOW); why not otherwise.
std::string own_file_head(const std::string& path, size_t n, std::string* head) {
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) return std::strerror(errno);
  std::string why;
  if (S_ISLNK(st.st_mode))
    why = "it is a symbolic link";
  else if (!S_ISREG(st.st_mode))
    why = "it is not a regular file";
  else if (st.st_uid != geteuid())
    why = "it is owned by uid " + std::to_string(st.st_uid) + ", not by this user";
  if (!why.empty()) return why;
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open it: ") + std::strerror(errno);
  head->assign(n, '\0');
  ssize_t got = pread(fd, &(*head)[0], n, 0);
  close(fd);
  head->resize(got > 0 ? size_t(got) : 0);
  return "";
}

bool is_lock_text(const std::string& text) {  // as KeyLock leaves it: empty, or "<pid>\n"
  return text.empty() ||
         (text.size() >= 2 && text.back() == '\n' && text.find_first_not_of("0123456789") == text.size() - 1);
}

std::string strip_suffix(const std::string& s, const std::string& suffix) {
  return ends_with(s, suffix) ? s.substr(0, s.size() - suffix.size()) : "";
}

// "" when dir/name is the runtime's to remove; why not when the name is one of its kinds; "-" when the name
// is none of them (left without a word).
std::string why_kept(const std::string& dir, const std::string& name, const std::set<std::string>& entries) {
  const std::string path = dir + "/" + name;
  std::string head, why;
  size_t cap = magic().size() + 1;
  if (ends_with(name, ".co") && name[0] != '.') {
    why = own_file_head(path, cap, &head);
    if (why.empty() && head.compare(0, magic().size(), magic()) != 0)
      why = "it does not start with the " + magic().substr(0, magic().size() - 1) + " header (not a cache entry)";
    return why;
  }
  std::string base = strip_suffix(name, ".log");
  if (!base.empty() && ends_with(base, ".co")) {
    why = own_file_head(path, 0, &head);
    return why.empty() && !entries.count(base) ? "no cache entry of this runtime is beside it" : why;
  }
  base = strip_suffix(name, ".lock");
  if (!base.empty() && ends_with(base, ".co")) {
    why = own_file_head(path, cap, &head);
    return why.empty() && !entries.count(base) && !is_lock_text(head) ? "it does not hold a lock file's pid" : why;
  }
  long pid = cache_temp_pid(name);
  if (pid <= 0) return "-";
  why = own_file_head(path, 0, &head);
  return why.empty() && process_alive(pid) ? "process " + std::to_string(pid) + " is writing it" : why;
}

}  // namespace

int clear_dir(const std::string& dir) {
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 && errno == ENOENT) return 0;  // never made: nothing to clear
  std::string why;
  RTC_CHECK(dir_trusted(dir, false, &why), RTC_ERR_ARG,
            "cache dir " + dir + " is not cleared because " + why +
                "; the runtime does not use such a dir, so nothing in it is its to remove");
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
  }
  std::set<std::string> entries;  // decided before anything is removed: logs and locks are judged by them
  for (const std::string& n : names)
    if (ends_with(n, ".co") && why_kept(dir, n, {}).empty()) entries.insert(n);
  int removed = 0;
  for (const std::string& n : names) {
    std::string kept = why_kept(dir, n, entries);
    if (kept.empty() && unlink((dir + "/" + n).c_str()) == 0) ++removed;
    if (!kept.empty() && kept != "-") warn("clear: left " + dir + "/" + n + " in place: " + kept);
  }
  return removed;
}

}  // namespace rtc
