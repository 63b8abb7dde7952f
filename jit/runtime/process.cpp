// posix_spawn based subprocess runner: no shell, so no quoting bugs with paths or options.
#include "process.h"
#include "common.h"
#include "fsutil.h"
#include "knobs.h"
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace rtc {

long compile_timeout_s() { return knob_int("COMPILE_TIMEOUT", 600); }

std::string compile_timeout_text() {
  return knob_env_name("COMPILE_TIMEOUT") + "=" + std::to_string(compile_timeout_s()) + " s";
}

// Waits for pid, polling so that a deadline can end the wait; the interval grows from 1 ms so a
// quick process costs no noticeable latency. Returns false when the deadline passed first.
static bool wait_until(pid_t pid, double deadline_ms, int* status) {
  useconds_t nap = 1000;
  while (true) {
    pid_t got = waitpid(pid, status, WNOHANG);
    if (got == pid) return true;
    if (got < 0 && errno != EINTR) {
      *status = -1;
      return true;
    }
    if (deadline_ms > 0 && now_ms() >= deadline_ms) return false;
    usleep(nap);
    if (nap < 50000) nap *= 2;
  }
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path) {
  ProcessResult r;
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
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    r.output = "cannot start " + argv[0] + ": " + std::strerror(rc);
    return r;
  }
  long limit = compile_timeout_s();
  int status = 0;
  if (!wait_until(pid, limit > 0 ? now_ms() + 1000.0 * limit : 0, &status)) {
    kill(-pid, SIGKILL);
    wait_until(pid, 0, &status);
    r.timed_out = true;
  }
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
