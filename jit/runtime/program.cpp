// The program store and the build chain: memory map, user cache, system caches, compile.
#include "program.h"
#include "common.h"
#include "disk_cache.h"
#include "fsutil.h"
#include "knobs.h"
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace rtc {
namespace {

struct Loaded {
  void* module = nullptr;
  void* fn = nullptr;
};

struct Store {
  std::mutex mu;
  std::deque<Program> programs;                   // handle = index + 1; deque keeps addresses
  std::map<std::string, uint64_t> by_digest;      // key digest + cache dir -> handle
  std::map<std::string, Loaded> loaded;           // "handle/vendor/device" -> module + function
};

Store& store() {
  static Store* s = new Store;  // never destroyed: handles stay valid during process exit
  return *s;
}

std::string str(const char* s, const char* field) {
  RTC_CHECK(s != nullptr, RTC_ERR_ARG, std::string("rtc_build_request.") + field + " is null; a string is required");
  return s;
}

CompileInput make_input(const rtc_build_request& r) {
  CompileInput in;
  in.arch = str(r.arch, "arch");
  in.kernel_symbol = str(r.kernel_symbol, "kernel_symbol");
  in.main = {str(r.main.name, "main.name"), str(r.main.text, "main.text")};
  RTC_CHECK(r.n_headers >= 0 && (r.n_headers == 0 || r.headers), RTC_ERR_ARG,
            "rtc_build_request.n_headers=" + std::to_string(r.n_headers) + " with headers=null");
  for (int i = 0; i < r.n_headers; ++i)
    in.headers.push_back({str(r.headers[i].name, "headers[].name"), str(r.headers[i].text, "headers[].text")});
  RTC_CHECK(r.n_options >= 0 && (r.n_options == 0 || r.options), RTC_ERR_ARG,
            "rtc_build_request.n_options=" + std::to_string(r.n_options) + " with options=null");
  for (int i = 0; i < r.n_options; ++i) in.options.push_back(str(r.options[i], "options[]"));
  return in;
}

CacheKey make_key(const rtc_build_request& r, const CompileInput& in, const Compiler& c) {
  CacheKey k;
  k.op = str(r.op, "op");
  k.variant = str(r.variant, "variant");
  k.arch = in.arch;
  k.kernel_symbol = in.kernel_symbol;
  k.compiler_id = c.id();
  k.compiler_version = c.version();
  k.options = in.options;
  k.source_sha256 = hash_sources(in.main, in.headers);
  k.package_version = r.package_version ? r.package_version : "";
  return k;
}

// Keeps the failing source next to the cache so the error can point at something to rerun.
std::string save_failed(const std::string& cache_dir, const CacheKey& key, const CompileInput& in,
                        const std::string& log) {
  std::string name = key.file_name();
  std::string dir = cache_dir + "/failed/" + name.substr(0, name.size() - 3), err;
  if (!make_dirs(dir, 0700, &err)) dir = make_temp_dir("failed-");
  if (dir.empty()) return "(not saved: no writable dir)";
  std::vector<SourceText> all = in.headers;
  all.push_back(in.main);
  for (const SourceText& s : all) {
    if (!safe_relative_name(s.name)) continue;
    size_t slash = s.name.rfind('/');
    if (slash != std::string::npos) make_dirs(dir + "/" + s.name.substr(0, slash), 0700, &err);
    write_file(dir + "/" + s.name, s.text, &err);
  }
  write_file(dir + "/build.txt", key.text() + "\n" + log, &err);
  return dir;
}

CompileOutput compile_now(const CacheKey& key, const CompileInput& in, const Compiler& c,
                          const std::string& cache_dir, double* ms) {
  RTC_CHECK(!knob_bool("NO_COMPILE"), RTC_ERR_NO_COMPILE,
            knob_env_name("NO_COMPILE") + "=1 but " + key.file_name() + " is not in any cache (user dir " + cache_dir +
                "); key:\n" + key.text());
  double t0 = now_ms();
  CompileOutput out;
  try {
    out = c.compile(in);
  } catch (const CompileFailure& f) {
    std::string saved = save_failed(cache_dir, key, in, f.log);
    RTC_FAIL(RTC_ERR_COMPILE, "compile of " + key.file_name() + " failed for arch " + in.arch + " with " +
                                  c.id() + "; source saved in " + saved + "\nkey:\n" + key.text() +
                                  "compiler log:\n" + f.log);
  }
  *ms = now_ms() - t0;
  RTC_CHECK(!out.binary.empty(), RTC_ERR_COMPILE, c.id() + " returned an empty code object for " + key.file_name());
  log_line("compile " + key.file_name() + " with " + c.id() + ": " + fmt_ms(*ms));
  return out;
}

bool from_system_dirs(const CacheKey& key, std::string* blob, std::string* path) {
  for (const std::string& dir : system_cache_dirs()) {
    std::string why;
    if (!dir_trusted(dir, true, &why)) {
      warn_once("sysdir:" + dir, "system cache dir " + dir + " is not loaded from because " + why);
      continue;
    }
    if (read_entry(dir, key, false, blob)) {
      *path = dir + "/" + key.file_name();
      return true;
    }
  }
  return false;
}

void read_log(Program* p) {
  std::string err;
  if (!read_file(p->path + ".log", &p->log, &err)) p->log.clear();
}

// Disk chain for one key; fills blob/path/origin and compile_ms.
void find_or_compile(const CacheKey& key, const CompileInput& in, const Compiler& c,
                     const std::string& dir, Program* p, rtc_build_result* out) {
  bool rebuild = knob_bool("REBUILD");
  bool usable = prepare_user_dir(dir);
  std::string name = key.file_name();
  out->origin = RTC_FROM_USER_CACHE;
  if (usable && !rebuild && read_entry(dir, key, true, &p->binary)) {
    p->path = dir + "/" + name;
    return read_log(p);
  }
  out->origin = RTC_FROM_SYSTEM_CACHE;
  if (!rebuild && from_system_dirs(key, &p->binary, &p->path)) return read_log(p);
  // Another process may be compiling this key: wait for it, then look again before compiling.
  std::unique_ptr<KeyLock> lock;
  if (usable) lock = std::make_unique<KeyLock>(dir, name);
  out->origin = RTC_FROM_USER_CACHE;
  if (usable && !rebuild && read_entry(dir, key, true, &p->binary)) {
    p->path = dir + "/" + name;
    return read_log(p);
  }
  out->origin = RTC_FROM_COMPILE;
  CompileOutput built = compile_now(key, in, c, dir, &out->compile_ms);
  p->binary = std::move(built.binary);
  p->log = std::move(built.log);
  if (usable) p->path = write_entry(dir, key, p->binary);
  // The log is a convenience beside the entry (resource reports), not part of its checked content.
  std::string err;
  if (!p->path.empty()) write_file_atomic(p->path + ".log", p->log, &err);
}

void copy_text(char* dst, size_t n, const std::string& s) {
  std::strncpy(dst, s.c_str(), n - 1);
  dst[n - 1] = '\0';
}

}  // namespace

void build_program(const rtc_build_request& req, const char* cache_dir, rtc_build_result* out) {
  double t0 = now_ms();
  std::memset(out, 0, sizeof *out);
  CompileInput in = make_input(req);
  const Compiler& c = select_compiler(req.compiler ? req.compiler : "auto", in.arch);
  CacheKey key = make_key(req, in, c);
  std::string dir = user_cache_dir(cache_dir), name = key.file_name();
  // The map is per cache dir too: `warm --cache-dir D` must write D even when this process
  // already built the same key for another dir.
  std::string digest = key.digest() + "\n" + dir;
  Store& s = store();
  uint64_t handle = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.by_digest.find(digest);
    if (it != s.by_digest.end()) handle = it->second;
  }
  if (handle) {
    out->origin = RTC_FROM_MEMORY;
  } else {
    Program p;
    p.key = key;
    p.kernel_symbol = in.kernel_symbol;
    find_or_compile(key, in, c, dir, &p, out);
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.by_digest.find(digest);  // a racing thread may have stored it meanwhile
    if (it != s.by_digest.end()) {
      handle = it->second;
    } else {
      s.programs.push_back(std::move(p));
      handle = s.programs.size();
      s.by_digest[digest] = handle;
    }
  }
  const Program& p = get_program(handle);
  out->program = handle;
  out->size = p.binary.size();
  copy_text(out->path, sizeof out->path, p.path);
  copy_text(out->compiler_id, sizeof out->compiler_id, c.id());
  copy_text(out->cache_name, sizeof out->cache_name, name);
  out->total_ms = now_ms() - t0;
  static const char* origins[] = {"compiled", "memory", "user cache", "system cache"};
  log_line("lookup " + name + ": " + origins[out->origin] + (p.path.empty() ? "" : " " + p.path) +
           " (" + fmt_ms(out->total_ms) + ")");
}

