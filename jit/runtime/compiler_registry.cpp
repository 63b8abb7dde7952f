// The compiler factory: one instance per backend, picked by name or by the arch's default order.
#include "compiler.h"
#include "common.h"
#include <mutex>

namespace rtc {

static const std::vector<std::string> kNames = {"hiprtc", "clang", "clang22", "nvrtc", "host"};

static const Compiler& get(const std::string& name) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<Compiler>> made(kNames.size());
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] != name) continue;
    if (!made[i]) {
      if (name == "hiprtc") made[i] = make_hiprtc_compiler();
      if (name == "clang") made[i] = make_clang_compiler();
      if (name == "clang22") made[i] = make_clang22_compiler();
      if (name == "nvrtc") made[i] = make_nvrtc_compiler();
      if (name == "host") made[i] = make_host_compiler();
    }
    return *made[i];
  }
  RTC_FAIL(RTC_ERR_ARG, "compiler " + quote(name) +
                            " is not known; accepted: auto, hiprtc, clang, clang22, nvrtc, host or a ','-list");
}

static std::vector<std::string> default_order(const std::string& arch) {
  if (arch.size() > 4 && arch.compare(arch.size() - 4, 4, "-emu") == 0) return {"host"};
  if (arch.compare(0, 3, "sm_") == 0) return {"nvrtc"};
  // gfx950: no hipRTC here knows it (ROCm 5.2's aborts on an arch missing from its table), and only clang-22's
  // code objects are checked (tests/cpu/test_gfx942_isa.py).
  if (arch.compare(0, 6, "gfx950") == 0) return {"clang22", "clang"};
  if (arch.compare(0, 3, "gfx") == 0) return {"hiprtc", "clang", "clang22"};
  RTC_FAIL(RTC_ERR_ARG,
           "arch " + quote(arch) +
               " is not known; accepted: gfx942, gfx90a, gfx950, sm_80, sm_90a, gfx942-emu, gfx90a-emu, gfx950-emu");
}

// The arch -> ELF machine rule, kept beside the arch -> compiler rule above.
struct ElfMachine {
  unsigned number;
  const char* name;
};

static ElfMachine host_machine() {
#if defined(__x86_64__)
  return {62, "x86-64"};
#elif defined(__aarch64__)
  return {183, "AArch64"};
#else
  return {0, "this host's"};  // unknown here: any machine is accepted for *-emu
#endif
}

static ElfMachine elf_machine(const std::string& arch) {
  if (arch.size() > 4 && arch.compare(arch.size() - 4, 4, "-emu") == 0) return host_machine();
  if (arch.compare(0, 3, "sm_") == 0) return {190, "CUDA"};
  if (arch.compare(0, 3, "gfx") == 0) return {224, "AMDGPU"};
  return {0, "unknown"};
}

std::string code_object_problem(const std::string& arch, const std::string& bytes) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.compare(0, 4,
                    "\x7f"
                    "ELF") != 0)
    return "it is not an ELF file (it starts with " + to_hex(b, bytes.size() < 4 ? bytes.size() : 4) + ")";
  if (bytes.size() < 64) return "its " + std::to_string(bytes.size()) + " bytes are too few for an ELF header";
  if (b[4] != 2 || b[5] != 1) return "it is not a 64-bit little-endian ELF";
  unsigned machine = b[18] | (unsigned(b[19]) << 8);
  ElfMachine want = elf_machine(arch);
  if (want.number != 0 && machine != want.number)
    return "its ELF e_machine is " + std::to_string(machine) + ", expected " + std::to_string(want.number) + " (" +
           want.name + ") for arch " + arch;
  return "";
}

static std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

const Compiler& select_compiler(const std::string& spec, const std::string& arch) {
  std::vector<std::string> order = default_order(arch);  // also validates arch
  if (!spec.empty() && spec != "auto") order = split_commas(spec);
  std::string skipped;
  for (const std::string& name : order) {
    const Compiler& c = get(name);
    std::string why;
    if (c.available(arch, &why)) return c;
    skipped += "\n  " + name + ": " + why;
  }
  RTC_FAIL(RTC_ERR_UNAVAILABLE,
           "no compiler available for arch " + quote(arch) + " (compiler=" + quote(spec) + "); tried:" + skipped);
}

std::vector<const Compiler*> all_compilers() {
  std::vector<const Compiler*> out;
  for (const std::string& n : kNames) out.push_back(&get(n));
  return out;
}

}  // namespace rtc
