// clang backend: `clang++ -x hip --cuda-device-only` in a subprocess, for AMD archs hipRTC lacks. Two registry
// entries share it: "clang" (<PRODUCT>_CLANG) and "clang22" (<PRODUCT>_CLANG22).
#include "common.h"
#include "compiler.h"
#include "fsutil.h"
#include "knobs.h"
#include "process.h"
#include "sha256.h"
#include <map>
#include <mutex>
#include <utility>

namespace rtc {
namespace {

struct ClangInfo {
  std::string path, version_line, why;
  int major = 0;
};

// One clang registry entry: its name, the knob that names its executable and the names searched on PATH
// when the knob is unset. "clang" is the compiler of gfx942 and gfx90a; "clang22" a second one for the archs
// that need a newer LLVM than clang-19 (gfx950), kept apart so that gfx942's code objects do not change when
// clang-22 is installed beside clang-19 (docs/NOTES.md, "gfx950 as an arch").
struct ClangSlot {
  const char* name;
  const char* knob;
  std::vector<std::string> path_names;
};

// The first LLVM major that targets arch: clang answers an arch it does not know with an error at the first
// compile; available() says so before that, and a compiler order moves on to the next entry.
int first_major(const std::string& arch) {
  std::string base = arch.substr(0, arch.find(':'));
  if (base == "gfx950") return 20;
  return 0;
}

// Looked up once per distinct <PRODUCT>_<knob> value: a `--version` run costs ~20 ms.
ClangInfo probe_clang(const ClangSlot& slot) {
  static std::mutex mu;
  static std::map<std::string, std::pair<std::string, ClangInfo>> probed;  // slot name -> (knob value, info)
  std::string knob = knob_text(slot.knob);
  std::lock_guard<std::mutex> lock(mu);
  auto hit = probed.find(slot.name);
  if (hit != probed.end() && hit->second.first == knob) return hit->second.second;
  ClangInfo info;
  std::vector<std::string> names = slot.path_names;
  if (!knob.empty()) names = {knob};
  info.path = find_executable(names);
  if (info.path.empty()) {
    std::string listed;
    for (const std::string& n : slot.path_names) listed += (listed.empty() ? "" : ", ") + n;
    info.why = knob.empty() ? "no clang++ (" + listed + ") on PATH; set " + knob_env_name(slot.knob)
                            : knob_env_name(slot.knob) + "=" + quote(knob) + " is not an executable";
    probed[slot.name] = {knob, info};
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
    probed.erase(slot.name);
    return info;
  }
  size_t pos = r.output.find("version ");
  if (r.exit_code != 0 || pos == std::string::npos) {
    info.why = info.path + " --version failed: " + r.output;
    info.path.clear();
  } else {
    info.version_line = r.output.substr(0, r.output.find('\n'));
    info.major = std::atoi(r.output.c_str() + pos + 8);
  }
  probed[slot.name] = {knob, info};
  return info;
}

class ClangCompiler : public Compiler {
 public:
  explicit ClangCompiler(ClangSlot slot) : slot_(std::move(slot)) {}
  std::string name() const override { return slot_.name; }
  std::string id() const override { return "clang" + std::to_string(probe_clang(slot_).major); }
  std::string version() const override {
    ClangInfo c = probe_clang(slot_);
    return c.path + " " + c.version_line;
  }
  bool available(const std::string& arch, std::string* why) const override {
    ClangInfo c = probe_clang(slot_);
    if (c.path.empty()) return *why = c.why, false;
    if (arch.compare(0, 3, "gfx") != 0 || arch.find("-emu") != std::string::npos)
      return *why = "clang backend builds AMD archs (gfx*) only, not " + quote(arch), false;
    if (c.major < first_major(arch))
      return *why = c.path + " is clang " + std::to_string(c.major) + ", which cannot target " + arch +
                    " (clang >= " + std::to_string(first_major(arch)) + " can; set " + knob_env_name(slot_.knob) + ")",
             false;
    return true;
  }
  CompileOutput compile(const CompileInput& in) const override;

 private:
  ClangSlot slot_;
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
  ClangInfo c = probe_clang(slot_);
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

std::unique_ptr<Compiler> make_clang_compiler() {
  return std::make_unique<ClangCompiler>(
      ClangSlot{"clang", "CLANG", {"clang++-21", "clang++-20", "clang++-19", "clang++-18", "clang++"}});
}
std::unique_ptr<Compiler> make_clang22_compiler() {
  return std::make_unique<ClangCompiler>(ClangSlot{"clang22", "CLANG22", {"clang++-22"}});
}

}  // namespace rtc
