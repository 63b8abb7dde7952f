// Host side of the portable baseline kernel: one workgroup of 128 threads per 16 query rows of one (head, batch).
#include "op.h"

namespace attention_fwd {
namespace {

const AttentionFwdArgs& args_of(const void* p) { return *static_cast<const AttentionFwdArgs*>(p); }

void grid_of(const AttentionFwdArgs& a, unsigned (&grid)[3]) {
  grid[0] = unsigned((a.seq_q + 15) / 16);
  grid[1] = unsigned(a.heads);
  grid[2] = unsigned(a.batch);
}

// One workgroup per 16 query rows of one (head, batch): heads and batch are the grid's y and z,
// which CUDA and HIP limit to 65535; x (the row blocks) to 2^31 - 1.
std::string why_not(const void* p, const char*) {
  const AttentionFwdArgs& a = args_of(p);
  const int64_t kMaxYZ = 65535;
  if (a.heads > kMaxYZ)
    return "heads=" + std::to_string(a.heads) + " is not accepted by the baseline kernel; accepted: <= 65535 (grid y)";
  if (a.batch > kMaxYZ)
    return "batch=" + std::to_string(a.batch) + " is not accepted by the baseline kernel; accepted: <= 65535 (grid z)";
  return "";
}

int64_t workspace_bytes(const void*) { return 0; }

std::string plan_json(const void* p) {
  unsigned g[3];
  grid_of(args_of(p), g);
  return json_object({{"grid_x", g[0]}, {"grid_y", g[1]}, {"grid_z", g[2]}, {"block", 128}, {"workspace_bytes", 0}});
}

void launch_baseline(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionFwdArgs& a = args_of(p);
  const AttnParams params = fill_params(a);
  unsigned g[3];
  grid_of(a, g);
  launch(program, t, a, g, 128, 0, &params, sizeof params);
}

}  // namespace

rtc::KernelHost baseline_host() { return {"baseline", why_not, workspace_bytes, plan_json, launch_baseline}; }

}  // namespace attention_fwd
