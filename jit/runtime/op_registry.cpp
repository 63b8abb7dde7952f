// The op table behind op_registry.h and its JSON description for the Python layer.
#include "op_registry.h"
#include "common.h"
#include "info.h"
#include <deque>

namespace rtc {
namespace {

std::deque<OpHost>& table() {
  static std::deque<OpHost> ops;  // filled before main(), read-only afterwards
  return ops;
}

const char* kind_name(ArgKind k) {
  switch (k) {
    case ArgKind::Ptr: return "ptr";
    case ArgKind::I32: return "i32";
    case ArgKind::I64: return "i64";
    case ArgKind::F32: return "f32";
  }
  return "?";
}

}  // namespace

OpRegistration::OpRegistration(OpHost op) { table().push_back(std::move(op)); }

const OpHost& find_op(const std::string& op) {
  std::string names;
  for (const OpHost& o : table()) {
    if (op == o.op) return o;
    names += (names.empty() ? "" : ", ") + std::string(o.op);
  }
  RTC_FAIL(RTC_ERR_ARG, "op=" + quote(op) + " is not registered in the runtime; registered: " + names);
}

const KernelHost& find_kernel(const OpHost& op, const std::string& kernel) {
  std::string names;
  for (const KernelHost& k : op.kernels) {
    if (kernel == k.kernel) return k;
    names += (names.empty() ? "" : ", ") + std::string(k.kernel);
  }
  RTC_FAIL(RTC_ERR_ARG, "kernel=" + quote(kernel) + " is not a kernel of op " + quote(op.op) +
                            " in the runtime; accepted: " + names);
}

const void* checked_args(const OpHost& op, const void* args, size_t size) {
  RTC_CHECK(args != nullptr, RTC_ERR_ARG, std::string("the argument block of ") + op.op + " is null");
  RTC_CHECK(size == op.args_size, RTC_ERR_ARG,
            "args_size=" + std::to_string(size) + " does not match the argument block of " + op.op +
                "; accepted: " + std::to_string(op.args_size) + " (build the block from rtc_ops_json)");
  op.validate(args);
  return args;
}

std::string ops_json() {
  std::string out = "{";
  for (const OpHost& o : table()) {
    std::string fields, kernels;
    for (const ArgField& f : o.fields)
      fields += std::string(fields.empty() ? "" : ",") + "{\"name\":" + json_string(f.name) +
                ",\"offset\":" + std::to_string(f.offset) + ",\"kind\":" + json_string(kind_name(f.kind)) +
                ",\"count\":" + std::to_string(f.count) + "}";
    for (const KernelHost& k : o.kernels) kernels += std::string(kernels.empty() ? "" : ",") + json_string(k.kernel);
    out += std::string(out.size() > 1 ? "," : "") + json_string(o.op) +
           ":{\"args_size\":" + std::to_string(o.args_size) + ",\"fields\":[" + fields + "],\"kernels\":[" + kernels +
           "]}";
  }
  return out + "}";
}

}  // namespace rtc
