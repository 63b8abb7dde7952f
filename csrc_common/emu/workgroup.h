// One emulated workgroup: work-items as fibers in waves of 64, the barrier, wave collectives, errors.
#pragma once
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "fiber.h"
#include "lds.h"

namespace rtc_emu {

constexpr int kWaveLanes = 64;
constexpr int kMaxThreads = 1024;
constexpr int kMaxWaves = kMaxThreads / kWaveLanes;
constexpr int kSlotBytes = 128;  // per-lane payload of one collective (MFMA 32x32x8 needs 80 in)

struct Dim3 {
  unsigned x, y, z;
};

enum State : uint8_t { kReady, kAtCollective, kAtBarrier, kDone };

struct Workgroup;

struct Fiber {
  Context ctx;
  Workgroup* wg;
  Dim3 tid;
  int flat, wave, lane;
  State state;
  unsigned colls;  // collectives this lane has completed: lanes of one call must agree
};

// Collective rendezvous of one wave. Inputs land in `in` as a dense array of the op's input type;
// the last lane to arrive computes every lane's output into `out`, then the others pick theirs.
struct Wave {
  int lanes;            // live lanes (the last wave of a block may be partial)
  int arrived;          // lanes waiting at the pending collective
  int at_barrier;       // lanes waiting at the workgroup barrier
  int done;             // lanes that returned from the kernel
  const void* site;     // call site of the pending collective
  const char* name;     // its instruction name
  unsigned seq;         // its ordinal in each lane's sequence of collectives
  uint32_t epoch;       // completed collectives: intra-wave ordering for the race check
  alignas(64) unsigned char in[kWaveLanes * kSlotBytes];
  alignas(64) unsigned char out[kWaveLanes * kSlotBytes];
};

struct Range {
  uintptr_t lo, hi;
};

struct Workgroup {
  const char* kernel = "";
  void (*body)(const void*) = nullptr;
  const void* params = nullptr;
  Dim3 bid{}, bdim{}, gdim{};
  int nthreads = 0, nwaves = 0, done = 0, at_barrier = 0;
  uint32_t epoch = 0;  // barrier generation, never reset: stale shadow entries stay stale
  bool failed = false;
  char error[1024] = {0};
  const Range* ranges = nullptr;
  int n_ranges = 0;
  unsigned long long switches = 0, barriers = 0, collectives = 0;
  Context sched;
  Fiber fibers[kMaxThreads];
  Wave waves[kMaxWaves];
  StackPool stacks;
  Lds lds;
};

// The fiber running on this host thread (kernel code only ever sees its own).
inline thread_local Fiber* t_cur = nullptr;

inline Fiber* next_ready(Workgroup* wg, int after) {
  for (int i = 1; i <= wg->nthreads; ++i) {
    int j = after + i;
    if (j >= wg->nthreads) j -= wg->nthreads;
    if (wg->fibers[j].state == kReady) return &wg->fibers[j];
  }
  return nullptr;
}

// Hands the host thread to the next ready fiber (no detour through the scheduler), or back to
// the scheduler when none is ready.
inline void block(Fiber* f) {
  Workgroup* wg = f->wg;
  Fiber* next = next_ready(wg, f->flat);
  ++wg->switches;
  if (next) {
    t_cur = next;
    swap_context(&f->ctx, &next->ctx);
  } else {
    swap_context(&f->ctx, &wg->sched);
  }
  t_cur = f;
}

inline void vformat_error(Workgroup* wg, const Fiber* f, const char* fmt, va_list ap) {
  int n = snprintf(wg->error, sizeof(wg->error), "kernel %s, workgroup (%u,%u,%u)", wg->kernel, wg->bid.x, wg->bid.y,
                   wg->bid.z);
  if (f && n > 0 && n < (int)sizeof(wg->error))
    n += snprintf(wg->error + n, sizeof(wg->error) - n, ", wave %d, lane %d (thread %u,%u,%u)", f->wave, f->lane,
                  f->tid.x, f->tid.y, f->tid.z);
  if (n > 0 && n < (int)sizeof(wg->error)) {
    n += snprintf(wg->error + n, sizeof(wg->error) - n, ": ");
    if (n < (int)sizeof(wg->error)) vsnprintf(wg->error + n, sizeof(wg->error) - n, fmt, ap);
  }
  wg->failed = true;
}

// Reports an error of the running work-item and abandons the workgroup: the fiber never resumes
// (its stack is simply reused), so nothing unwinds through kernel code.
[[noreturn]] inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] inline void fail(const char* fmt, ...) {
  Fiber* f = t_cur;
  va_list ap;
  va_start(ap, fmt);
  vformat_error(f->wg, f, fmt, ap);
  va_end(ap);
  Context dead;
  swap_context(&dead, &f->wg->sched, true);
  __builtin_unreachable();
}

