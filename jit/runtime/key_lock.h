// The per-key file lock that makes concurrent processes (and threads) compile a cache key once.
#pragma once
#include <string>

namespace rtc {

// Exclusive per-key lock on <dir>/<name>.lock via flock: the kernel drops it when the holder
// dies, so a crashed process never leaves a lock that blocks others. The holder writes its pid
// into the file; a waiter names that pid after a few seconds and gives up with an error after
// <PRODUCT>_LOCK_TIMEOUT seconds (a live process that hangs holding the lock).
// A child forked while a lock is open does not inherit it (see key_lock.cpp): it waits like any process.
class KeyLock {
 public:
  KeyLock(const std::string& dir, const std::string& name);
  ~KeyLock();
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  bool held() const { return fd_ >= 0; }
  static void forget_all_in_forked_child();  // for the pthread_atfork child handler only

 private:
  void wait(const std::string& name);
  void release();
  std::string holder() const;
  int fd_ = -1;
  std::string path_;
};

}  // namespace rtc
