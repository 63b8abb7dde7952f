// Host side of the sm_90a decode kernel: what it accepts (few query rows per sequence), the KV split planner, the
// workspace of the split parts, the plan as JSON, and one or two launches per call (attention, then the merge).
#include "op.h"
#include "common.h"
#include "sm90_decode/params.h"
#include "sm90_tma.h"
#include <algorithm>
#include <cstring>
#include <string>

namespace attention_fwd {
namespace {

// The kernel takes the block by value, its tensor maps 64-byte aligned where TMA reads them.
static_assert(alignof(Sm90DecodeParams) == 64 && alignof(Sm90TensorMap) == 64 && sizeof(Sm90DecodeParams) % 64 == 0,
              "Sm90DecodeParams: the tensor maps must be 64-byte aligned");

const AttentionFwdArgs& args_of(const void* p) { return *static_cast<const AttentionFwdArgs*>(p); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The split planner: a part keeps at least kMinStepsPerPart stages (128 to 512 keys); writing its partial (16 rows x the
// bucket in fp32 per row tile) and reading it back in the merge costs about kPartialSteps of its stages' time, and the
// merge launch about kMergeSteps. Assumptions checked against the decode bench (docs/NOTES.md, "sm90 decode kernel").
constexpr int kMinStepsPerPart = 4;
constexpr double kPartialSteps = 0.5;
constexpr double kMergeSteps = 2.0;

struct Plan {
  int bucket = 0, keys = 0, group = 0, row_tiles = 1, chunks = 0, splits = 1, slots = 0;
  int64_t items = 0;  // B * Hk * chunks
  int64_t steps = 0;  // K/V stages (the plan's keys) of a max_seqlen_k sequence
  int64_t workspace_bytes = 0;
  int64_t smem = 0;
};

// Time of g parts per item in stage-times: the rounds of resident CTAs (slots: SMs x CTAs an SM holds) times a
// part's stages (and its partial), plus the merge. The KV reads are the same bytes for every g; what g changes is how
// many SMs read them at once and how long the last round runs.
double split_cost(const Plan& pl, int64_t g) {
  const double part = double(ceil_div(pl.steps, g)) + (g > 1 ? kPartialSteps : 0.0);
  return double(ceil_div(pl.items * g, pl.slots)) * part + (g > 1 ? kMergeSteps : 0.0);
}

Plan make_plan(const AttentionFwdArgs& a) {
  Plan pl;
  const Sm90DecodePlan dp = sm90_decode_plan(int(a.head_dim), a.kv_dtype);
  pl.bucket = dp.head_dim;
  pl.keys = dp.keys;
  pl.group = int(a.heads / a.heads_k);
  // Row tiles: the fewest of 1, 2, 4 that hold the group x Sq packed rows (at most 4 / col_split, one per warp's
  // column share, and what fits the shared memory: larger groups take chunks).
  pl.row_tiles =
      sm90_decode_row_tiles(dp, int(std::min<int64_t>(ceil_div(int64_t(pl.group) * a.seq_q, DECODE_ROWS), 4)));
  pl.smem = sm90_decode_smem_bytes(dp, pl.row_tiles);
  pl.chunks = int(ceil_div(int64_t(pl.group) * a.seq_q, int64_t(DECODE_ROWS) * pl.row_tiles));
  pl.items = a.batch * a.heads_k * pl.chunks;
  pl.steps = ceil_div(a.seq_k, pl.keys);
  pl.slots = a.num_cus > 0 ? a.num_cus * sm90_decode_ctas_per_sm(dp, pl.row_tiles) : 0;
  pl.splits = decode_splits(a, pl.steps, kMinStepsPerPart, pl.slots > 0 && pl.items > 0,
                            [&](int64_t g) { return split_cost(pl, g); });
  pl.workspace_bytes = pl.splits > 1 ? pl.items * pl.splits * pl.row_tiles * decode_part_bytes(pl.bucket) : 0;
  return pl;
}

std::string why_not(const void* p, const char* vendor) {
  const AttentionFwdArgs& a = args_of(p);
  if (!vendor || std::string(vendor) != "cuda")
    return std::string("vendor=") + rtc::quote(vendor ? vendor : "(null)") +
           " is not accepted by the sm90_decode kernel; accepted: cuda";
  const char* rows = kv_mode(a) == RTC_KV_DENSE ? "seq_q" : "max_seqlen_q";
  if (a.seq_q > DECODE_MAX_Q)
    return std::string(rows) + "=" + std::to_string(a.seq_q) +
           " is not accepted by the sm90_decode kernel; accepted: at most " + std::to_string(DECODE_MAX_Q) +
           " query rows per sequence (decode; longer calls go to the prefill kernel)";
  if (!sm90_decode_takes_kv(a.kv_dtype))
    return "kv_dtype=" + std::to_string(a.kv_dtype) +
           " is not accepted by the sm90_decode kernel; accepted: 0 (same: K/V in q's dtype), 1 (fp8_e4m3), 3 "
           "(fp4_e2m1)";
  const int d_max = kSm90DecodePlans[kSm90DecodePlanCount - 1].head_dim;
  // q: 16-byte cp.async pieces; k, v: TMA rows (16-byte aligned, strides multiples of 16 bytes: 8 elements, or 16
  // bytes of a quantized cache); o: 4-byte stores.
  if (a.head_dim < 8 || a.head_dim > d_max || a.head_dim % 8 != 0)
    return "head_dim=" + std::to_string(a.head_dim) +
           " is not accepted by the sm90_decode kernel; accepted: a multiple of 8 in [8, " + std::to_string(d_max) +
           "]";
  const int64_t kv_align = 16 / kv_unit_bytes(a);
  const struct {
    const char* name;
    const void* ptr;
    const int64_t (&st)[3];
    int64_t align;
  } tensors[] = {{"q", a.q, a.q_strides, 8},
                 {"k", a.k, a.k_strides, kv_align},
                 {"v", a.v, a.v_strides, kv_align},
                 {"o", a.o, a.o_strides, 2}};
  for (const auto& t : tensors) {
    const std::string why = aligned_why_not("sm90_decode", t.name, t.ptr, t.st, t.align);
    if (!why.empty()) return why;
  }
  const Plan pl = make_plan(a);
  if (pl.items * pl.splits >= (int64_t(1) << 31))
    return "batch*heads_k*ceil(heads/heads_k*" + std::string(rows) +
           "/(16*row_tiles))*splits=" + std::to_string(pl.items * pl.splits) +
           " CTAs is too many for the sm90_decode kernel; accepted: < 2^31";
  return "";
}

int64_t workspace_bytes(const void* p) { return make_plan(args_of(p)).workspace_bytes; }

// CTAs of each stage, in launch order: the attention stage, then the merge (one per item and 32 columns) when split.
std::vector<std::pair<int, int64_t>> stages(const Plan& pl) {
  std::vector<std::pair<int, int64_t>> s = {{DECODE_STAGE_ATTN, pl.items * pl.splits}};
  if (pl.splits > 1) s.push_back({DECODE_STAGE_MERGE, pl.items * sm90_decode_merge_slices(pl.bucket)});
  return s;
}

std::string plan_json(const void* p) {
  const AttentionFwdArgs& a = args_of(p);
  const Plan pl = make_plan(a);
  std::vector<std::pair<std::string, int64_t>> f = {
      {"bucket", pl.bucket},
      {"group", pl.group},
      {"row_tiles", pl.row_tiles},
      {"chunks", pl.chunks},
      {"items", pl.items},
      {"steps", pl.steps},
      {"step_keys", pl.keys},
      {"stages", sm90_decode_plan(int(a.head_dim), a.kv_dtype).stages},
      {"col_split", sm90_decode_plan(int(a.head_dim), a.kv_dtype).col_split},
      {"slots", pl.slots},
      {"splits", pl.splits},
      {"planned_steps", pl.slots > 0 ? int64_t(split_cost(pl, pl.splits)) : 0},
      {"workspace_bytes", pl.workspace_bytes},
      {"shared_bytes", pl.smem},
      {"block", SM90_DECODE_THREADS}};
  const char* names[] = {"grid_attn", "grid_merge"};
  for (const auto& s : stages(pl)) f.push_back({names[s.first], s.second});
  return json_object(f);
}

void launch_decode(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionFwdArgs& a = args_of(p);
  require_tensor_maps("sm90_decode");
  const Plan pl = make_plan(a);
  require_workspace(a, pl.workspace_bytes, "the sm90_decode kernel");
  alignas(64) Sm90DecodeParams dp;
  std::memset(&dp, 0, sizeof dp);
  const KvMaps kv = sm90_kv_maps(a, unsigned(pl.keys));
  dp.tmap_k = kv.k;
  dp.tmap_v = kv.v;
  dp.kv_box = kv.box_rows;
  dp.page_shift = kv.page_shift;
  static_cast<AttnParams&>(dp) = fill_params(a);
  dp.tail_split = pl.splits;
  dp.group = pl.group;
  dp.chunks = pl.chunks;
  dp.splits = pl.splits;
  dp.row_tiles = pl.row_tiles;
  // Same stream, in order, so the merge sees the parts' partials.
  for (const auto& s : stages(pl)) {
    if (s.second == 0) continue;  // no sequence, no K/V head: nothing to write
    dp.stage = s.first;
    const unsigned grid[3] = {unsigned(s.second), 1, 1};
    launch(program, t, a, grid, SM90_DECODE_THREADS, unsigned(s.first == DECODE_STAGE_ATTN ? pl.smem : 0), &dp,
           sizeof dp);
  }
}

}  // namespace

rtc::KernelHost sm90_decode_host() { return {"sm90_decode", why_not, workspace_bytes, plan_json, launch_decode}; }

}  // namespace attention_fwd