inline void barrier() {
  Fiber* f = t_cur;
  Workgroup* wg = f->wg;
  Wave& w = wg->waves[f->wave];
  if (w.arrived)
    fail("reached a barrier while %d lanes of its wave wait at collective %s (divergent collective)", w.arrived,
         w.name);
  if (wg->done) fail("reached a barrier that %d work-items will never reach (they returned from the kernel)", wg->done);
  ++w.at_barrier;
  if (++wg->at_barrier == wg->nthreads) {
    wg->at_barrier = 0;
    ++wg->epoch;
    ++wg->barriers;
    for (int i = 0; i < wg->nwaves; ++i) wg->waves[i].at_barrier = 0;
    for (int i = 0; i < wg->nthreads; ++i) wg->fibers[i].state = kReady;
    return;
  }
  f->state = kAtBarrier;
  block(f);
}

// A wave-wide operation: every live lane of the wave must call it from the same call site as its
// same-numbered collective. F(const In* in, Out* out, int lanes) computes all lanes at once.
template <class In, class Out, class F>
__attribute__((noinline)) Out wave_op(const char* name, const In& x, F&& op) {
  static_assert(sizeof(In) <= kSlotBytes && sizeof(Out) <= kSlotBytes, "collective payload too big");
  const void* site = __builtin_return_address(0);
  Fiber* f = t_cur;
  Workgroup* wg = f->wg;
  Wave& w = wg->waves[f->wave];
  if (w.at_barrier || w.done)
    fail("collective %s while %d lanes of its wave are at a barrier and %d returned (divergent collective)", name,
         w.at_barrier, w.done);
  if (w.arrived == 0) {
    w.site = site;
    w.name = name;
    w.seq = f->colls;
  } else if (w.site != site || w.seq != f->colls) {
    fail("divergent collective: this lane calls %s (its collective #%u) while %d lanes wait at %s "
         "(#%u) from another call site or iteration",
         name, f->colls, w.arrived, w.name, w.seq);
  }
  In* ins = reinterpret_cast<In*>(w.in);
  memcpy(&ins[f->lane], &x, sizeof(In));
  ++f->colls;
  if (++w.arrived == w.lanes) {
    if (w.lanes < kWaveLanes) memset(&ins[w.lanes], 0, sizeof(In) * (kWaveLanes - w.lanes));
    op(static_cast<const In*>(ins), reinterpret_cast<Out*>(w.out), w.lanes);
    w.arrived = 0;
    ++w.epoch;
    ++wg->collectives;
    Fiber* lanes = &wg->fibers[f->wave * kWaveLanes];
    for (int i = 0; i < w.lanes; ++i) lanes[i].state = kReady;
  } else {
    f->state = kAtCollective;
    block(f);
  }
  Out r;
  memcpy(&r, &reinterpret_cast<Out*>(w.out)[f->lane], sizeof(Out));
  return r;
}

inline void fiber_main(void* arg) {
  Fiber* f = static_cast<Fiber*>(arg);
  Workgroup* wg = f->wg;
  // Fiber 0 is always started by the scheduler (run_workgroup), so it learns the host thread's stack.
  const void* from_lo = nullptr;
  size_t from_bytes = 0;
  fiber_entered(&from_lo, &from_bytes);
  if (f->flat == 0 && !wg->sched.stack_lo) {
    wg->sched.stack_lo = from_lo;
    wg->sched.stack_bytes = from_bytes;
  }
  t_cur = f;
  wg->body(wg->params);
  Wave& w = wg->waves[f->wave];
  if (w.arrived)
    fail("returned from the kernel while %d lanes of its wave wait at collective %s (divergent collective)", w.arrived,
         w.name);
  if (wg->at_barrier)
    fail("returned from the kernel while %d work-items wait at a barrier it never reached", wg->at_barrier);
  f->state = kDone;
  ++w.done;
  ++wg->done;
  Context dead;
  Fiber* next = next_ready(wg, f->flat);
  ++wg->switches;
  if (next) {
    t_cur = next;
    swap_context(&dead, &next->ctx, true);
  }
  swap_context(&dead, &wg->sched, true);
}

}  // namespace rtc_emu
