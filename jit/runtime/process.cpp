// posix_spawn based subprocess runner: no shell, so no quoting bugs with paths or options.
#include "process.h"
#include "common.h"
#include "fsutil.h"
#include "knobs.h"
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <mutex>
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace rtc {

long compile_timeout_s() { return knob_int("COMPILE_TIMEOUT"); }

std::string compile_timeout_text() {
  return knob_env_name("COMPILE_TIMEOUT") + "=" + std::to_string(compile_timeout_s()) + " s";
}

// ---- compiler process groups that must not outlive this process ----------------------------------------
//
// Each compiler runs in its own process group (see run_process), so nothing stops it when this process ends:
// a caller killed by SIGTERM would leave cc1plus running for minutes. The live groups are kept in slots that a
// signal handler may read (no lock, no allocation): on a SIGTERM whose action is the default one (the process
// ends), the handler kills them, restores the default action and raises the signal again, so the process ends
// exactly as it would have. A handler somebody else installed (Python's signal.signal, a server's) is left in
// place: it decides whether the process ends, and an exit runs stop_live_groups from atexit.

namespace {

constexpr int kGroupSlots = 256;  // concurrent compiles of one process; past that a group goes unrecorded
std::atomic<pid_t> g_groups[kGroupSlots];
std::atomic<int> g_spawning{0};  // spawns whose pid is not recorded yet

void stop_live_groups() {
  for (std::atomic<pid_t>& slot : g_groups) {
    pid_t pgid = slot.load();
    if (pgid > 0) kill(-pgid, SIGKILL);
  }
}

void on_sigterm(int sig) {
  int saved_errno = errno;
  // A spawn in another thread records its pid within microseconds; wait for it, briefly (the spawning thread
  // blocks SIGTERM meanwhile, so this handler never runs on it).
  for (int i = 0; i < 1000 && g_spawning.load() > 0; ++i) {
    struct timespec ms = {0, 1000 * 1000};
    nanosleep(&ms, nullptr);
  }
  stop_live_groups();
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  raise(sig);  // pending until this handler returns; then the default action ends the process
  errno = saved_errno;
}

// Installs on_sigterm where SIGTERM has the default action. Checked at every spawn: Python code may have
// put the default back since (signal.signal(SIGTERM, SIG_DFL)).
void guard_sigterm() {
  static std::mutex mu;
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(stop_live_groups); });  // sys.exit while a thread compiles
  std::lock_guard<std::mutex> lock(mu);
  struct sigaction now{};
  if (sigaction(SIGTERM, nullptr, &now) != 0 || (now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL) return;
  struct sigaction mine{};
  mine.sa_handler = on_sigterm;
  sigemptyset(&mine.sa_mask);
  mine.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &mine, nullptr);
}

int record_group(pid_t pgid) {
  for (int i = 0; i < kGroupSlots; ++i) {
    pid_t empty = 0;
    if (g_groups[i].compare_exchange_strong(empty, pgid)) return i;
  }
  return -1;
}

void forget_group(int slot) {
  if (slot >= 0) g_groups[slot].store(0);
}

// A forked child's slots name its parent's compilers: not the child's to kill.
void forget_groups_in_child() {
  for (std::atomic<pid_t>& slot : g_groups) slot.store(0);
  g_spawning.store(0);
}

struct ForkHandlers {
  ForkHandlers() { pthread_atfork(nullptr, nullptr, forget_groups_in_child); }
} g_fork_handlers;

// Starts argv with stdin from /dev/null and stdout + stderr into log_path (a new file), in a new process group
// that is recorded before any SIGTERM can be handled. Returns the pid (0 with *err when it did not start).
pid_t spawn_recorded(const std::vector<std::string>& argv, const std::string& log_path, int* slot, std::string* err) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // Its own process group, so that a timeout stops the compiler driver and what it started (cc1plus,
  // ld) with one kill. The price: Ctrl-C at a terminal no longer reaches the compiler directly.
  // SIGTERM stays blocked in this thread from before the spawn until the group is recorded; the
  // compiler gets the signal mask this thread had.
  sigset_t term, before;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  guard_sigterm();
  g_spawning.fetch_add(1);
  pthread_sigmask(SIG_BLOCK, &term, &before);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &before);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  *slot = rc == 0 ? record_group(pid) : -1;
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  g_spawning.fetch_sub(1);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) *err = "cannot start " + argv[0] + ": " + std::strerror(rc);
  return rc == 0 ? pid : 0;
}

// Waits for pid to end, polling so that a deadline can end the wait; the interval grows from 1 ms so a
// quick process costs no noticeable latency. WNOWAIT leaves it unreaped (a zombie keeps its pid, so the
// recorded group id cannot be reused meanwhile). Returns false when the deadline passed first.
bool wait_until(pid_t pid, double deadline_ms) {
  useconds_t nap = 1000;
  while (true) {
    siginfo_t info{};
    int rc = waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if ((rc == 0 && info.si_pid == pid) || (rc != 0 && errno != EINTR)) return true;
    if (deadline_ms > 0 && now_ms() >= deadline_ms) return false;
    usleep(nap);
    if (nap < 50000) nap *= 2;
  }
}

// Reaps pid (ended, see wait_until); -1 when it cannot be waited for.
int reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path) {
  ProcessResult r;
  long limit = compile_timeout_s();  // read first: a bad value throws before anything runs
  int slot = -1;
  pid_t pid = spawn_recorded(argv, log_path, &slot, &r.output);
  if (pid == 0) return r;
  if (!wait_until(pid, now_ms() + 1000.0 * limit)) {
    kill(-pid, SIGKILL);
    wait_until(pid, 0);
    r.timed_out = true;
  }
  forget_group(slot);
  int status = reap(pid);
  if (status == -1) {
    r.output = "lost track of " + argv[0] + " (waitpid failed)";
    return r;
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::string err;
  read_file(log_path, &r.output, &err);
  if (r.timed_out)
    r.output += "\n[" + product() + "] " + argv[0] + " was stopped: it did not finish within " +
                compile_timeout_text() + " (raise it for a compile that is slow, not stuck)\n";
  return r;
}

static bool is_executable(const std::string& p) { return access(p.c_str(), X_OK) == 0; }

std::string find_executable(const std::vector<std::string>& names) {
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/bin:/bin";
  for (const std::string& n : names) {
    if (n.find('/') != std::string::npos) {
      if (is_executable(n)) return n;
      continue;
    }
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      std::string cand = (dir.empty() ? "." : dir) + "/" + n;
      if (is_executable(cand)) return cand;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  return "";
}

}  // namespace rtc
