// Small file-system helpers: read a file, atomic write, mkdir -p, private temp dirs.
#pragma once
#include <string>

namespace rtc {

bool read_file(const std::string& path, std::string* data, std::string* err);
// temp name unique per process and thread -> write -> fsync -> close -> rename.
bool write_file_atomic(const std::string& path, const std::string& data, std::string* err);
bool write_file(const std::string& path, const std::string& data, std::string* err);
bool make_dirs(const std::string& dir, unsigned mode, std::string* err);
// A fresh private dir (0700) under $TMPDIR or /tmp; "" on failure.
std::string make_temp_dir(const std::string& prefix);
void remove_tree(const std::string& dir);
// Include names must stay inside the dir they are written to.
bool safe_relative_name(const std::string& name);

}  // namespace rtc
