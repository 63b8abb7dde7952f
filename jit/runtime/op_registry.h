// The table of ops: each op's host code registers its argument block and one descriptor per kernel
// kind; the C ABI reaches an op only through this table, so the runtime never learns an op's name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rtc {

// One field of an op's argument block (the C struct the Python layer fills through ctypes). The
// runtime describes the block to Python from these, so its layout is defined once, in C++.
enum class ArgKind { Ptr, I32, I64, F32 };
struct ArgField {
  const char* name;
  size_t offset;
  ArgKind kind;
  int count;  // 1 for a scalar, N for an array of N
};

// Where a launch goes: the vendor's loader, device ordinal and stream.
struct LaunchTarget {
  const char* vendor;  // "hip" | "cuda" | "host"
  int device;
  void* stream;
};

// The host side of one kernel of an op: what it accepts, the scratch it needs, how it is launched.
// args points to the op's argument block, already checked by the op's validate.
struct KernelHost {
  const char* kernel;  // the manifest's kernel name, e.g. "baseline"
  // "" when the kernel takes these runtime arguments on vendor (alignment, strides), else why not.
  std::string (*why_not)(const void* args, const char* vendor);
  int64_t (*workspace_bytes)(const void* args);
  // The launch plan as a JSON object (grid sizes, splits, workspace): what tests and models read.
  std::string (*plan_json)(const void* args);
  void (*launch)(uint64_t program, const void* args, const LaunchTarget& target);
};

struct OpHost {
  const char* op;                     // the manifest's op name
  size_t args_size;                   // sizeof the argument block
  std::vector<ArgField> fields;       // its fields, in order
  void (*validate)(const void* args);  // throws RTC_ERR_ARG naming the field and value
  std::vector<KernelHost> kernels;
};

// A static object of this type in an op's host code registers it before main().
struct OpRegistration {
  explicit OpRegistration(OpHost op);
};

// The op and its kernel; throw RTC_ERR_ARG listing what is registered when a name is unknown.
const OpHost& find_op(const std::string& op);
const KernelHost& find_kernel(const OpHost& op, const std::string& kernel);
// The op's argument block after checking its size against the registered one and validating it.
const void* checked_args(const OpHost& op, const void* args, size_t size);
// Every op with its argument layout and kernels, as JSON (rtc_ops_json).
std::string ops_json();

// An argument block is declared once, as a list X(name, C type, ArgKind, count): RTC_ARG_MEMBER turns
// each entry into a struct member (an array when count > 1), RTC_ARG_FIELD into its ArgField.
template <class T, int N> struct ArgMember {
  using type = T[N];
};
template <class T> struct ArgMember<T, 1> {
  using type = T;
};
#define RTC_ARG_MEMBER(name, ctype, kind, count) ::rtc::ArgMember<ctype, count>::type name;
#define RTC_ARG_FIELD(Struct, name, kind, count) \
  ::rtc::ArgField { #name, offsetof(Struct, name), ::rtc::ArgKind::kind, count }

}  // namespace rtc
