// KeyLock: flock on a per-key lock file, polled with a notice and a timeout, and safe across fork().
#include "key_lock.h"
#include "common.h"
#include "knobs.h"
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>

namespace rtc {

// A flock belongs to the open file description, and fork() gives the child a descriptor of the same
// description. A child forked while a thread holds (or is taking) a key's lock would keep the lock held
// through its copy after the parent's thread closed its own, and would then wait on it itself until
// <PRODUCT>_LOCK_TIMEOUT (warm in a thread, then fork workers). So every open KeyLock is registered, and a
// forked child closes its copies at once: the lock stays the parent's alone, and the child waits for the
// parent's compile like any other process, then finds the entry on disk. Opening and closing happen under
// the registry's mutex, which fork() takes first, so no descriptor is ever open and unregistered at a fork.
namespace {

std::mutex& registry_mu() {
  static std::mutex* mu = new std::mutex;  // never destroyed: a fork during exit still finds it
  return *mu;
}

std::set<KeyLock*>& registry() {
  static std::set<KeyLock*>* locks = new std::set<KeyLock*>;
  return *locks;
}

void before_fork() { registry_mu().lock(); }
void after_fork_in_parent() { registry_mu().unlock(); }
void after_fork_in_child() {
  KeyLock::forget_all_in_forked_child();
  registry_mu().unlock();
}

struct ForkHandlers {
  ForkHandlers() { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); }
} g_fork_handlers;

constexpr double kLockNoticeSeconds = 2;  // a wait this long gets one message naming the holder
constexpr useconds_t kLockPollMicros = 50 * 1000;

}  // namespace

void KeyLock::forget_all_in_forked_child() {
  for (KeyLock* l : registry()) {
    close(l->fd_);
    l->fd_ = -1;  // the object lives on in a thread the child does not have; its destructor never runs
  }
  registry().clear();
}

KeyLock::KeyLock(const std::string& dir, const std::string& name) : path_(dir + "/" + name + ".lock") {
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ >= 0) registry().insert(this);
  }
  if (fd_ < 0) return;  // no lock: at worst two processes compile the same key
  wait(name);
  if (fd_ < 0) return;
  // Who holds it, for the messages of those who wait (advisory: a failed write only loses that).
  std::string pid = std::to_string(getpid()) + "\n";
  bool recorded = ftruncate(fd_, 0) == 0 && pwrite(fd_, pid.data(), pid.size(), 0) == ssize_t(pid.size());
  if (!recorded) log_line("cannot record the pid in " + path_);
}

// Closing the descriptor releases the flock (when no forked copy holds it: see above).
void KeyLock::release() {
  std::lock_guard<std::mutex> lock(registry_mu());
  if (fd_ < 0) return;
  close(fd_);
  registry().erase(this);
  fd_ = -1;
}

// flock with LOCK_NB, polled: a blocking flock could neither say whom it waits for nor give up.
void KeyLock::wait(const std::string& name) {
  long limit = knob_int("LOCK_TIMEOUT");
  std::string knob = knob_env_name("LOCK_TIMEOUT") + "=" + std::to_string(limit) + " s";
  double t0 = now_ms();
  bool told = false;
  while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return release();
    double waited = (now_ms() - t0) / 1000;
    if (!told && waited >= kLockNoticeSeconds) {
      told = true;
      warn("waiting for " + holder() + ", which holds " + path_ + " while it builds " + name + "; giving up after " +
           knob);
    }
    if (waited >= limit) {
      std::string who = holder();
      release();
      RTC_FAIL(RTC_ERR_COMPILE, "gave up after " + knob + " waiting for the lock file " + path_ + ", held by " + who +
                                    " (building " + name + "); end that process if it hangs, or raise " +
                                    knob_env_name("LOCK_TIMEOUT"));
    }
    usleep(kLockPollMicros);
  }
}

// The pid the holder wrote, checked: a pid that names this process or no live process is not the holder.
std::string KeyLock::holder() const {
  char text[32] = {0};
  ssize_t n = pread(fd_, text, sizeof text - 1, 0);
  long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
  if (pid <= 0)
    return "a process that wrote no pid into the lock file (it could not, or it holds a descriptor inherited "
           "through a fork from a holder that has finished)";
  std::string p = "pid " + std::to_string(pid);
  if (pid == long(getpid())) return "another thread of this process (" + p + ")";
  if (kill(pid_t(pid), 0) != 0 && errno == ESRCH)
    return p + ", which is not a live process here (it runs in another pid namespace, or it is gone and a "
               "process it forked keeps the lock's descriptor)";
  return p;
}

KeyLock::~KeyLock() {
  if (fd_ < 0) return;
  if (ftruncate(fd_, 0) != 0) log_line("cannot clear the pid in " + path_);  // no stale pid for later waiters
  release();
}

}  // namespace rtc
