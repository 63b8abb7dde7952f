// The C ABI: every entry point catches every exception and turns it into a status + rtc_last_error().
#include "rtc_abi.h"
#include "common.h"
#include "disk_cache.h"
#include "dynlib.h"
#include "info.h"
#include "knobs.h"
#include "loader.h"
#include "op_registry.h"
#include "program.h"
#include "sha256.h"
#include <cstring>
#include <new>

using namespace rtc;

namespace {

thread_local std::string g_last_error;

template <typename F>
int guarded(F&& body) {
  try {
    body();
    return RTC_OK;
  } catch (const RtcError& e) {
    g_last_error = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory";
    return RTC_ERR_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return RTC_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return RTC_ERR_INTERNAL;
  }
}

void need(const void* p, const char* name) {
  RTC_CHECK(p != nullptr, RTC_ERR_ARG, std::string(name) + " is null; a valid pointer is required");
}

// Copies s into buf (NUL-terminated); RTC_ERR_ARG when it does not fit.
void copy_out(const std::string& s, char* buf, size_t n, const char* what) {
  need(buf, "buf");
  RTC_CHECK(s.size() < n, RTC_ERR_ARG,
            std::string(what) + " needs " + std::to_string(s.size() + 1) + " bytes; buffer has " + std::to_string(n));
  std::memcpy(buf, s.c_str(), s.size() + 1);
}

// Writes s into buf (truncated to n, NUL-ended) and its full length into *len: callers ask once with
// n = 0 for the size. Also used for other text of unbounded length (a program's path).
void json_out(const std::string& s, char* buf, size_t n, size_t* len) {
  if (len) *len = s.size();
  if (buf && n > 0) {
    const size_t k = s.size() < n - 1 ? s.size() : n - 1;
    std::memcpy(buf, s.data(), k);
    buf[k] = '\0';
  }
}

}  // namespace

extern "C" {

const char* rtc_last_error(void) { return g_last_error.c_str(); }
const char* rtc_version(void) { return version(); }

int rtc_knob_get(const char* name, char* buf, size_t n) {
  return guarded([&] {
    need(name, "name");
    copy_out(knob_text(name), buf, n, name);
  });
}

int rtc_set_package_cache_dir(const char* dir) {
  return guarded([&] { set_package_cache_dir(dir ? dir : ""); });
}

int rtc_add_library_dir(const char* dir) {
  return guarded([&] {
    need(dir, "dir");
    add_library_dir(dir);
  });
}

int rtc_sha256_hex(const void* data, size_t n, char out[65]) {
  return guarded([&] {
    need(out, "out");
    RTC_CHECK(data || n == 0, RTC_ERR_ARG, "data is null with n=" + std::to_string(n));
    copy_out(sha256_hex(data, n), out, 65, "sha256");
  });
}

int rtc_build(const rtc_build_request* req, const char* cache_dir, rtc_build_result* out) {
  return guarded([&] {
    need(req, "req");
    need(out, "out");
    build_program(*req, cache_dir, out);
  });
}

int rtc_program_bytes(uint64_t program, const void** data, size_t* size) {
  return guarded([&] {
    need(data, "data");
    need(size, "size");
    std::shared_ptr<const Code> code = program_code(program);  // replaced code stays alive: see Program
    *data = code->binary.data();
    *size = code->binary.size();
  });
}

int rtc_program_log(uint64_t program, const char** text, size_t* size) {
  return guarded([&] {
    need(text, "text");
    need(size, "size");
    std::shared_ptr<const Code> code = program_code(program);
    *text = code->log.c_str();
    *size = code->log.size();
  });
}

int rtc_program_path(uint64_t program, char* buf, size_t n, size_t* len) {
  return guarded([&] { json_out(program_code(program)->path, buf, n, len); });
}

int rtc_cache_check_entry(const void* data, size_t n, const char* key_text, char* why, size_t why_n, int* valid) {
  return guarded([&] {
    need(key_text, "key_text");
    need(valid, "valid");
    RTC_CHECK(data || n == 0, RTC_ERR_ARG, "data is null with n=" + std::to_string(n));
    std::string blob, bytes(static_cast<const char*>(data), n);
    std::string reason = parse_entry(bytes, key_text, &blob);
    *valid = reason.empty() ? 1 : 0;
    json_out(reason, why, why_n, nullptr);
  });
}

int rtc_info_json(char* buf, size_t n, size_t* len) {
  return guarded([&] { json_out(info_json(), buf, n, len); });
}

int rtc_cache_clear(const char* dir, int* removed) {
  return guarded([&] {
    int r = clear_dir(user_cache_dir(dir));
    if (removed) *removed = r;
  });
}

int rtc_cache_prepare(const char* dir, char* buf, size_t n, size_t* len) {
  return guarded([&] { json_out(user_dir_problem(user_cache_dir(dir)), buf, n, len); });
}

int rtc_device_count(const char* vendor, int* count) {
  return guarded([&] {
    need(vendor, "vendor");
    need(count, "count");
    *count = get_loader(vendor).device_count();
  });
}

int rtc_launch(uint64_t program, const rtc_launch_config* cfg, const void* params, size_t params_size) {
  return guarded([&] { launch_program(program, cfg, params, params_size); });
}

int rtc_ops_json(char* buf, size_t n, size_t* len) {
  return guarded([&] { json_out(ops_json(), buf, n, len); });
}

int rtc_op_supports(const char* op, const char* kernel, const void* args, size_t args_size, const char* vendor,
                    char* why, size_t n, int* ok) {
  return guarded([&] {
    need(op, "op");
    need(kernel, "kernel");
    need(vendor, "vendor");
    need(ok, "ok");
    const OpHost& o = find_op(op);
    const KernelHost& k = find_kernel(o, kernel);
    const std::string reason = k.why_not(checked_args(o, args, args_size), vendor);
    *ok = reason.empty() ? 1 : 0;
    if (why && n > 0) {  // the reason is advisory: truncate rather than fail
      const size_t m = reason.size() < n - 1 ? reason.size() : n - 1;
      std::memcpy(why, reason.data(), m);
      why[m] = '\0';
    }
  });
}

int rtc_op_workspace_bytes(const char* op, const char* kernel, const void* args, size_t args_size, int64_t* bytes) {
  return guarded([&] {
    need(op, "op");
    need(kernel, "kernel");
    need(bytes, "bytes");
    const OpHost& o = find_op(op);
    *bytes = find_kernel(o, kernel).workspace_bytes(checked_args(o, args, args_size));
  });
}

int rtc_op_plan_json(const char* op, const char* kernel, const void* args, size_t args_size, char* buf, size_t n,
                     size_t* len) {
  return guarded([&] {
    need(op, "op");
    need(kernel, "kernel");
    const OpHost& o = find_op(op);
    json_out(find_kernel(o, kernel).plan_json(checked_args(o, args, args_size)), buf, n, len);
  });
}

int rtc_op_launch(uint64_t program, const char* op, const char* kernel, const void* args, size_t args_size,
                  const char* vendor, int device, void* stream) {
  return guarded([&] {
    need(op, "op");
    need(kernel, "kernel");
    need(vendor, "vendor");
    const OpHost& o = find_op(op);
    const KernelHost& k = find_kernel(o, kernel);
    const void* a = checked_args(o, args, args_size);
    const std::string why = k.why_not(a, vendor);
    RTC_CHECK(why.empty(), RTC_ERR_ARG, why);
    k.launch(program, a, LaunchTarget{vendor, device, stream});
  });
}

}  // extern "C"
