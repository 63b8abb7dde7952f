// Runs an emulated grid: workgroups on host threads, each workgroup's fibers until all return.
// Plain pthreads and C headers, no C++ library header: every emulated kernel is one translation unit that includes
// this file, and the <thread> / <mutex> / <vector> / <memory> family took a quarter of each kernel's host compile.
#pragma once
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <new>
#include "launch_abi.h"
#include "global_ranges.h"
#include "sanitizer.h"
#include "workgroup.h"

namespace rtc_emu {

inline void start_workgroup(Workgroup* wg) {
  wg->done = wg->at_barrier = 0;
  wg->failed = false;
  ++wg->epoch;
  memset(wg->lds.bytes, 0xFF, kLdsBytes);  // poison: NaN as fp32 and bf16, -1 as integers
  for (int w = 0; w < wg->nwaves; ++w) {
    Wave& wave = wg->waves[w];
    const int left = wg->nthreads - w * kWaveLanes;
    wave.lanes = left < kWaveLanes ? left : kWaveLanes;
    wave.arrived = wave.at_barrier = wave.done = 0;
    wave.epoch = 0;
  }
  const unsigned bx = wg->bdim.x, bxy = wg->bdim.x * wg->bdim.y;
  for (int i = 0; i < wg->nthreads; ++i) {
    Fiber& f = wg->fibers[i];
    f.wg = wg;
    f.flat = i;
    f.tid = Dim3{i % bx, (i / bx) % wg->bdim.y, i / bxy};
    f.wave = i / kWaveLanes;
    f.lane = i % kWaveLanes;
    f.state = kReady;
    f.colls = 0;
    make_context(&f.ctx, wg->stacks.top(i), &fiber_main, &f);
  }
}

// When no fiber can run and some have not returned, say who waits where.
inline void report_deadlock(Workgroup* wg) {
  int n =
      snprintf(wg->error, sizeof(wg->error), "kernel %s, workgroup (%u,%u,%u): no work-item can proceed:", wg->kernel,
               wg->bid.x, wg->bid.y, wg->bid.z);
  for (int w = 0; w < wg->nwaves && n > 0 && n < (int)sizeof(wg->error); ++w) {
    const Wave& v = wg->waves[w];
    n += snprintf(wg->error + n, sizeof(wg->error) - n, " wave %d: %d at collective %s, %d at barrier, %d returned;", w,
                  v.arrived, v.arrived ? v.name : "-", v.at_barrier, v.done);
  }
  wg->failed = true;
}

inline bool run_workgroup(Workgroup* wg) {
  start_workgroup(wg);
  Fiber* next = &wg->fibers[0];
  while (next) {
    t_cur = next;
    swap_context(&wg->sched, &next->ctx);
    if (wg->failed) break;
    if (wg->done == wg->nthreads) break;
    next = next_ready(wg, wg->nthreads - 1);
    if (!next) report_deadlock(wg);
  }
  t_cur = nullptr;
  return !wg->failed;
}

struct GridJob {
  const char* kernel;
  void (*body)(const void*);
  const void* params;
  Dim3 grid, block;
  Range* ranges = nullptr;  // the launch's, malloc'd by run_grid
  int n_ranges = 0;
  long next = 0;       // the next workgroup to run (atomic fetch-add)
  bool stop = false;   // atomic: a workgroup failed, or the emulator ran out of memory
  pthread_mutex_t mu;  // error_wg, error
  long error_wg = -1;
  char error[sizeof(Workgroup::error)] = {0};
  unsigned long long switches = 0, barriers = 0, collectives = 0;  // atomic adds
  rtc_emu_take_stacks_fn take_stacks = nullptr;  // the loader's kept stacks (launch_abi.h)
  rtc_emu_give_stacks_fn give_stacks = nullptr;
};

inline void set_job_error(GridJob* job, long wg_index, const char* msg, bool lowest) {
  pthread_mutex_lock(&job->mu);
  if (!lowest || job->error_wg < 0 || wg_index < job->error_wg) {  // lowest: the lowest failing one, as sequentially
    job->error_wg = wg_index;
    snprintf(job->error, sizeof(job->error), "%s", msg);
  }
  __atomic_store_n(&job->stop, true, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&job->mu);
}

inline void run_worker(GridJob* job) {
  Workgroup* wg = new (std::nothrow) Workgroup();
  const long nwg = (long)job->grid.x * job->grid.y * job->grid.z;
  const int nthreads = (int)(job->block.x * job->block.y * job->block.z);
  if (wg) {
    wg->stacks.take = job->take_stacks;
    wg->stacks.give = job->give_stacks;
  }
  if (!wg || !wg->stacks.reserve((size_t)nthreads)) {
    delete wg;
    set_job_error(job, 0, "out of memory for the emulated workgroup (fiber stacks and LDS)", false);
    return;
  }
  wg->kernel = job->kernel;
  wg->body = job->body;
  wg->params = job->params;
  wg->bdim = job->block;
  wg->gdim = job->grid;
  wg->nthreads = nthreads;
  wg->nwaves = (nthreads + kWaveLanes - 1) / kWaveLanes;
  wg->ranges = job->ranges;
  wg->n_ranges = job->n_ranges;
  for (long i; !__atomic_load_n(&job->stop, __ATOMIC_SEQ_CST) &&
               (i = __atomic_fetch_add(&job->next, 1, __ATOMIC_SEQ_CST)) < nwg;) {
    wg->bid = Dim3{(unsigned)(i % job->grid.x), (unsigned)((i / job->grid.x) % job->grid.y),
                   (unsigned)(i / ((long)job->grid.x * job->grid.y))};
    if (run_workgroup(wg)) continue;
    set_job_error(job, i, wg->error, true);
  }
  __atomic_fetch_add(&job->switches, wg->switches, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&job->barriers, wg->barriers, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&job->collectives, wg->collectives, __ATOMIC_SEQ_CST);
  delete wg;
}

inline void* run_worker_thread(void* job) {
  run_worker(static_cast<GridJob*>(job));
  return nullptr;
}

inline int launch_error(char* err, size_t errn, const char* kernel, const char* msg) {
  if (err && errn) snprintf(err, errn, "kernel %s: %s", kernel, msg);
  return 1;
}

template <class P>
int run_grid(const char* kernel, void (*body)(const void*), rtc_emu_launch* l, const void* params, size_t size,
             char* err, size_t errn) {
  char msg[256];
  if (!l || l->abi_version != RTC_EMU_ABI_VERSION)
    return launch_error(err, errn, kernel, "launch block of another emulator ABI version");
  if (!params || size != sizeof(P)) {
    snprintf(msg, sizeof(msg), "params_size %zu does not match the kernel's parameter block (%zu bytes)", size,
             sizeof(P));
    return launch_error(err, errn, kernel, msg);
  }
  const unsigned long long threads = (unsigned long long)l->block[0] * l->block[1] * l->block[2];
  const unsigned long long groups = (unsigned long long)l->grid[0] * l->grid[1] * l->grid[2];
  if (threads == 0 || threads > (unsigned long long)kMaxThreads || groups == 0) {
    snprintf(msg, sizeof(msg), "block (%u,%u,%u) x grid (%u,%u,%u): need 1..%d threads per block and a non-empty grid",
             l->block[0], l->block[1], l->block[2], l->grid[0], l->grid[1], l->grid[2], kMaxThreads);
    return launch_error(err, errn, kernel, msg);
  }
  SanReportScope san_reports(kernel);
  GridJob job;
  job.kernel = kernel;
  job.body = body;
  job.params = params;
  job.grid = Dim3{l->grid[0], l->grid[1], l->grid[2]};
  job.block = Dim3{l->block[0], l->block[1], l->block[2]};
  job.take_stacks = l->take_stacks;
  job.give_stacks = l->give_stacks;
  pthread_mutex_init(&job.mu, nullptr);
  job.ranges = static_cast<Range*>(malloc(sizeof(Range) * (l->n_ranges > 0 ? l->n_ranges : 1)));
  if (!job.ranges) return launch_error(err, errn, kernel, "out of memory for the launch's global ranges");
  for (int i = 0; i < l->n_ranges; ++i)
    add_range(job.ranges, &job.n_ranges, l->ranges[i].base, (unsigned long long)l->ranges[i].bytes);
  long workers = l->host_threads > 0 ? l->host_threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (workers < 1) workers = 1;
  if ((unsigned long long)workers > groups) workers = (long)groups;
  pthread_t* pool = static_cast<pthread_t*>(malloc(sizeof(pthread_t) * workers));
  long started = 0;
  for (long t = 1; pool && t < workers; ++t) {
    if (pthread_create(&pool[started], nullptr, run_worker_thread, &job) != 0) break;  // fewer threads: still correct
    ++started;
  }
  run_worker(&job);
  for (long t = 0; t < started; ++t) pthread_join(pool[t], nullptr);
  free(pool);
  free(job.ranges);
  pthread_mutex_destroy(&job.mu);
  l->stats[0] = job.switches;
  l->stats[1] = job.barriers;
  l->stats[2] = job.collectives;
  l->stats[3] = groups;
  if (job.error_wg < 0) return 0;
  if (err && errn) snprintf(err, errn, "%s", job.error);
  return 1;
}

}  // namespace rtc_emu

// The shared object's entry for kernel `name`: rtc_emu_launch_<name> (see launch_abi.h).
#define RTC_EXPORT_KERNEL(name, Params)                                                                              \
  static void rtc_emu_body_##name(const void* p) { name(*static_cast<const Params*>(p)); }                           \
  extern "C" __attribute__((visibility("default"))) int rtc_emu_launch_##name(rtc_emu_launch* l, const void* params, \
                                                                              size_t size, char* err, size_t errn) { \
    return ::rtc_emu::run_grid<Params>(#name, &rtc_emu_body_##name, l, params, size, err, errn);                     \
  }