const Program& get_program(uint64_t handle) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  RTC_CHECK(handle >= 1 && handle <= s.programs.size(), RTC_ERR_ARG,
            "program handle " + std::to_string(handle) + " is not known; handles come from rtc_build");
  return s.programs[handle - 1];
}

void* program_function(uint64_t handle, Loader& loader, int device) {
  const Program& p = get_program(handle);
  std::string slot = std::to_string(handle) + "/" + loader.vendor() + "/" + std::to_string(device);
  Store& s = store();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.loaded.find(slot);
    if (it != s.loaded.end()) return it->second.fn;
  }
  // Loading happens outside the store lock (it may take milliseconds); a racing duplicate load
  // of the same module only wastes a little memory.
  double t0 = now_ms();
  Loaded l;
  l.module = loader.load(device, p.binary);
  l.fn = loader.function(device, l.module, p.kernel_symbol);
  log_line("load " + p.key.file_name() + " on " + loader.vendor() + ":" + std::to_string(device) +
           " (" + fmt_ms(now_ms() - t0) + ")");
  std::lock_guard<std::mutex> lock(s.mu);
  return s.loaded.emplace(slot, l).first->second.fn;
}

void launch_program(uint64_t handle, const rtc_launch_config* cfg, const void* params, size_t size) {
  RTC_CHECK(cfg && cfg->vendor, RTC_ERR_ARG,
            "rtc_launch_config (or its vendor) is null; vendor accepted: hip, cuda, host");
  RTC_CHECK(params || size == 0, RTC_ERR_ARG, "params is null with params_size=" + std::to_string(size));
  for (int i = 0; i < 3; ++i)
    RTC_CHECK(cfg->grid[i] >= 1 && cfg->block[i] >= 1, RTC_ERR_ARG,
              "grid and block sizes must be >= 1 in x, y and z; got grid[" + std::to_string(i) + "]=" +
                  std::to_string(cfg->grid[i]) + ", block[" + std::to_string(i) +
                  "]=" + std::to_string(cfg->block[i]));
  Loader& loader = get_loader(cfg->vendor);
  void* fn = program_function(handle, loader, cfg->device);
  RTC_CHECK(cfg->n_ranges >= 0 && (cfg->n_ranges == 0 || cfg->ranges), RTC_ERR_ARG,
            "rtc_launch_config.n_ranges=" + std::to_string(cfg->n_ranges) + " with ranges=null");
  LaunchDims d{{cfg->grid[0], cfg->grid[1], cfg->grid[2]}, {cfg->block[0], cfg->block[1], cfg->block[2]},
               cfg->shared_bytes, cfg->ranges, cfg->n_ranges};
  loader.launch(cfg->device, fn, d, cfg->stream, params, size);
}

}  // namespace rtc
