// The program store and the build chain: memory map, user cache, system caches, compile.
#include "program.h"
#include "common.h"
#include "disk_cache.h"
#include "fsutil.h"
#include "knobs.h"
#include <cstring>
#include <sys/stat.h>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

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
  std::vector<std::shared_ptr<const Code>> retired;  // replaced code: its bytes may still be in use
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

// Where a failing source is saved: a fresh private dir (mkdtemp: new, 0700, ours), so nothing
// planted beforehand can redirect the writes. Under <cache dir>/failed/ when the cache dir is in
// use, else under TMPDIR: a dir refused as untrusted is never written to.
std::string failed_dir(const std::string& cache_dir, bool usable, const std::string& stem, std::string* err) {
  std::string parent = cache_dir + "/failed", why;
  if (usable && make_dirs(parent, 0700, err) && dir_trusted(parent, false, &why)) {
    std::string dir = make_private_dir(parent, stem + "-", err);
    if (!dir.empty()) return dir;
  }
  return make_private_dir(temp_base(), product() + "-failed-" + stem + "-", err);
}

// Keeps the failing source so the error can point at something to rerun.
std::string save_failed(const std::string& cache_dir, bool usable, const CacheKey& key, const CompileInput& in,
                        const std::string& log) {
  std::string name = key.file_name(), err;
  std::string dir = failed_dir(cache_dir, usable, name.substr(0, name.size() - 3), &err);
  if (dir.empty()) return "(nowhere: no private dir could be made in TMPDIR=" + temp_base() + ": " + err + ")";
  std::vector<SourceText> all = in.headers;
  all.push_back(in.main);
  for (const SourceText& s : all) {
    if (!safe_relative_name(s.name)) continue;
    size_t slash = s.name.rfind('/');
    if (slash != std::string::npos) make_dirs(dir + "/" + s.name.substr(0, slash), 0700, &err);
    write_file(dir + "/" + s.name, s.text, &err);  // new files only: a duplicate name keeps the first
  }
  write_file(dir + "/build.txt", key.text() + "\n" + log, &err);
  return dir;
}

// blocked: what the NO_COMPILE error says when this compile is refused.
CompileOutput compile_now(const CacheKey& key, const CompileInput& in, const Compiler& c, const std::string& cache_dir,
                          bool usable, const std::string& blocked, double* ms) {
  RTC_CHECK(!knob_bool("NO_COMPILE"), RTC_ERR_NO_COMPILE, blocked + "; key:\n" + key.text());
  double t0 = now_ms();
  CompileOutput out;
  try {
    out = c.compile(in);
  } catch (const CompileFailure& f) {
    std::string saved = save_failed(cache_dir, usable, key, in, f.log);
    RTC_FAIL(RTC_ERR_COMPILE, "compile of " + key.file_name() + " failed for arch " + in.arch + " with " + c.id() +
                                  "; source saved in " + saved + "\nkey:\n" + key.text() + "compiler log:\n" + f.log);
  }
  *ms = now_ms() - t0;
  std::string bad = code_object_problem(in.arch, out.binary);
  RTC_CHECK(bad.empty(), RTC_ERR_COMPILE,
            c.id() + " reported success for " + key.file_name() + " but wrote no code object for arch " + in.arch +
                ": " + bad + "; nothing was cached");
  log_line("compile " + key.file_name() + " with " + c.id() + ": " + fmt_ms(*ms));
  return out;
}

std::string not_cached_text(const CacheKey& key, const std::string& dir) {
  return knob_env_name("NO_COMPILE") + "=1 but " + key.file_name() + " is not in any cache (user dir " + dir + ")";
}

