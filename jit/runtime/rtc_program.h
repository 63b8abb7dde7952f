// The in-memory compile sequence NVRTC and hipRTC share (hipRTC mirrors NVRTC's API shape).
#pragma once
#include "common.h"
#include "compiler.h"
#include "knobs.h"
#include "process.h"
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace rtc {

// Creates a program from in.main with in.headers passed by include name, compiles it with
// `flags` + in.options, and returns the code (code_size/code: hiprtcGetCode* or nvrtcGetCUBIN*)
// and the log, which is kept on success too. Throws CompileFailure with the log on failure.
template <class Api, class Program>
CompileOutput compile_in_memory(const Api& a, const CompileInput& in, const std::vector<std::string>& flags,
                                int (*code_size)(Program, size_t*), int (*code)(Program, char*),
                                const std::string& who) {
  std::vector<const char*> texts, names, opts;
  for (const SourceText& h : in.headers) {
    texts.push_back(h.text.c_str());
    names.push_back(h.name.c_str());
  }
  Program prog = nullptr;
  int rc = a.create(&prog, in.main.text.c_str(), in.main.name.c_str(), int(texts.size()), texts.data(), names.data());
  RTC_CHECK(rc == 0, RTC_ERR_COMPILE, who + "CreateProgram failed: " + a.error_string(rc));
  for (const std::string& f : flags) opts.push_back(f.c_str());
  for (const std::string& o : in.options) opts.push_back(o.c_str());
  rc = a.compile(prog, int(opts.size()), opts.data());
  CompileOutput out;
  size_t n = 0;
  if (a.log_size(prog, &n) == 0 && n > 1) {
    out.log.resize(n);
    a.log(prog, &out.log[0]);
    out.log.resize(n - 1);
  }
  if (rc == 0) rc = code_size(prog, &n);
  if (rc == 0) {
    out.binary.resize(n);
    rc = code(prog, &out.binary[0]);
  }
  a.destroy(&prog);
  if (rc != 0) throw CompileFailure{who + "CompileProgram: " + a.error_string(rc) + "\n" + out.log};
  return out;
}

// Runs an in-process library compile (hipRTC, NVRTC) on a worker thread and waits at most
// <PRODUCT>_COMPILE_TIMEOUT seconds for it. A library call cannot be stopped from outside, so on a
// timeout the worker is detached and left to finish on its own; its result is dropped, and the
// caller gets an error instead of waiting forever. work must own (capture by value) what it reads.
inline CompileOutput compile_on_worker(std::function<CompileOutput()> work, const std::string& who) {
  long limit = compile_timeout_s();
  auto done = std::make_shared<std::promise<CompileOutput>>();
  std::future<CompileOutput> result = done->get_future();
  std::thread([done, work] {
    try {
      done->set_value(work());
    } catch (...) {
      done->set_exception(std::current_exception());  // CompileFailure and RtcError reach the caller
    }
  }).detach();
  if (result.wait_for(std::chrono::seconds(limit)) == std::future_status::ready) return result.get();
  RTC_FAIL(RTC_ERR_COMPILE, who + " did not finish the compile within " + compile_timeout_text() +
                                "; stopped waiting (the library call runs on, detached, and its result is "
                                "dropped). Raise " +
                                knob_env_name("COMPILE_TIMEOUT") + " for a compile that is slow, not stuck");
}

}  // namespace rtc
