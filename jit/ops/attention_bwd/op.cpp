// attention_bwd's registration: its argument block, the checks every kernel relies on, its kernels.
#include "op.h"
#include "common.h"
#include <cstring>
#include <vector>

namespace attention_bwd {
namespace {

// The gradients' tensors as [batch, rows, heads] views of head_dim 16-bit elements: dO and dQ q's (and o's) extent,
// dK and dV k's.
struct GradView {
  const char* name;
  const void* base;
  int64_t batch, rows, heads;
  const int64_t (&st)[3];
};

std::vector<GradView> grad_views(const AttentionBwdArgs& a) {
  const bool packed = kv_mode(forward_call(a)) != RTC_KV_DENSE;
  const int64_t qb = packed ? 1 : a.batch, qs = packed ? a.total_q : a.seq_q;
  const int64_t kb = packed ? 1 : a.batch, ks = packed ? a.total_k : a.seq_k;
  return {{"dout", a.dout, qb, qs, a.heads, a.dout_strides},
          {"dq", a.dq, qb, qs, a.heads, a.dq_strides},
          {"dk", a.dk, kb, ks, a.heads_k, a.dk_strides},
          {"dv", a.dv, kb, ks, a.heads_k, a.dv_strides}};
}

void validate(const void* p) {
  const AttentionBwdArgs& a = *static_cast<const AttentionBwdArgs*>(p);
  RTC_CHECK(!a.block_table && a.kv_dtype == RTC_KV_DTYPE_SAME, RTC_ERR_ARG,
            std::string(a.block_table ? "block_table is set" : "kv_dtype=" + std::to_string(a.kv_dtype)) +
                " on a backward call; accepted: K / V dense or packed (cu_seqlens) in q's dtype: a paged or "
                "quantized cache takes no gradients");
  RTC_CHECK(!a.seqused_k, RTC_ERR_ARG,
            "seqused_k is set on a backward call; accepted: none (each sequence's keys from cu_seqlens_k)");
  RTC_CHECK(a.lse, RTC_ERR_ARG, "lse is null on a backward call; accepted: the forward's LSE (fp32)");
  attention_fwd::validate_args(forward_call(a));
  for (const GradView& t : grad_views(a)) {
    RTC_CHECK(t.base, RTC_ERR_ARG, std::string(t.name) + " pointer is null; accepted: a tensor of the call's shape");
    RTC_CHECK(attention_fwd::view_bytes(t.batch, t.rows, t.heads, a.head_dim, t.st, 2) >= 0, RTC_ERR_ARG,
              std::string(t.name) + "_strides=(" + std::to_string(t.st[0]) + ", " + std::to_string(t.st[1]) + ", " +
                  std::to_string(t.st[2]) + ") span more than 2^63 bytes; accepted: a view of addressable size");
  }
  RTC_CHECK(a.deterministic == 0 || a.deterministic == 1, RTC_ERR_ARG,
            "deterministic=" + std::to_string(a.deterministic) + " is not accepted; accepted: 0 or 1");
}

#define ATTENTION_BWD_FIELD(name, type, kind, count) RTC_ARG_FIELD(AttentionBwdArgs, name, kind, count),
const rtc::OpRegistration kOp({"attention_bwd",
                               sizeof(AttentionBwdArgs),
                               {ATTENTION_BWD_ARGS(ATTENTION_BWD_FIELD)},
                               validate,
                               {sm90_host(), gfx942_host(), baseline_host()}});

}  // namespace

AttentionFwdArgs forward_call(const AttentionBwdArgs& a) {
  AttentionFwdArgs f;
#define ATTENTION_BWD_COPY(name, type, kind, count) std::memcpy(&f.name, &a.name, sizeof f.name);
  ATTENTION_FWD_ARGS(ATTENTION_BWD_COPY)
#undef ATTENTION_BWD_COPY
  return f;
}

int64_t delta_bytes(const AttentionBwdArgs& a) {
  const bool packed = kv_mode(forward_call(a)) != RTC_KV_DENSE;
  return (packed ? a.total_q : a.batch * a.seq_q) * a.heads * int64_t(sizeof(float));
}

BwdParams fill_params(const AttentionBwdArgs& a) {
  BwdParams p;
  std::memset(&p, 0, sizeof p);
  p.a = attention_fwd::fill_params(forward_call(a));
  p.dout = static_cast<const rtc_elem_t*>(a.dout);
  p.do_sb = a.dout_strides[0];
  p.do_ss = a.dout_strides[1];
  p.do_sh = a.dout_strides[2];
  p.dlse = a.dlse;
  p.dq = static_cast<rtc_elem_t*>(a.dq);
  p.dq_sb = a.dq_strides[0];
  p.dq_ss = a.dq_strides[1];
  p.dq_sh = a.dq_strides[2];
  p.dk = static_cast<rtc_elem_t*>(a.dk);
  p.dk_sb = a.dk_strides[0];
  p.dk_ss = a.dk_strides[1];
  p.dk_sh = a.dk_strides[2];
  p.dv = static_cast<rtc_elem_t*>(a.dv);
  p.dv_sb = a.dv_strides[0];
  p.dv_ss = a.dv_strides[1];
  p.dv_sh = a.dv_strides[2];
  p.delta = static_cast<float*>(a.workspace);
  p.stage = BWD_STAGE_DELTA;
  return p;
}

void launch(uint64_t program, const rtc::LaunchTarget& t, const AttentionBwdArgs& a, const unsigned (&grid)[3],
            unsigned block, unsigned shared_bytes, const BwdParams& params) {
  std::vector<rtc_mem_range> ranges = attention_fwd::tensor_ranges(forward_call(a));
  for (const GradView& g : grad_views(a))
    attention_fwd::add_view(ranges, g.base, 2, g.batch, g.rows, g.heads, a.head_dim, g.st);
  if (a.dlse) ranges.push_back(rtc_mem_range{a.dlse, uint64_t(delta_bytes(a))});
  attention_fwd::launch_within(program, t, ranges, grid, block, shared_bytes, &params, sizeof params);
}

void stage_grid(const AttentionBwdArgs& a, int stage, const StageBlocks& b, unsigned (&grid)[3]) {
  const int64_t per = stage == BWD_STAGE_DELTA ? b.delta_rows : stage == BWD_STAGE_DKDV ? b.kv_keys : b.dq_rows;
  grid[0] = unsigned(((stage == BWD_STAGE_DKDV ? a.seq_k : a.seq_q) + per - 1) / per);
  grid[1] = unsigned(stage == BWD_STAGE_DKDV ? a.heads_k : a.heads);
  grid[2] = unsigned(a.batch);
}

std::string grid_why_not(const AttentionBwdArgs& a, const char* kernel) {
  const int64_t kMaxYZ = 65535;
  if (a.heads > kMaxYZ)
    return "heads=" + std::to_string(a.heads) + " is not accepted by the " + kernel +
           " kernel; accepted: <= 65535 (grid y)";
  if (a.batch > kMaxYZ)
    return "batch=" + std::to_string(a.batch) + " is not accepted by the " + kernel +
           " kernel; accepted: <= 65535 (grid z)";
  return "";
}

std::vector<std::pair<std::string, int64_t>> grid_fields(const AttentionBwdArgs& a, const StageBlocks& b) {
  unsigned d[3], kv[3], q[3];
  stage_grid(a, BWD_STAGE_DELTA, b, d);
  stage_grid(a, BWD_STAGE_DKDV, b, kv);
  stage_grid(a, BWD_STAGE_DQ, b, q);
  return {
      {"delta_grid_x", d[0]}, {"dkdv_grid_x", kv[0]}, {"dkdv_grid_y", kv[1]}, {"dq_grid_x", q[0]}, {"grid_z", q[2]}};
}

void launch_stages(uint64_t program, const rtc::LaunchTarget& t, const AttentionBwdArgs& a, BwdParams params,
                   std::initializer_list<int> stages, const StageBlocks& b, unsigned block,
                   const std::function<unsigned(int)>& shared_bytes) {
  for (int stage : stages) {
    unsigned g[3];
    stage_grid(a, stage, b, g);
    params.stage = stage;
    launch(program, t, a, g, block, shared_bytes ? shared_bytes(stage) : 0u, params);
  }
}

}  // namespace attention_bwd
