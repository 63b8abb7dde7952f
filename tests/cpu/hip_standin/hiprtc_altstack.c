/* A stand-in libhiprtc whose compile does what hipRTC 5.2 does to threads: comgr compiles on a thread of its
 * own, where LLVM (RemoveFileOnSignal -> RegisterHandlers) installs an alternate signal stack that it
 * mallocs and never frees, whenever the thread's stack is smaller than LLVM wants (MINSIGSTKSZ + 64 KiB,
 * MINSIGSTKSZ being the CPU's signal frame size under glibc >= 2.34). Here it is replaced whatever its size,
 * so what follows does not depend on the CPU. The compile then fails (no code object): all a test of thread
 * handling needs.
 * Build: gcc -shared -fPIC -o libhiprtc.so hiprtc_altstack.c -lpthread */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static void* compile_thread(void* unused) {
  (void)unused;
  stack_t mine;
  memset(&mine, 0, sizeof mine);
  mine.ss_size = 79040;
  mine.ss_sp = (char*)malloc(mine.ss_size + 64) + 48; /* like a heap block: not page-aligned */
  sigaltstack(&mine, NULL);                           /* and never freed, as LLVM does */
  return NULL;
}

const char* hiprtcGetErrorString(int rc) { return rc ? "HIPRTC_ERROR_COMPILATION (stand-in)" : "HIPRTC_SUCCESS"; }

int hiprtcCreateProgram(void** prog, const char* src, const char* name, int n, const char* const* headers,
                        const char* const* names) {
  (void)src, (void)name, (void)n, (void)headers, (void)names;
  *prog = malloc(1);
  return 0;
}

int hiprtcCompileProgram(void* prog, int n, const char* const* opts) {
  (void)prog, (void)n, (void)opts;
  pthread_t t;
  if (pthread_create(&t, NULL, compile_thread, NULL) == 0) pthread_join(t, NULL);
  return 6; /* HIPRTC_ERROR_COMPILATION */
}

int hiprtcGetProgramLogSize(void* prog, size_t* n) {
  (void)prog;
  *n = sizeof "stand-in: no code";
  return 0;
}

int hiprtcGetProgramLog(void* prog, char* log) {
  (void)prog;
  strcpy(log, "stand-in: no code");
  return 0;
}

int hiprtcGetCodeSize(void* prog, size_t* n) {
  (void)prog;
  *n = 0;
  return 6;
}

int hiprtcGetCode(void* prog, char* code) {
  (void)prog, (void)code;
  return 6;
}

int hiprtcDestroyProgram(void** prog) {
  free(*prog);
  *prog = NULL;
  return 0;
}