std::string rebuild_forbidden_text(const CacheKey& key) {
  return knob_env_name("REBUILD") + "=1 asks for a compile of " + key.file_name() + " that " +
         knob_env_name("NO_COMPILE") + "=1 forbids; unset one of them";
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

// The log is text handed back to the caller (BuildResult.log()), so it is read under the entry's own rules: a
// link or another user's file in its place must not hand over somebody else's file. Missing is no error.
void read_log(Code* code) {
  std::string path = code->path + ".log";
  struct stat st{};
  code->log.clear();
  if (lstat(path.c_str(), &st) != 0) return;
  std::string why = read_trusted_file(path, st, &code->log);
  if (why.empty()) return;
  code->log.clear();
  warn_once("log:" + path, "compiler log " + path + " is not read (" + why + ")");
}

// Writes a fresh compile into the user dir (when usable): the entry, and its log beside it.
void keep(const std::string& dir, bool usable, const CacheKey& key, Code* code) {
  if (usable) code->path = write_entry(dir, key, code->binary);
  // The log is a convenience beside the entry (resource reports), not part of its checked content.
  std::string err;
  if (!code->path.empty()) write_file_atomic(code->path + ".log", code->log, &err);
}

bool from_user_dir(const std::string& dir, const CacheKey& key, Code* code) {
  if (!read_entry(dir, key, true, &code->binary)) return false;
  code->path = dir + "/" + key.file_name();
  code->origin = RTC_FROM_USER_CACHE;
  read_log(code);
  return true;
}

// Disk chain for one key; fills code and compile_ms.
void find_or_compile(const CacheKey& key, const CompileInput& in, const Compiler& c, const std::string& dir,
                     bool rebuild, Code* code, double* compile_ms) {
  bool usable = prepare_user_dir(dir);
  if (usable && !rebuild && from_user_dir(dir, key, code)) return;
  code->origin = RTC_FROM_SYSTEM_CACHE;
  if (!rebuild && from_system_dirs(key, &code->binary, &code->path)) return read_log(code);
  // Another process may be compiling this key: wait for it, then look again before compiling.
  std::unique_ptr<KeyLock> lock;
  if (usable) lock = std::make_unique<KeyLock>(dir, key.file_name());
  if (usable && !rebuild && from_user_dir(dir, key, code)) return;
  code->origin = RTC_FROM_COMPILE;
  std::string blocked = rebuild ? rebuild_forbidden_text(key) : not_cached_text(key, dir);
  CompileOutput built = compile_now(key, in, c, dir, usable, blocked, compile_ms);
  code->binary = std::move(built.binary);
  code->log = std::move(built.log);
  keep(dir, usable, key, code);
}

// A cached entry can pass every check and still not load (a compiler that wrote a broken object
// and exited 0). Such a program is compiled once more: when the fresh bytes differ, they replace
// the entry (in the user dir; a system dir's entry is shadowed by the user dir's) and are tried
// instead. Same bytes mean the entry is not at fault (a device error): the caller gets the error.
// Returns whether there is new code to try.
bool rebuild_after_load_failure(uint64_t handle, const std::shared_ptr<const Code>& failed, const std::string& why) {
  static std::mutex rebuild_mu;  // one rebuild per program, by whichever thread fails first
  std::lock_guard<std::mutex> guard(rebuild_mu);
  Store& s = store();
  Program* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    p = &s.programs[handle - 1];
    if (p->code != failed) return true;  // another thread rebuilt it meanwhile: load that
    if (p->rebuilt || failed->origin == RTC_FROM_COMPILE) return false;
    p->rebuilt = true;
  }
  // key, input, compiler and cache_dir never change once the program is stored.
  bool usable = prepare_user_dir(p->cache_dir);
  auto code = std::make_shared<Code>();
  std::unique_ptr<KeyLock> lock;
  if (usable) lock = std::make_unique<KeyLock>(p->cache_dir, p->key.file_name());
  std::string blocked = failed->path + " failed to load (" + why + ") and " + knob_env_name("NO_COMPILE") +
                        "=1 forbids compiling it again";
  double ms = 0;
  CompileOutput built = compile_now(p->key, p->input, *p->compiler, p->cache_dir, usable, blocked, &ms);
  if (built.binary == failed->binary) return false;
  code->binary = std::move(built.binary);
  code->log = std::move(built.log);
  keep(p->cache_dir, usable, p->key, code.get());
  warn("cache entry " + failed->path + " failed to load (" + why + "); compiled it again" +
       (code->path.empty() ? "" : " into " + code->path));
  std::lock_guard<std::mutex> lock_store(s.mu);
  s.retired.push_back(p->code);
  p->code = code;
  return true;
}

