// dlopen over a list of candidate names and search dirs; the error lists every path tried.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace rtc {

class DynLib {
 public:
  // Tries each name inside each <PRODUCT>_LIBRARY_PATH dir (only a file that passes the trust rules of
  // trust.h: it is refused, never dlopen'ed, otherwise), as given (the loader's own search) and then inside
  // each search dir.
  // Returns false and fills *tried with "path: dlerror" lines when nothing loads.
  // The first candidate that loads and (when `needs` is given) exports the symbol `needs`: a file
  // of the right name without it (a stub, another version) is skipped and listed in *tried.
  bool open(const std::vector<std::string>& names, const std::vector<std::string>& dirs, std::string* tried,
            bool global = false, const char* needs = nullptr);
  bool is_open() const { return handle_ != nullptr; }
  const std::string& path() const { return path_; }
  std::string real_path() const;  // the file actually loaded, symlinks resolved
  void* symbol(const char* name) const;  // nullptr when absent
  // Binds a typed function pointer; throws RTC_ERR_UNAVAILABLE naming the symbol and library.
  template <typename F>
  void bind(F& fn, const char* name) const {
    fn = reinterpret_cast<F>(require(name));
  }

 private:
  void* require(const char* name) const;
  void* handle_ = nullptr;
  std::string path_;
};

// Files of <PRODUCT>_LIBRARY_PATH dirs refused by the trust rules so far: (path, why), for info.
std::vector<std::pair<std::string, std::string>> refused_libraries();

// Dirs for vendor libraries: $<PRODUCT>_LIBRARY_PATH, dirs added through rtc_add_library_dir, and
// the pip wheel dirs (site-packages/nvidia/*/lib) next to the package this library sits in.
std::vector<std::string> library_search_dirs();
void add_library_dir(const std::string& dir);
// The directory holding the runtime library itself.
std::string own_library_dir();

}  // namespace rtc
