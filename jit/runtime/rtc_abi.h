// The C ABI of the JIT runtime: what the Python layer (ctypes) calls. No torch, no ROCm, no CUDA types, no op names.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RTC_API __attribute__((visibility("default")))

// Every function returns 0 on success; on failure a non-zero code and rtc_last_error() holds the
// message (thread-local, valid until the next failing call of this thread).
enum rtc_status {
  RTC_OK = 0,
  RTC_ERR_ARG = 1,
  RTC_ERR_COMPILE = 2,
  RTC_ERR_LOAD = 3,
  RTC_ERR_LAUNCH = 4,
  RTC_ERR_NO_COMPILE = 5,
  RTC_ERR_UNAVAILABLE = 6,
  RTC_ERR_INTERNAL = 7
};

typedef struct rtc_source {
  const char* name;   // include name, e.g. "platform.h" or "baseline.hip"
  const char* text;
} rtc_source;

typedef struct rtc_build_request {
  const char* op;               // the manifest's op name (part of the file name and key)
  const char* variant;          // readable variant for the file name, e.g. "baseline-rtne-none-dense-d128"
  const char* arch;             // gfx942 | gfx90a | gfx950 | sm_80 | sm_90a | gfx942-emu | gfx90a-emu
  const char* compiler;         // "auto" | "clang" | "clang22" | "hiprtc" | "nvrtc" | "host" or a ','-list
  const char* kernel_symbol;    // extern "C" kernel name
  rtc_source main;              // the kernel source
  const rtc_source* headers;    // every header it may include, by include name
  int n_headers;
  const char* const* options;   // -D defines and per-arch flags from the manifest
  int n_options;
  const char* package_version;  // part of the cache key
} rtc_build_request;

enum rtc_origin { RTC_FROM_COMPILE = 0, RTC_FROM_MEMORY = 1, RTC_FROM_USER_CACHE = 2, RTC_FROM_SYSTEM_CACHE = 3 };

typedef struct rtc_build_result {
  uint64_t program;         // opaque handle, valid for the life of the process
  char path[1024];          // cache file ("" when only in memory); cut at 1023 bytes: rtc_program_path has it whole
  char compiler_id[64];     // e.g. "clang19", "hiprtc5.2", "nvrtc13.0", "gcc12"
  char cache_name[256];     // readable file name: op-variant-arch-compiler-<8 hex>.co
  double compile_ms;        // 0 unless compiled now
  double total_ms;          // lookup + compile/load
  int origin;               // rtc_origin
  uint64_t size;            // code-object bytes
} rtc_build_result;

RTC_API const char* rtc_last_error(void);
RTC_API const char* rtc_version(void);

// Environment knobs are declared once, in the runtime (knobs.cpp), typed and checked. The value of
// knob `name` (the full variable name, e.g. "<PRODUCT>_EMULATE") as text, "" when unset; RTC_ERR_ARG with a
// message naming the variable when its value is malformed or the name is not a declared knob.
RTC_API int rtc_knob_get(const char* name, char* buf, size_t n);
// The read-only cache dir shipped inside the installed package (the Python layer sets it once at
// import); searched after $<PRODUCT>_SYSTEM_CACHE.
RTC_API int rtc_set_package_cache_dir(const char* dir);

// Key -> in-process map -> user cache -> system caches -> compile (honours the env knobs).
// cache_dir, when non-null, overrides the user cache dir for this call (warm --cache-dir).
RTC_API int rtc_build(const rtc_build_request* req, const char* cache_dir, rtc_build_result* out);
// The code object's bytes (owned by the runtime).
RTC_API int rtc_program_bytes(uint64_t program, const void** data, size_t* size);

// JSON text describing compilers found (with versions), loaders, GPUs, cache dirs and entries.
// Written into buf (truncated to n); returns the full length via *len.
RTC_API int rtc_info_json(char* buf, size_t n, size_t* len);
// Removes the files the runtime wrote into the user cache dir (or dir when non-null); *removed counts them.
// A dir the runtime would not use is refused (RTC_ERR_ARG).
RTC_API int rtc_cache_clear(const char* dir, int* removed);
// Makes the user cache dir (or dir when non-null) as the first compile would and writes why it is unusable
// into buf ("" when usable; truncated to n, full length via *len), so a tool can refuse before compiling.
RTC_API int rtc_cache_prepare(const char* dir, char* buf, size_t n, size_t* len);

