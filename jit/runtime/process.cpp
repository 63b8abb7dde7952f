// posix_spawn based subprocess runner: no shell, so no quoting bugs with paths or options.
#include "process.h"
#include "fsutil.h"
#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace rtc {

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path) {
  ProcessResult r;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.output = "cannot start " + argv[0] + ": error " + std::to_string(rc);
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      r.output = "lost track of " + argv[0] + " (waitpid failed)";
      return r;
    }
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::string err;
  read_file(log_path, &r.output, &err);
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
