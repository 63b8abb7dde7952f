// Host side of the sm_90a backward (sm90.cu): three launches of 256-thread CTAs: delta a thread a query row, dK / dV
// a CTA per key block of one K/V head, dQ (or, without `deterministic`, DQ_STORE of the fp32 sums the dK / dV stage
// added dQ into) a CTA per 128 query rows of one head; the tiles of each bucket from the plan the kernel reads
// (sm90/plan.h).
#include "op.h"
#include "common.h"
#include "sm90/plan.h"

namespace attention_bwd {
namespace {

const AttentionBwdArgs& args_of(const void* p) { return *static_cast<const AttentionBwdArgs*>(p); }

BwdSm90Plan plan_of(const AttentionBwdArgs& a) { return bwd_sm90_plan(int(a.head_dim)); }

// Whether the call has a window (the variant's RTC_MASK: the forward's rule).
bool masked(const AttentionBwdArgs& a) { return ::masked(forward_call(a)); }
// A score modification and dropout both on (the plan's dq_keys_mods_drop).
bool mods_drop(const AttentionBwdArgs& a) { return score_mod(forward_call(a)) != 0 && dropout(forward_call(a)) != 0; }

// Without `deterministic`, dQ is added up in fp32 by the dK / dV stage (sm90/dq_accum.h), at the buckets that fuse it.
bool fused(const AttentionBwdArgs& a) { return a.deterministic == 0 && bwd_sm90_dq_fused(plan_of(a)); }
bool packed(const AttentionBwdArgs& a) { return kv_mode(forward_call(a)) != RTC_KV_DENSE; }

// The workspace: delta (fp32, the LSE's layout), then (fused) the dQ sums from the next 16-byte boundary.
int64_t accum_offset(const AttentionBwdArgs& a) { return (delta_bytes(a) + 15) / 16 * 16; }
int64_t accum_bytes(const AttentionBwdArgs& a) {
  if (!fused(a)) return 0;
  const int64_t blocks = bwd_sm90_dq_blocks(packed(a), a.batch, a.seq_q, a.total_q);
  return blocks * a.heads * bwd_sm90_dq_chunks(plan_of(a)) * BWD_SM90_DQ_TILE * int64_t(sizeof(float));
}

// The blocks of each stage: delta a thread a row, dK / dV and dQ (DQ_STORE the same) the bucket's tiles.
StageBlocks blocks_of(const AttentionBwdArgs& a) {
  const BwdSm90Plan pl = plan_of(a);
  return {BWD_SM90_THREADS, bwd_sm90_kv_keys(pl), bwd_sm90_dq_rows(pl)};
}

unsigned shared_of(const AttentionBwdArgs& a, int stage) {
  const BwdSm90Plan pl = plan_of(a);
  return stage == BWD_STAGE_DELTA  ? 0u
         : stage == BWD_STAGE_DKDV ? unsigned(bwd_sm90_dkdv_smem(pl))
                                   : unsigned(bwd_sm90_dq_smem(pl, masked(a), mods_drop(a)));
}

std::string why_not(const void* p, const char* vendor) {
  const AttentionBwdArgs& a = args_of(p);
  if (!vendor || std::string(vendor) != "cuda")
    return std::string("vendor=") + rtc::quote(vendor ? vendor : "(null)") +
           " is not accepted by the sm90 kernel; accepted: cuda";
  const int64_t d_max = kBwdSm90Plans[kBwdSm90PlanCount - 1].head_dim;
  if (a.head_dim < 8 || a.head_dim > d_max || a.head_dim % 8 != 0)
    return "head_dim=" + std::to_string(a.head_dim) +
           " is not accepted by the sm90 kernel; accepted: a multiple of 8 in [8, " + std::to_string(d_max) + "]";
  // Rows read by 16-byte copies; gradients stored as pairs of elements.
  const struct {
    const char* name;
    const void* ptr;
    const int64_t (&st)[3];
    int64_t align;
  } tensors[] = {{"q", a.q, a.q_strides, 8},          {"k", a.k, a.k_strides, 8},    {"v", a.v, a.v_strides, 8},
                 {"dout", a.dout, a.dout_strides, 8}, {"dq", a.dq, a.dq_strides, 2}, {"dk", a.dk, a.dk_strides, 2},
                 {"dv", a.dv, a.dv_strides, 2}};
  for (const auto& t : tensors) {
    const std::string why = attention_fwd::aligned_why_not("sm90", t.name, t.ptr, t.st, t.align);
    if (!why.empty()) return why;
  }
  return grid_why_not(a, "sm90");
}

int64_t workspace_bytes(const void* p) {
  const AttentionBwdArgs& a = args_of(p);
  return fused(a) ? accum_offset(a) + accum_bytes(a) : delta_bytes(a);
}

std::string plan_json(const void* p) {
  const AttentionBwdArgs& a = args_of(p);
  const BwdSm90Plan pl = plan_of(a);
  std::vector<std::pair<std::string, int64_t>> f = {{"head_dim_bucket", pl.head_dim},
                                                    {"kv_keys", bwd_sm90_kv_keys(pl)},
                                                    {"kv_split", pl.kv_split},
                                                    {"dq_rows", bwd_sm90_dq_rows(pl)},
                                                    {"dq_keys", bwd_sm90_dq_keys(pl, masked(a), mods_drop(a))}};
  for (auto& g : grid_fields(a, blocks_of(a))) f.push_back(g);
  const std::vector<std::pair<std::string, int64_t>> rest = {
      {"block", BWD_SM90_THREADS},
      {"dkdv_shared_bytes", bwd_sm90_dkdv_smem(pl)},
      {"dq_shared_bytes", bwd_sm90_dq_smem(pl, masked(a), mods_drop(a))},
      {"dq_fused", fused(a) ? 1 : 0},
      {"dq_accum_offset", fused(a) ? accum_offset(a) : 0},
      {"workspace_bytes", workspace_bytes(p)}};
  f.insert(f.end(), rest.begin(), rest.end());
  return attention_fwd::json_object(f);
}

// The three stages in order on the call's stream: each reads what the one before wrote.
void launch_sm90(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionBwdArgs& a = args_of(p);
  BwdParams params = fill_params(a);
  if (fused(a)) params.dq_accum = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + accum_offset(a));
  launch_stages(program, t, a, params, {BWD_STAGE_DELTA, BWD_STAGE_DKDV, fused(a) ? BWD_STAGE_DQ_STORE : BWD_STAGE_DQ},
                blocks_of(a), BWD_SM90_THREADS, [&](int stage) { return shared_of(a, stage); });
}

}  // namespace

rtc::KernelHost sm90_host() { return {"sm90", why_not, workspace_bytes, plan_json, launch_sm90}; }

}  // namespace attention_bwd