// Loader side. vendor: "hip", "cuda" or "host". Returns the number of devices (0 when the driver
// library is absent), never an error for a missing driver.
RTC_API int rtc_device_count(const char* vendor, int* count);

// A global-memory range a launch may touch: the emulator checks every global access against the
// launch's ranges (kernel, lane, address on a miss); GPU loaders ignore them.
typedef struct rtc_mem_range {
  const void* base;
  uint64_t bytes;
} rtc_mem_range;

typedef struct rtc_launch_config {
  const char* vendor;          // "hip" | "cuda" | "host"
  int device;                  // ordinal
  void* stream;                // hipStream_t / CUstream; null = default stream
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;       // dynamic shared memory
  const rtc_mem_range* ranges; // the tensors of the launch; on the emulator none means no valid global memory
  int n_ranges;
} rtc_launch_config;

// Loads the program on the device (once per device) and launches its kernel with one by-value
// parameter block (params, params_size bytes). Asynchronous on GPUs; synchronous on "host".
RTC_API int rtc_launch(uint64_t program, const rtc_launch_config* cfg, const void* params, size_t params_size);

// ---- ops: host code registered by each op (jit/ops/<op>/), reached by name ----
// Every registered op as JSON: {op: {"args_size": N, "fields": [{"name", "offset", "kind", "count"}],
// "kernels": [names]}}. The Python layer builds each op's argument block from this description.
RTC_API int rtc_ops_json(char* buf, size_t n, size_t* len);
// Whether kernel `kernel` of `op` takes these runtime arguments on vendor (pointer alignment, strides,
// sizes): *ok = 1, or *ok = 0 with the reason in why (truncated to n bytes, NUL-ended). Needs no
// device: dispatch asks each candidate kernel in the manifest's order and falls back.
RTC_API int rtc_op_supports(const char* op, const char* kernel, const void* args, size_t args_size, const char* vendor,
                            char* why, size_t n, int* ok);
// Scratch bytes the kernel needs for these arguments (the caller allocates and passes them in args).
RTC_API int rtc_op_workspace_bytes(const char* op, const char* kernel, const void* args, size_t args_size,
                                   int64_t* bytes);
// The kernel's launch plan for these arguments as JSON (grids, splits, workspace), with the knobs
// applied as a launch would apply them.
RTC_API int rtc_op_plan_json(const char* op, const char* kernel, const void* args, size_t args_size, char* buf,
                             size_t n, size_t* len);
// Launches `program` (built from the kernel's source) for these arguments on (vendor, device, stream).
RTC_API int rtc_op_launch(uint64_t program, const char* op, const char* kernel, const void* args, size_t args_size,
                          const char* vendor, int device, void* stream);

// Adds a dir searched for vendor libraries (libnvrtc, libhiprtc, libamdhip64, libcuda); a
// site-packages dir also brings its pip wheel dirs nvidia/*/lib.
RTC_API int rtc_add_library_dir(const char* dir);
// SHA-256 of n bytes as 64 hex digits + NUL in out (the runtime's own implementation, for tests).
RTC_API int rtc_sha256_hex(const void* data, size_t n, char out[65]);
// The compiler log of a program (NVRTC: the ptxas -v register/spill report); "" when unknown
// (an entry cached without its .log file). Owned by the runtime.
RTC_API int rtc_program_log(uint64_t program, const char** text, size_t* size);
// The program's cache file, whole ("" when held in memory only), written into buf (truncated to n,
// NUL-ended); *len gets its full length, so a first call with n = 0 asks for the size.
RTC_API int rtc_program_path(uint64_t program, char* buf, size_t n, size_t* len);
// For tests, like rtc_sha256_hex: the cache's entry parser on n bytes, as the entry of key_text.
// *valid = 1 when it would be accepted, else 0 with the reason in why (truncated to why_n bytes).
RTC_API int rtc_cache_check_entry(const void* data, size_t n, const char* key_text, char* why, size_t why_n,
                                  int* valid);
#ifdef __cplusplus
}
#endif
