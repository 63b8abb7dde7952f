// Fibers for the wave emulator: stacks and a context switch that saves only callee-saved state.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include "launch_abi.h"

// Under AddressSanitizer (a kernel built with RTCATTN_EMU_SANITIZE=1) every switch tells ASan which
// stack it goes to, and a fiber stack is unpoisoned before reuse: frames abandoned by a fiber that
// never returns (fiber_main's own, a failed work-item's) would otherwise leave stale redzones there.
#if defined(__SANITIZE_ADDRESS__)
#define RTC_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define RTC_EMU_ASAN 0
#endif

namespace rtc_emu {

typedef void (*fiber_fn)(void* arg);

// Each work-item runs on its own stack; kernels keep their "registers" in locals, so a few pages
// are touched. The reservation is generous and lazily committed; a guard page sits below.
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;

// A workgroup's stacks: taken from the loader's kept regions when it has one of this size (launch_abi.h), else
// mapped here; given back to the loader at release, else unmapped.
struct StackPool {
  char* base = nullptr;
  size_t count = 0;
  rtc_emu_take_stacks_fn take = nullptr;
  rtc_emu_give_stacks_fn give = nullptr;

  bool reserve(size_t n) {
    if (n <= count) return true;
    release();
    if (take && (base = static_cast<char*>(take(n, kStackBytes, kGuardBytes))) != nullptr) {
      count = n;
      return true;
    }
    const size_t bytes = n * kStackBytes;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    base = static_cast<char*>(p);
    count = n;
    for (size_t i = 0; i < n; ++i) mprotect(base + i * kStackBytes, kGuardBytes, PROT_NONE);
    return true;
  }
  char* top(size_t i) const { return base + (i + 1) * kStackBytes; }
  void release() {
    if (!base) return;
#if RTC_EMU_ASAN
    // Frames never returned from leave redzones in the shadow; the next user of these stacks (a later launch, or
    // memory mapped here later) must not inherit them.
    ASAN_UNPOISON_MEMORY_REGION(base, count * kStackBytes);
#endif
    if (!(give && give(base, count, kStackBytes, kGuardBytes))) munmap(base, count * kStackBytes);
    base = nullptr;
    count = 0;
  }
  ~StackPool() { release(); }
};

}  // namespace rtc_emu

#if defined(__x86_64__) && !defined(RTC_EMU_UCONTEXT)
// A switch is a call: push the callee-saved registers and the SSE/x87 control words, swap rsp,
// pop. That is all the SysV ABI asks a called function to preserve, so it is ~20 instructions,
// against a signal-mask syscall for swapcontext.
extern "C" void rtc_emu_swap_ctx(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .hidden rtc_emu_swap_ctx
  .type rtc_emu_swap_ctx,@function
rtc_emu_swap_ctx:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rtc_emu_swap_ctx, .-rtc_emu_swap_ctx
  .p2align 4
  .hidden rtc_emu_fiber_start
  .type rtc_emu_fiber_start,@function
rtc_emu_fiber_start:
  movq %r13, %rdi
  callq *%r12
  ud2
  .size rtc_emu_fiber_start, .-rtc_emu_fiber_start
)");
extern "C" void rtc_emu_fiber_start();

namespace rtc_emu {

struct Context {
  void* sp = nullptr;
  const void* stack_lo = nullptr;  // the stack it runs on, for ASan (a host thread's own stack: learned
  size_t stack_bytes = 0;          // by the first fiber it starts, see fiber_entered)
};

inline void raw_swap(Context* from, Context* to) { rtc_emu_swap_ctx(&from->sp, to->sp); }

// Lays out the frame rtc_emu_swap_ctx pops: control words, r15..rbp (r12 = fn, r13 = arg),
// then the return address into rtc_emu_fiber_start, placed so that its call sees an aligned rsp.
inline void make_raw_context(Context* c, char* stack_top, fiber_fn fn, void* arg) {
  uint64_t* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t(15));
  uint64_t* sp = top - 10;
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  sp[0] = (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
  sp[1] = 0;                                  // r15
  sp[2] = 0;                                  // r14
  sp[3] = reinterpret_cast<uint64_t>(arg);    // r13
  sp[4] = reinterpret_cast<uint64_t>(fn);     // r12
  sp[5] = 0;                                  // rbx
  sp[6] = 0;                                  // rbp
  sp[7] = reinterpret_cast<uint64_t>(&rtc_emu_fiber_start);
  sp[8] = 0;
  sp[9] = 0;
  c->sp = sp;
}

}  // namespace rtc_emu

#else
// Portable fallback: ucontext (slower: swapcontext saves the signal mask with a syscall).
#include <ucontext.h>

namespace rtc_emu {

struct Context {
  ucontext_t uc;
  const void* stack_lo = nullptr;
  size_t stack_bytes = 0;
};

inline void raw_swap(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }

inline void fiber_trampoline(unsigned hi, unsigned lo, unsigned fhi, unsigned flo) {
  void* arg = reinterpret_cast<void*>(((uintptr_t)hi << 32) | lo);
  fiber_fn fn = reinterpret_cast<fiber_fn>(((uintptr_t)fhi << 32) | flo);
  fn(arg);
}

inline void make_raw_context(Context* c, char* stack_top, fiber_fn fn, void* arg) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack_top - kStackBytes + kGuardBytes;
  c->uc.uc_stack.ss_size = kStackBytes - kGuardBytes;
  c->uc.uc_link = nullptr;
  uintptr_t a = reinterpret_cast<uintptr_t>(arg), f = reinterpret_cast<uintptr_t>(fn);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(&fiber_trampoline), 4, (unsigned)(a >> 32), (unsigned)a,
              (unsigned)(f >> 32), (unsigned)f);
}

}  // namespace rtc_emu
#endif

namespace rtc_emu {

// A fresh context that runs fn(arg) on the stack below stack_top (kStackBytes, guard page included).
inline void make_context(Context* c, char* stack_top, fiber_fn fn, void* arg) {
  c->stack_lo = stack_top - kStackBytes + kGuardBytes;
  c->stack_bytes = kStackBytes - kGuardBytes;
#if RTC_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(c->stack_lo, c->stack_bytes);
#endif
  make_raw_context(c, stack_top, fn, arg);
}

// Switches from the running context to `to`; `ending` when `from` is never resumed.
inline void swap_context(Context* from, Context* to, bool ending = false) {
#if RTC_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(ending ? nullptr : &fake_stack, to->stack_lo, to->stack_bytes);
  raw_swap(from, to);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  (void)ending;
  raw_swap(from, to);
#endif
}

// First thing a fresh fiber runs: completes the switch that started it. *from_lo/*from_bytes get the
// stack it came from (under ASan; unchanged otherwise).
inline void fiber_entered(const void** from_lo, size_t* from_bytes) {
#if RTC_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, from_lo, from_bytes);
#else
  (void)from_lo;
  (void)from_bytes;
#endif
}

}  // namespace rtc_emu
