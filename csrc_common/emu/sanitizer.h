// Sanitized kernels (RTCATTN_EMU_SANITIZE=1): an ASan or UBSan report says which work-item made it.
// The kernel object is deleted once loaded, so the report's frames in it are bare offsets; while a
// grid runs, the sanitizer runtimes' death callback adds "kernel, workgroup, wave, lane" to stderr
// and to the report file (log_path).
#pragma once
#include "workgroup.h"

#if RTC_EMU_ASAN
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

namespace rtc_emu {

// ASan and (GCC's) UBSan are two runtimes, each with its own death callback and report path.
struct SanRuntime {
  const char* name;
  void (*set_death_callback)(void (*)(void));
  const char* (*report_path)();
};
inline SanRuntime g_san[2] = {{"/libasan.so", nullptr, nullptr}, {"/libubsan.so", nullptr, nullptr}};
inline const char* g_san_kernel = nullptr;  // the kernel whose grid runs

inline int find_san_runtime(dl_phdr_info* info, size_t, void*) {
  for (SanRuntime& r : g_san) {
    if (r.set_death_callback || !info->dlpi_name || !strstr(info->dlpi_name, r.name)) continue;
    if (void* h = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD)) {
      r.set_death_callback = reinterpret_cast<void (*)(void (*)(void))>(dlsym(h, "__sanitizer_set_death_callback"));
      r.report_path = reinterpret_cast<const char* (*)()>(dlsym(h, "__sanitizer_get_report_path"));
      dlclose(h);
    }
  }
  return 0;
}

inline void san_context(const SanRuntime& r) {
  char line[512];
  const Fiber* f = t_cur;
  int n = f ? snprintf(line, sizeof line,
                       "rtc_emu: the sanitizer report above is from kernel %s, workgroup (%u,%u,%u), wave %d, "
                       "lane %d (thread %u,%u,%u)\n",
                       f->wg->kernel, f->wg->bid.x, f->wg->bid.y, f->wg->bid.z, f->wave, f->lane, f->tid.x, f->tid.y,
                       f->tid.z)
            : snprintf(line, sizeof line,
                       "rtc_emu: the sanitizer report above is from the emulator running "
                       "kernel %s, outside any work-item\n",
                       g_san_kernel ? g_san_kernel : "?");
  if (n <= 0) return;
  if (n >= (int)sizeof line) n = (int)sizeof line - 1;
  if (write(2, line, (size_t)n) < 0) return;
  const char* path = r.report_path ? r.report_path() : nullptr;
  if (!path || strcmp(path, "stderr") == 0 || strcmp(path, "stdout") == 0) return;
  int fd = open(path, O_WRONLY | O_APPEND);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) < 0) {}
  close(fd);
}
inline void san_died_asan() { san_context(g_san[0]); }
inline void san_died_ubsan() { san_context(g_san[1]); }

// Installs the callbacks for one grid, and takes them back after it (this object may be unloaded).
struct SanReportScope {
  explicit SanReportScope(const char* kernel) {
    g_san_kernel = kernel;
    if (!g_san[0].set_death_callback || !g_san[1].set_death_callback) dl_iterate_phdr(find_san_runtime, nullptr);
    if (g_san[0].set_death_callback) g_san[0].set_death_callback(san_died_asan);
    if (g_san[1].set_death_callback) g_san[1].set_death_callback(san_died_ubsan);
  }
  ~SanReportScope() {
    for (SanRuntime& r : g_san)
      if (r.set_death_callback) r.set_death_callback(nullptr);
  }
};

}  // namespace rtc_emu

#else
namespace rtc_emu {
struct SanReportScope {
  explicit SanReportScope(const char*) {}
};
}  // namespace rtc_emu
#endif
