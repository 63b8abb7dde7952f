// clang backend: `clang++ -x hip --cuda-device-only` in a subprocess, for AMD archs hipRTC lacks.
#include "common.h"
#include "compiler.h"
#include "fsutil.h"
#include "knobs.h"
#include "process.h"
#include "sha256.h"
#include <mutex>

namespace rtc {
namespace {

struct ClangInfo {
  std::string path, version_line, why;
  int major = 0;
};

// Looked up once per distinct <PRODUCT>_CLANG value: a `--version` run costs ~20 ms.
ClangInfo probe_clang() {
  static std::mutex mu;
  static std::string probed_for = "\x01";
  static ClangInfo info;
  std::string knob = knob_text("CLANG");
  std::lock_guard<std::mutex> lock(mu);
  if (probed_for == knob) return info;
  probed_for = knob;
  info = ClangInfo{};
  std::vector<std::string> names = {"clang++-21", "clang++-20", "clang++-19", "clang++-18", "clang++"};
  if (!knob.empty()) names = {knob};
  info.path = find_executable(names);
  if (info.path.empty()) {
    info.why = knob.empty() ? "no clang++ (clang++-21..18, clang++) on PATH; set " + knob_env_name("CLANG")
                            : knob_env_name("CLANG") + "=" + quote(knob) + " is not an executable";
    return info;
  }
  ProcessResult r;
  try {
    std::string tmp = make_temp_dir("clang-");
    r = run_process({info.path, "--version"}, tmp + "/version.txt");
    remove_tree(tmp);
  } catch (const RtcError& e) {  // no temp dir: say so, and probe again next time
    info.why = e.what();
    info.path.clear();
    probed_for = "\x01";
    return info;
  }
  size_t pos = r.output.find("version ");
  if (r.exit_code != 0 || pos == std::string::npos) {
    info.why = info.path + " --version failed: " + r.output;
    info.path.clear();
    return info;
  }
  info.version_line = r.output.substr(0, r.output.find('\n'));
  info.major = std::atoi(r.output.c_str() + pos + 8);
  return info;
}

class ClangCompiler : public Compiler {
 public:
  std::string name() const override { return "clang"; }
  std::string id() const override { return "clang" + std::to_string(probe_clang().major); }
  std::string version() const override {
    ClangInfo c = probe_clang();
    return c.path + " " + c.version_line;
  }
  bool available(const std::string& arch, std::string* why) const override {
    ClangInfo c = probe_clang();
    if (c.path.empty()) return *why = c.why, false;
    if (arch.compare(0, 3, "gfx") != 0 || arch.find("-emu") != std::string::npos)
      return *why = "clang backend builds AMD archs (gfx*) only, not " + quote(arch), false;
    return true;
  }
  CompileOutput compile(const CompileInput& in) const override;
};

void write_sources(const std::string& dir, const CompileInput& in) {
  std::string err;
  std::vector<SourceText> all = in.headers;
  all.push_back(in.main);
  for (const SourceText& s : all) {
    RTC_CHECK(safe_relative_name(s.name), RTC_ERR_ARG,
              "source name " + quote(s.name) + " must be a relative path without '..'");
    size_t slash = s.name.rfind('/');
    if (slash != std::string::npos) make_dirs(dir + "/" + s.name.substr(0, slash), 0700, &err);
    RTC_CHECK(write_file(dir + "/" + s.name, s.text, &err), RTC_ERR_UNAVAILABLE,
              "cannot write the source for clang: " + err + " (TMPDIR=" + temp_base() + ")");
  }
}

CompileOutput ClangCompiler::compile(const CompileInput& in) const {
  ClangInfo c = probe_clang();
  std::string dir = make_temp_dir("clang-");
  CompileOutput out;
  try {
    write_sources(dir, in);
    std::vector<std::string> argv = {c.path, "-x", "hip", "--offload-arch=" + in.arch, "-nogpulib", "-nogpuinc", "-O3",
                                     "--cuda-device-only", "--no-gpu-bundle-output", "-I", dir,
                                     // clang derives the HIP compilation-unit id from the (random)
                                     // temp path; fixing it makes identical inputs give identical bytes.
                                     // It names the kernel, not its text: an edit that leaves the code
                                     // alone (a comment, a dead define) leaves the bytes alone too.
                                     "-cuid=" + sha256_hex(in.main.name + "\n" + in.kernel_symbol).substr(0, 16)};
    argv.insert(argv.end(), in.options.begin(), in.options.end());  // after -O3 so they win
    argv.insert(argv.end(), {"-c", dir + "/" + in.main.name, "-o", dir + "/out.co"});
    ProcessResult r = run_process(argv, dir + "/log.txt");
    std::string cmd;
    for (const std::string& a : argv) cmd += a + " ";
    out.log = "$ " + cmd + "\n" + r.output;
    std::string err;
    // A timeout is reported as a failed compile: its log names the knob, and the saved source
    // reproduces the hang.
    if (r.exit_code != 0) throw CompileFailure{out.log};
    if (!read_file(dir + "/out.co", &out.binary, &err)) throw CompileFailure{out.log + "\n" + err};
  } catch (...) {
    remove_tree(dir);
    throw;
  }
  remove_tree(dir);
  return out;
}

}  // namespace

std::unique_ptr<Compiler> make_clang_compiler() { return std::make_unique<ClangCompiler>(); }

}  // namespace rtc
