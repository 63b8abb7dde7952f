// Host pieces the attention_bwd kernels share: the forward call of a backward call, the parameter block, one launch.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>
#include "args.h"
#include "bwd_params.h"
#include "../attention_fwd/op.h"

namespace attention_bwd {

// The forward call whose gradients a backward call asks for: the shared fields, copied by the forward's list.
AttentionFwdArgs forward_call(const AttentionBwdArgs& a);
// Bytes of delta (fp32, the LSE's layout) in the workspace.
int64_t delta_bytes(const AttentionBwdArgs& a);
// The kernels' parameter block, filled from checked arguments (stage BWD_STAGE_DELTA).
BwdParams fill_params(const AttentionBwdArgs& a);
// Launches program with the by-value parameter block; the memory it may touch: the forward's tensors and the
// gradients'.
void launch(uint64_t program, const rtc::LaunchTarget& t, const AttentionBwdArgs& a, const unsigned (&grid)[3],
            unsigned block, unsigned shared_bytes, const BwdParams& params);

// The three stages every backward kernel launches in order (delta; dK / dV; dQ or DQ_STORE), each on a grid of
// (blocks along its rows or keys, heads (K/V heads for dK / dV), batch): a kernel's blocks along them.
struct StageBlocks {
  int64_t delta_rows;  // query rows a delta block takes (a thread a row)
  int64_t kv_keys;     // keys a dK / dV block takes
  int64_t dq_rows;     // query rows a dQ block takes
};
// The grid of one stage.
void stage_grid(const AttentionBwdArgs& a, int stage, const StageBlocks& b, unsigned (&grid)[3]);
// "" when the grids' y and z (heads, batch) are at most 65535, else why not, naming the kernel.
std::string grid_why_not(const AttentionBwdArgs& a, const char* kernel);
// The plan's grid fields: delta_grid_x, dkdv_grid_x, dkdv_grid_y, dq_grid_x, grid_z.
std::vector<std::pair<std::string, int64_t>> grid_fields(const AttentionBwdArgs& a, const StageBlocks& b);
// Launches `stages` in order on the call's stream (each reads what the one before wrote), `block` threads a block,
// shared_bytes(stage) of dynamic shared memory (none without it).
void launch_stages(uint64_t program, const rtc::LaunchTarget& t, const AttentionBwdArgs& a, BwdParams params,
                   std::initializer_list<int> stages, const StageBlocks& b, unsigned block,
                   const std::function<unsigned(int)>& shared_bytes = nullptr);

// A kernel with nothing but its blocks to plan (baseline, gfx942): the three stages at fixed blocks, the workspace
// delta alone; its host from the name, the threads a block and the blocks.
struct PlainKernel {
  const char* name;
  unsigned threads;
  StageBlocks blocks;
};
template <const PlainKernel& K>
rtc::KernelHost plain_host() {
  struct Host {
    static const AttentionBwdArgs& args(const void* p) { return *static_cast<const AttentionBwdArgs*>(p); }
    static std::string why_not(const void* p, const char*) { return grid_why_not(args(p), K.name); }
    static int64_t workspace_bytes(const void* p) { return delta_bytes(args(p)); }
    static std::string plan_json(const void* p) {
      auto f = grid_fields(args(p), K.blocks);
      f.push_back({"block", K.threads});
      f.push_back({"workspace_bytes", delta_bytes(args(p))});
      return attention_fwd::json_object(f);
    }
    static void launch(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
      launch_stages(program, t, args(p), fill_params(args(p)), {BWD_STAGE_DELTA, BWD_STAGE_DKDV, BWD_STAGE_DQ},
                    K.blocks, K.threads);
    }
  };
  return {K.name, Host::why_not, Host::workspace_bytes, Host::plan_json, Host::launch};
}

rtc::KernelHost gfx942_host();
rtc::KernelHost baseline_host();
rtc::KernelHost sm90_host();

}  // namespace attention_bwd
