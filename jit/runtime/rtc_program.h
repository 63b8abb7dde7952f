// The in-memory compile sequence NVRTC and hipRTC share (hipRTC mirrors NVRTC's API shape).
#pragma once
#include "common.h"
#include "compiler.h"
#include <string>
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
  int rc = a.create(&prog, in.main.text.c_str(), in.main.name.c_str(), int(texts.size()), texts.data(),
                    names.data());
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

}  // namespace rtc
