// Builds the info JSON by hand: a few flat objects do not justify a JSON library dependency.
#include <sys/stat.h>
#include <cerrno>
#include "info.h"
#include "common.h"
#include "compiler.h"
#include "disk_cache.h"
#include "dynlib.h"
#include "knobs.h"
#include "loader.h"
#include <cstdio>

namespace rtc {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

static std::string compilers_json() {
  const char* probe_archs[] = {"gfx942", "gfx90a",     "gfx950",     "sm_80",
                               "sm_90a", "gfx942-emu", "gfx90a-emu", "gfx950-emu"};
  std::string out = "[";
  for (const Compiler* c : all_compilers()) {
    std::string archs, why_all;
    for (const char* a : probe_archs) {
      std::string why;
      if (c->available(a, &why))
        archs += std::string(archs.empty() ? "" : ",") + json_string(a);
      else if (why_all.empty() || why.find("only") == std::string::npos)
        why_all = why;
    }
    bool any = !archs.empty();
    out += std::string(out.size() > 1 ? "," : "") + "{\"name\":" + json_string(c->name()) +
           ",\"available\":" + (any ? "true" : "false") + ",\"archs\":[" + archs + "]" +
           ",\"id\":" + json_string(any ? c->id() : "") + ",\"version\":" + json_string(any ? c->version() : "") +
           ",\"reason\":" + json_string(any ? "" : why_all) + "}";
  }
  return out + "]";
}

static std::string loaders_json() {
  std::string out = "[";
  for (const char* v : {"hip", "cuda", "host"}) {
    int n = 0;
    try {
      n = get_loader(v).device_count();
    } catch (const std::exception&) {
      n = 0;
    }
    out += std::string(out.size() > 1 ? "," : "") + "{\"vendor\":" + json_string(v) +
           ",\"devices\":" + std::to_string(n) + "}";
  }
  return out + "]";
}

static std::string dir_json(const std::string& dir, bool system) {
  std::string why, entries;
  bool trusted = dir_trusted(dir, system, &why);
  struct stat st{};
  if (!trusted && !system && stat(dir.c_str(), &st) != 0 && errno == ENOENT) {
    trusted = true;  // the user dir is made at the first compile
    why = "";
  }
  for (const std::string& e : list_entries(dir)) entries += (entries.empty() ? "" : ",") + json_string(e);
  return "{\"path\":" + json_string(dir) + ",\"usable\":" + (trusted ? "true" : "false") +
         ",\"reason\":" + json_string(trusted ? "" : why) + ",\"entries\":[" + entries + "]}";
}

static std::string knobs_json() {
  std::string out = "{";
  for (const Knob& k : knob_table()) {
    std::string value;
    try {
      value = knob_text(k.name);
    } catch (const RtcError& e) {
      value = std::string("invalid: ") + e.what();
    }
    out += std::string(out.size() > 1 ? "," : "") + json_string(knob_env_name(k.name)) + ":" + json_string(value);
  }
  return out + "}";
}

// The LIBRARY_PATH dirs with their trust, and the files refused in them so far (the probes above met them).
static std::string library_path_json() {
  std::string dirs, refused;
  for (const std::string& d : knob_paths("LIBRARY_PATH")) {
    std::string why;
    bool trusted = dir_trusted(d, true, &why);
    dirs += std::string(dirs.empty() ? "" : ",") + "{\"path\":" + json_string(d) +
            ",\"usable\":" + (trusted ? "true" : "false") + ",\"reason\":" + json_string(why) + "}";
  }
  for (const auto& r : refused_libraries())
    refused += std::string(refused.empty() ? "" : ",") + "{\"path\":" + json_string(r.first) +
               ",\"reason\":" + json_string(r.second) + "}";
  return "\"library_path\":[" + dirs + "],\"refused_libraries\":[" + refused + "]";
}

std::string info_json() {
  std::string sys;
  for (const std::string& d : system_cache_dirs()) sys += (sys.empty() ? "" : ",") + dir_json(d, true);
  std::string compilers = compilers_json(), loaders = loaders_json();  // first: they load the libraries
  return "{\"version\":" + json_string(version()) + ",\"compilers\":" + compilers + ",\"loaders\":" + loaders + "," +
         library_path_json() + ",\"knobs\":" + knobs_json() +
         ",\"user_cache\":" + dir_json(user_cache_dir(nullptr), false) + ",\"system_caches\":[" + sys + "]}";
}

}  // namespace rtc
