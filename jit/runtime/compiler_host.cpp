// The host compiler backend: builds a kernel text into a shared object for the CPU wave emulator.
#include "compiler.h"
#include "common.h"
#include "dynlib.h"
#include "fsutil.h"
#include "knobs.h"
#include "process.h"
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

namespace rtc {
namespace {

// The emulator headers normally travel in the request; a request without them (an older
// manifest) gets them from the source tree or package data next to this library.
std::string find_emu_dir() {
  std::string dir = own_library_dir();
  for (int up = 0; up < 5 && !dir.empty(); ++up) {
    for (const std::string& sub : {std::string("/csrc_common/emu"), "/" + product() + "/csrc_common/emu"}) {
      if (access((dir + sub + "/prelude_host.h").c_str(), R_OK) == 0) return dir + sub;
    }
    size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos || slash == 0 ? "" : dir.substr(0, slash);
  }
  return "";
}

void copy_emu_dir(const std::string& from, const std::string& to) {
  std::string err;
  RTC_CHECK(make_dirs(to, 0700, &err), RTC_ERR_COMPILE, "cannot create " + quote(to) + ": " + err);
  DIR* d = opendir(from.c_str());
  RTC_CHECK(d != nullptr, RTC_ERR_COMPILE, "cannot read the emulator headers in " + quote(from));
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name, text;
    if (n.size() < 3 || n.compare(n.size() - 2, 2, ".h") != 0) continue;
    if (read_file(from + "/" + n, &text, &err)) write_file(to + "/" + n, text, &err);
  }
  closedir(d);
}

void write_sources(const CompileInput& in, const std::string& dir) {
  std::string err;
  bool have_emu = false;
  for (const SourceText& h : in.headers) {
    RTC_CHECK(safe_relative_name(h.name), RTC_ERR_ARG,
              "header name " + quote(h.name) + " must be a relative path without '..'");
    size_t slash = h.name.find_last_of('/');
    if (slash != std::string::npos) make_dirs(dir + "/" + h.name.substr(0, slash), 0700, &err);
    RTC_CHECK(write_file(dir + "/" + h.name, h.text, &err), RTC_ERR_COMPILE,
              "cannot write header " + quote(h.name) + ": " + err);
    have_emu = have_emu || h.name == "emu/prelude_host.h";
  }
  RTC_CHECK(safe_relative_name(in.main.name), RTC_ERR_ARG,
            "source name " + quote(in.main.name) + " must be a plain file name");
  RTC_CHECK(write_file(dir + "/" + in.main.name, in.main.text, &err), RTC_ERR_COMPILE,
            "cannot write " + quote(in.main.name) + ": " + err);
  if (have_emu) return;
  std::string emu = find_emu_dir();
  RTC_CHECK(!emu.empty(), RTC_ERR_COMPILE,
            "the request has no header 'emu/prelude_host.h' and no csrc_common/emu was found near " +
                quote(own_library_dir()));
  copy_emu_dir(emu, dir + "/emu");
}

// Manifest options are -D/-U defines and -O levels; anything else is a GPU flag the host
// compiler would misread, so it is refused by name.
void add_options(const CompileInput& in, std::vector<std::string>* argv) {
  for (const std::string& o : in.options) {
    bool ok = o.compare(0, 2, "-D") == 0 || o.compare(0, 2, "-U") == 0 || o.compare(0, 2, "-O") == 0 ||
              o == "-ffast-math" || o.compare(0, 5, "-std=") == 0;
    RTC_CHECK(ok, RTC_ERR_ARG,
              "option " + quote(o) + " is not accepted by the host compiler; accepted: -D, -U, -O, -std=, -ffast-math");
    argv->push_back(o);
  }
}

const std::vector<const char*> kFlags = {"-std=c++17",          "-O2",        "-fPIC",      "-shared", "-pthread",
                                         "-fvisibility=hidden", "-Wno-psabi", "-DRTC_EMU=1"};

// <PRODUCT>_EMU_SANITIZE=1: kernels are built with ASan + UBSan (any UB report is fatal). The flags
// join the compiler's version text, so sanitized and plain objects never share a cache key.
const std::vector<const char*> kSanitizeFlags = {"-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                                                 "-fno-omit-frame-pointer", "-g1"};

std::vector<const char*> flags() {
  std::vector<const char*> f = kFlags;
  if (knob_bool("EMU_SANITIZE")) f.insert(f.end(), kSanitizeFlags.begin(), kSanitizeFlags.end());
  return f;
}

// A sanitized kernel object needs the ASan runtime first in the process (LD_PRELOAD); dlopen'ing
// it into a process without one would abort the process.
bool sanitizer_runtime_loaded() { return dlsym(RTLD_DEFAULT, "__asan_init") != nullptr; }

class HostCompiler : public Compiler {
 public:
  std::string name() const override { return "host"; }

  std::string id() const override {
    const Ident& i = ident();
    return i.id.empty() ? "hostcxx" : i.id;
  }
  // The fixed flags (sanitizer flags included) are part of the identity, so changing them
  // invalidates cached objects.
  std::string version() const override {
    std::string v = ident().path + " " + ident().version;
    for (const char* f : flags()) v += std::string(" ") + f;
    return v;
  }

  bool available(const std::string& arch, std::string* why) const override {
    if (arch != "gfx942-emu" && arch != "gfx90a-emu" && arch != "gfx950-emu") {
      if (why) *why = "arch " + quote(arch) + " is not an emulator arch (gfx942-emu, gfx90a-emu, gfx950-emu)";
      return false;
    }
    if (ident().path.empty()) {
      if (why)
        *why = ident().wanted.empty()
                   ? "no host C++ compiler: set " + knob_env_name("HOST_CXX") + " or put g++ or c++ on PATH"
                   : "no host C++ compiler: " + knob_env_name("HOST_CXX") + "=" + quote(ident().wanted) +
                         " is not an executable (a path, or a name found on PATH)";
      return false;
    }
    if (knob_bool("EMU_SANITIZE") && !sanitizer_runtime_loaded()) {
      if (why)
        *why = knob_env_name("EMU_SANITIZE") +
               "=1 but this process has no ASan runtime loaded; start it with LD_PRELOAD=\"$(" + ident().path +
               " -print-file-name=libasan.so) $(" + ident().path + " -print-file-name=libubsan.so)\"";
      return false;
    }
    return true;
  }

  CompileOutput compile(const CompileInput& in) const override {
    std::string why;
    RTC_CHECK(available(in.arch, &why), RTC_ERR_UNAVAILABLE, why);
    std::string dir = make_temp_dir("host-");
    RTC_CHECK(!dir.empty(), RTC_ERR_COMPILE, "cannot create a temp dir for the host compile");
    write_sources(in, dir);
    std::vector<std::string> argv = {ident().path};
    const std::vector<const char*> f = flags();
    argv.insert(argv.end(), f.begin(), f.end());
    const char* emu_arch = in.arch == "gfx90a-emu" ? "0x90a" : in.arch == "gfx950-emu" ? "0x950" : "0x942";
    argv.insert(argv.end(), {std::string("-DRTC_EMU_ARCH=") + emu_arch, "-I", dir});
    add_options(in, &argv);
    argv.insert(argv.end(), {"-x", "c++", dir + "/" + in.main.name, "-o", dir + "/kernel.so"});
    const std::string log_path = dir + "/compile.log";
    ProcessResult pr = run_process(argv, log_path);
    const int rc = pr.exit_code;
    CompileOutput out;
    out.log = pr.output;
    std::string err;
    if (rc != 0) {
      remove_tree(dir);
      if (rc < 0) RTC_FAIL(RTC_ERR_COMPILE, "cannot start " + quote(ident().path));
      throw CompileFailure{out.log + "\n(" + ident().path + " exited with status " + std::to_string(rc) + ")"};
    }
    bool ok = read_file(dir + "/kernel.so", &out.binary, &err);
    remove_tree(dir);
    RTC_CHECK(ok, RTC_ERR_COMPILE, "host compile wrote no shared object: " + err);
    return out;
  }

 private:
  struct Ident {
    std::string wanted, path, version, id;  // wanted: the HOST_CXX knob's value, if set
  };

  static const Ident& ident() {
    static const Ident i = probe();
    return i;
  }

  static Ident probe() {
    Ident i;
    std::string want = knob_text("HOST_CXX");
    i.wanted = want;
    for (const std::string& cand :
         want.empty() ? std::vector<std::string>{"g++", "c++"} : std::vector<std::string>{want}) {
      i.path = find_executable({cand});
      if (!i.path.empty()) break;
    }
    if (i.path.empty()) return i;
    std::string dir = make_temp_dir("cxxv-");
    if (dir.empty()) return i;
    i.version = run_process({i.path, "--version"}, dir + "/v").output;
    std::string major = run_process({i.path, "-dumpversion"}, dir + "/d").output;
    remove_tree(dir);
    i.version = i.version.substr(0, i.version.find('\n'));
    major = major.substr(0, major.find_first_of(".\n"));
    bool clang = i.version.find("clang") != std::string::npos;
    i.id = (clang ? "clang" : "gcc") + major;
    return i;
  }
};

}  // namespace

std::unique_ptr<Compiler> make_host_compiler() { return std::unique_ptr<Compiler>(new HostCompiler()); }

}  // namespace rtc