void copy_text(char* dst, size_t n, const std::string& s) {
  std::strncpy(dst, s.c_str(), n - 1);
  dst[n - 1] = '\0';
}

Loaded load(const Code& code, const std::string& symbol, Loader& loader, int device) {
  Loaded l;
  l.module = loader.load(device, code.binary);
  l.fn = loader.function(device, l.module, symbol);
  return l;
}

}  // namespace

void build_program(const rtc_build_request& req, const char* cache_dir, rtc_build_result* out) {
  double t0 = now_ms();
  std::memset(out, 0, sizeof *out);
  // Read deep in the chain (a compiler's --version probe, a lock wait): checked first, so that a bad value
  // is the caller's error naming the knob, not a compiler that looks unavailable.
  knob_int("COMPILE_TIMEOUT");
  knob_int("LOCK_TIMEOUT");
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
    auto code = std::make_shared<Code>();
    find_or_compile(key, in, c, dir, knob_bool("REBUILD"), code.get(), &out->compile_ms);
    out->origin = code->origin;
    p.code = code;
    p.input = std::move(in);
    p.compiler = &c;
    p.cache_dir = dir;
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
  std::shared_ptr<const Code> code = program_code(handle);
  out->program = handle;
  out->size = code->binary.size();
  copy_text(out->path, sizeof out->path, code->path);  // may be cut: rtc_program_path has all of it
  copy_text(out->compiler_id, sizeof out->compiler_id, c.id());
  copy_text(out->cache_name, sizeof out->cache_name, name);
  out->total_ms = now_ms() - t0;
  static const char* origins[] = {"compiled", "memory", "user cache", "system cache"};
  log_line("lookup " + name + ": " + origins[out->origin] + (code->path.empty() ? "" : " " + code->path) + " (" +
           fmt_ms(out->total_ms) + ")");
}

const Program& get_program(uint64_t handle) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  RTC_CHECK(handle >= 1 && handle <= s.programs.size(), RTC_ERR_ARG,
            "program handle " + std::to_string(handle) + " is not known; handles come from rtc_build");
  return s.programs[handle - 1];
}

std::shared_ptr<const Code> program_code(uint64_t handle) {
  const Program& p = get_program(handle);
  std::lock_guard<std::mutex> lock(store().mu);
  return p.code;
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
  std::shared_ptr<const Code> code = program_code(handle);
  Loaded l;
  try {
    l = load(*code, p.kernel_symbol, loader, device);
  } catch (const RtcError& e) {
    if (e.status() != RTC_ERR_LOAD || !rebuild_after_load_failure(handle, code, e.what())) throw;
    l = load(*program_code(handle), p.kernel_symbol, loader, device);
  }
  log_line("load " + p.key.file_name() + " on " + loader.vendor() + ":" + std::to_string(device) + " (" +
           fmt_ms(now_ms() - t0) + ")");
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
                  std::to_string(cfg->grid[i]) + ", block[" + std::to_string(i) + "]=" + std::to_string(cfg->block[i]));
  Loader& loader = get_loader(cfg->vendor);
  void* fn = program_function(handle, loader, cfg->device);
  RTC_CHECK(cfg->n_ranges >= 0 && (cfg->n_ranges == 0 || cfg->ranges), RTC_ERR_ARG,
            "rtc_launch_config.n_ranges=" + std::to_string(cfg->n_ranges) + " with ranges=null");
  LaunchDims d{{cfg->grid[0], cfg->grid[1], cfg->grid[2]},
               {cfg->block[0], cfg->block[1], cfg->block[2]},
               cfg->shared_bytes,
               cfg->ranges,
               cfg->n_ranges};
  loader.launch(cfg->device, fn, d, cfg->stream, params, size);
}

}  // namespace rtc
