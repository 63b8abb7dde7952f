// Library loading with a readable failure: every candidate path and its dlerror.
#include "dynlib.h"
#include "common.h"
#include "knobs.h"
#include "trust.h"
#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <climits>
#include <cstdlib>
#include <algorithm>
#include <mutex>

namespace rtc {

namespace {

std::mutex g_refused_mu;
std::vector<std::pair<std::string, std::string>> g_refused;  // (path, why), in the order met

void refuse(const std::string& path, const std::string& why) {
  std::lock_guard<std::mutex> lock(g_refused_mu);
  for (const auto& r : g_refused)
    if (r.first == path) return;
  g_refused.emplace_back(path, why);
  warn("library " + path + " (from " + knob_env_name("LIBRARY_PATH") + ") is not loaded because " + why);
}

// dlopen runs a library's constructors before anything else can be checked, so a file from a LIBRARY_PATH
// dir passes the cache's trust rules first (trust.h): its dir owned by this user or root and writable by
// nobody else (so the file cannot be swapped after the check), the file itself a regular file, not a
// symbolic link, owned by this user or root and writable by nobody else. "" when it may be loaded or is
// missing (dlopen then says so).
std::string library_problem(const std::string& dir, const std::string& path) {
  std::string why;
  if (!dir_trusted(dir, true, &why)) return "its dir " + dir + " is not used: " + why;
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) return "";
  return file_problem(st);
}

}  // namespace

bool DynLib::open(const std::vector<std::string>& names, const std::vector<std::string>& dirs, std::string* tried,
                  bool global, const char* needs) {
  // The LIBRARY_PATH knob's dirs come first, so a user (or a test's stand-in library) overrides what
  // the system's loader path would find; then the loader's own search; then the other dirs.
  struct Candidate {
    std::string path, knob_dir;  // knob_dir: the LIBRARY_PATH dir it is in, whose files are checked
  };
  std::vector<Candidate> paths;
  auto listed = [&paths](const std::string& p) {
    for (const Candidate& c : paths)
      if (c.path == p) return true;
    return false;
  };
  for (const std::string& d : knob_paths("LIBRARY_PATH"))
    for (const std::string& n : names) paths.push_back({d + "/" + n, d});
  for (const std::string& n : names) paths.push_back({n, ""});
  for (const std::string& d : dirs)
    for (const std::string& n : names)
      if (!listed(d + "/" + n)) paths.push_back({d + "/" + n, ""});
  for (const Candidate& c : paths) {
    const std::string& p = c.path;
    std::string why = c.knob_dir.empty() ? "" : library_problem(c.knob_dir, p);
    if (!why.empty()) {
      refuse(p, why);
      if (tried) *tried += "  " + p + ": not loaded: " + why + "\n";
      continue;
    }
    void* h = dlopen(p.c_str(), RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (h && needs && !dlsym(h, needs)) {
      if (tried) *tried += "  " + p + ": loads but has no " + needs + "\n";
      dlclose(h);
      continue;
    }
    if (h) {
      handle_ = h;
      path_ = p;
      return true;
    }
    const char* err = dlerror();
    if (tried) *tried += "  " + p + ": " + (err ? err : "not found") + "\n";
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> refused_libraries() {
  std::lock_guard<std::mutex> lock(g_refused_mu);
  return g_refused;
}

std::string DynLib::real_path() const {
  char buf[4096];
  link_map* map = nullptr;
  if (!handle_ || dlinfo(handle_, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name) return path_;
  return realpath(map->l_name, buf) ? std::string(buf) : std::string(map->l_name);
}

void* DynLib::symbol(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

void* DynLib::require(const char* name) const {
  void* s = symbol(name);
  RTC_CHECK(s, RTC_ERR_UNAVAILABLE, "symbol " + quote(name) + " not found in " + path_);
  return s;
}

static std::mutex g_dirs_mu;
static std::vector<std::string> g_added_dirs;

void add_library_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_dirs_mu);
  for (const std::string& d : g_added_dirs)
    if (d == dir) return;
  g_added_dirs.push_back(dir);
}

std::string own_library_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_library_dir), &info) || !info.dli_fname) return "";
  std::string p = info.dli_fname;
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// pip's CUDA wheels put their libraries in site-packages/nvidia/<component>/lib.
static void add_nvidia_wheel_dirs(const std::string& site, std::vector<std::string>* out) {
  std::string root = site + "/nvidia";
  DIR* d = opendir(root.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    out->push_back(root + "/" + name + "/lib");
  }
  closedir(d);
}

std::vector<std::string> library_search_dirs() {
  std::vector<std::string> dirs = knob_paths("LIBRARY_PATH");
  {
    std::lock_guard<std::mutex> lock(g_dirs_mu);
    for (const std::string& d : g_added_dirs) {
      dirs.push_back(d);
      add_nvidia_wheel_dirs(d, &dirs);  // an added site-packages dir brings its wheel dirs
    }
  }
  std::string own = own_library_dir();  // .../site-packages/<product> when installed
  size_t slash = own.rfind('/');
  if (slash != std::string::npos) add_nvidia_wheel_dirs(own.substr(0, slash), &dirs);
  return dirs;
}

}  // namespace rtc
