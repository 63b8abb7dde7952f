/* A stand-in libamdhip64 for tests without an AMD GPU: every symbol the runtime's HIP loader binds
 * (jit/runtime/loader_hip.cpp), one device, and a record of what the loader hands over.
 *
 * $STANDIN_HIP_LOG names a dir (it must exist). Each call appends one JSON line to calls.jsonl;
 * hipModuleLoadData writes the code object to module<N>.co (size from the ELF section headers:
 * e_shoff + e_shnum * e_shentsize), hipModuleLaunchKernel the kernarg buffer to launch<N>.bin.
 * A launch must pass its arguments as HIP does for a raw buffer: kernelParams null and
 * extra = {HIP_LAUNCH_PARAM_BUFFER_POINTER (1), ptr, HIP_LAUNCH_PARAM_BUFFER_SIZE (2), &size,
 * HIP_LAUNCH_PARAM_END (3)}; anything else fails with hipErrorInvalidValue.
 * Build: gcc -shared -fPIC -o libamdhip64.so libamdhip64.c -lpthread */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidImage = 200,
  hipErrorInvalidHandle = 400
};

struct module {
  int id;
};
struct function {
  int id;
  int module;
  char symbol[256];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int current_device, n_modules, n_functions, n_launches;

/* Appends one record (a JSON object body without braces) to calls.jsonl. */
static void record(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void record(const char* fmt, ...) {
  const char* dir = getenv("STANDIN_HIP_LOG");
  char path[4096];
  if (!dir) return;
  snprintf(path, sizeof path, "%s/calls.jsonl", dir);
  FILE* f = fopen(path, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  fputc('{', f);
  vfprintf(f, fmt, ap);
  fputs("}\n", f);
  va_end(ap);
  fclose(f);
}

/* Writes n bytes to <log dir>/<name>; 0 on success. */
static int dump(const char* name, const void* data, size_t n) {
  const char* dir = getenv("STANDIN_HIP_LOG");
  char path[4096];
  if (!dir) return 0;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  if (!f) return -1;
  size_t wrote = fwrite(data, 1, n, f);
  return fclose(f) == 0 && wrote == n ? 0 : -1;
}

int hipInit(unsigned flags) {
  record("\"call\":\"hipInit\",\"flags\":%u", flags);
  return flags == 0 ? hipSuccess : hipErrorInvalidValue;
}

int hipGetDeviceCount(int* count) {
  if (!count) return hipErrorInvalidValue;
  *count = 1;
  record("\"call\":\"hipGetDeviceCount\",\"count\":1");
  return hipSuccess;
}

int hipGetDevice(int* device) {
  if (!device) return hipErrorInvalidValue;
  *device = current_device;
  record("\"call\":\"hipGetDevice\",\"device\":%d", current_device);
  return hipSuccess;
}

int hipSetDevice(int device) {
  record("\"call\":\"hipSetDevice\",\"device\":%d", device);
  if (device != 0) return hipErrorInvalidDevice;
  current_device = device;
  return hipSuccess;
}

const char* hipGetErrorString(int error) {
  switch (error) {
    case hipSuccess: return "hipSuccess (stand-in)";
    case hipErrorInvalidValue: return "hipErrorInvalidValue (stand-in)";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice (stand-in)";
    case hipErrorInvalidImage: return "hipErrorInvalidImage (stand-in)";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle (stand-in)";
    default: return "unknown error (stand-in)";
  }
}

int hipModuleLoadData(void** module, const void* image) {
  const unsigned char* e = image;
  if (!module || !e || memcmp(e, "\177ELF", 4) != 0 || e[4] != 2 /* ELFCLASS64 */) return hipErrorInvalidImage;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, e + 0x28, 8);
  memcpy(&shentsize, e + 0x3A, 2);
  memcpy(&shnum, e + 0x3C, 2);
  const size_t size = (size_t)(shoff + (uint64_t)shnum * shentsize);
  pthread_mutex_lock(&mu);
  struct module* m = malloc(sizeof *m);
  m->id = n_modules++;
  pthread_mutex_unlock(&mu);
  char name[64];
  snprintf(name, sizeof name, "module%d.co", m->id);
  if (dump(name, image, size) != 0) return hipErrorInvalidValue;
  record("\"call\":\"hipModuleLoadData\",\"module\":%d,\"file\":\"%s\",\"size\":%zu", m->id, name, size);
  *module = m;
  return hipSuccess;
}

int hipModuleGetFunction(void** function, void* module, const char* symbol) {
  if (!function || !module || !symbol || strlen(symbol) >= 256) return hipErrorInvalidValue;
  pthread_mutex_lock(&mu);
  struct function* f = malloc(sizeof *f);
  f->id = n_functions++;
  pthread_mutex_unlock(&mu);
  f->module = ((struct module*)module)->id;
  strcpy(f->symbol, symbol);  /* symbols are C identifiers: no JSON escaping needed */
  record("\"call\":\"hipModuleGetFunction\",\"function\":%d,\"module\":%d,\"symbol\":\"%s\"", f->id, f->module,
         f->symbol);
  *function = f;
  return hipSuccess;
}

int hipModuleLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared_bytes, void* stream, void** kernel_params, void** extra) {
  if (!function) return hipErrorInvalidHandle;
  if (kernel_params || !extra || extra[0] != (void*)1 || !extra[1] || extra[2] != (void*)2 || !extra[3] ||
      extra[4] != (void*)3) {
    record("\"call\":\"hipModuleLaunchKernel\",\"error\":\"kernelParams set or extra malformed\"");
    return hipErrorInvalidValue;
  }
  const size_t size = *(const size_t*)extra[3];
  pthread_mutex_lock(&mu);
  const int id = n_launches++;
  pthread_mutex_unlock(&mu);
  char name[64];
  snprintf(name, sizeof name, "launch%d.bin", id);
  if (dump(name, extra[1], size) != 0) return hipErrorInvalidValue;
  const struct function* f = function;
  record("\"call\":\"hipModuleLaunchKernel\",\"launch\":%d,\"function\":%d,\"symbol\":\"%s\",\"grid\":[%u,%u,%u],"
         "\"block\":[%u,%u,%u],\"shared_bytes\":%u,\"stream\":%llu,\"file\":\"%s\",\"size\":%zu",
         id, f->id, f->symbol, gx, gy, gz, bx, by, bz, shared_bytes, (unsigned long long)(uintptr_t)stream, name, size);
  return hipSuccess;
}
