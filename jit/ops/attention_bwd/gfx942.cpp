// Host side of the gfx942 backward (gfx942.hip): three launches of 256-thread blocks: delta a thread a query row,
// dK / dV a block per 64 keys of one K/V head, dQ a block per 64 query rows of one head.
#include "op.h"

namespace attention_bwd {
namespace {

const AttentionBwdArgs& args_of(const void* p) { return *static_cast<const AttentionBwdArgs*>(p); }

constexpr int kThreads = 256, kBlock = 64;

// The grid of each stage: (blocks along the rows or keys, heads, batch). y and z are limited to 65535.
void grid_of(const AttentionBwdArgs& a, int stage, unsigned (&grid)[3]) {
  const int64_t along = stage == BWD_STAGE_DELTA  ? (a.seq_q + kThreads - 1) / kThreads
                        : stage == BWD_STAGE_DKDV ? (a.seq_k + kBlock - 1) / kBlock
                                                  : (a.seq_q + kBlock - 1) / kBlock;
  grid[0] = unsigned(along);
  grid[1] = unsigned(stage == BWD_STAGE_DKDV ? a.heads_k : a.heads);
  grid[2] = unsigned(a.batch);
}

std::string why_not(const void* p, const char*) {
  const AttentionBwdArgs& a = args_of(p);
  const int64_t kMaxYZ = 65535;
  if (a.heads > kMaxYZ)
    return "heads=" + std::to_string(a.heads) + " is not accepted by the gfx942 kernel; accepted: <= 65535 (grid y)";
  if (a.batch > kMaxYZ)
    return "batch=" + std::to_string(a.batch) + " is not accepted by the gfx942 kernel; accepted: <= 65535 (grid z)";
  return "";
}

int64_t workspace_bytes(const void* p) { return delta_bytes(args_of(p)); }

std::string plan_json(const void* p) {
  const AttentionBwdArgs& a = args_of(p);
  unsigned d[3], kv[3], q[3];
  grid_of(a, BWD_STAGE_DELTA, d);
  grid_of(a, BWD_STAGE_DKDV, kv);
  grid_of(a, BWD_STAGE_DQ, q);
  return attention_fwd::json_object({{"delta_grid_x", d[0]},
                                     {"dkdv_grid_x", kv[0]},
                                     {"dkdv_grid_y", kv[1]},
                                     {"dq_grid_x", q[0]},
                                     {"grid_z", q[2]},
                                     {"block", kThreads},
                                     {"workspace_bytes", delta_bytes(a)}});
}

// The three stages in order on the call's stream: each reads what the one before wrote.
void launch_gfx942(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionBwdArgs& a = args_of(p);
  BwdParams params = fill_params(a);
  for (int stage : {BWD_STAGE_DELTA, BWD_STAGE_DKDV, BWD_STAGE_DQ}) {
    unsigned g[3];
    grid_of(a, stage, g);
    params.stage = stage;
    launch(program, t, a, g, kThreads, 0, params);
  }
}

}  // namespace

rtc::KernelHost gfx942_host() { return {"gfx942", why_not, workspace_bytes, plan_json, launch_gfx942}; }

}  // namespace attention_bwd
