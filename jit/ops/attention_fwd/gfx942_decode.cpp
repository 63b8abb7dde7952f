// Host side of the gfx942 decode kernel: what it accepts (few query rows per sequence), the KV split planner, the
// workspace of the split parts, the plan as JSON, and one or two launches per call (attention, then the merge).
#include "op.h"
#include "common.h"
#include "gfx942/params.h"
#include "gfx942_decode/params.h"
#include <algorithm>
#include <cstring>
#include <string>

namespace attention_fwd {
namespace {

// AttnParams is trivial, so the derived fields start right after it on the host and on the GPU.
static_assert(sizeof(DecodeParams) == sizeof(AttnParams) + 16, "DecodeParams size changed: check the kernel");

// The split planner's picture of the GPU: the device's HBM bandwidth and LDS per CU (the argument block's hbm_gbps
// and lds_per_cu, which Python fills from the manifest's machine of the arch: MI300X 5.3 TB/s and 64 KB for gfx942,
// MI355X 8 TB/s and 160 KB for gfx950; unknown (<= 0): MI300X's), the kernel's resident waves per CU (one-wave
// workgroups; 4 SIMDs of the waves the kernel is built for on the arch, gfx_arch, decode_min_waves:
// tests/cpu/test_gfx942_decode_isa.py, as many as the CU's LDS holds), the time of a round trip to memory under load,
// and the part of a step's instructions its loads do not overlap (a wave requests the K of the step decode_ahead steps
// on after a step's S^T MFMAs and its V after the LDS write: decode_ahead steps share a round trip, each adding that
// part, after a first round trip that fills the pipeline): the S^T MFMAs for a 16-bit cache; a quantized step also
// expands its K and V, about 0.8 us a step at d128 as the static model replays the loops (docs/NOTES.md).
// Assumptions, not measurements: docs/design-gfx942-decode.md.
constexpr int kDefaultLdsPerCu = 64 * 1024;
constexpr double kDefaultHbmGbps = 5300.0;
int waves_per_cu(int bucket, int kv_dtype, int gfx, int lds_per_cu) {
  return std::min(4 * decode_min_waves(bucket, kv_dtype, gfx), lds_per_cu / decode_lds_bytes(bucket));
}
constexpr double kRoundTripNs = 2000.0;
double step_math_ns(int kv_dtype) { return kv_dtype == RTC_KV_DTYPE_SAME ? 200.0 : 800.0; }
constexpr int kMinStepsPerPart = 4;

const AttentionFwdArgs& args_of(const void* p) { return *static_cast<const AttentionFwdArgs*>(p); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Plan {
  int bucket = 0, group = 0, chunks = 0, splits = 1;
  int64_t items = 0;  // B * Hk * chunks
  int64_t rows = 0;   // packed q rows of the call, B * Hq * Sq: the rows a split writes partials for
  int64_t steps = 0;  // KV steps of one item (packed: of a max_seqlen_k sequence), the planner's input
  int64_t workspace_bytes = 0;
  int merge_tiles = 0;   // merge workgroups per item: the call's 16-column tiles of O
  int merge_groups = 1;  // part groups of the merge's lanes for an item of the most rows (decode_merge_groups)
  int kv_dtype = RTC_KV_DTYPE_SAME;
  double row_bytes = 0;  // bytes the kernel reads per key row of K or of V (the bucket's columns; FP4: its scale)
  double hbm_bytes_per_ns = kDefaultHbmGbps;  // the device's (hbm_gbps; 1 GB/s is a byte a ns)
  int lds_per_cu = kDefaultLdsPerCu;
  int gfx = 0;  // the arch (gfx_arch): the waves its code object is built for (decode_min_waves)
};

// splits: a planned split (tail_split -1) takes the fewest parts of the least estimated time: the attention stage
// is bound by HBM (every (sequence, K/V head)'s K and V once, the later chunks of one finding them in L2, plus the
// partials of the call's rows written and read back) or by its waves' steps (rounds of resident workgroups x a part's time:
// part_ns), whichever is longer; the merge adds its round trips, one per DECODE_MERGE_BATCH x merge_groups parts. Each
// part keeps kMinStepsPerPart steps. The forced, capped (max_splits) and refused (tail_split 0, NO_TAIL) splits are
// every decode host's: decode_splits (op.cpp).
// A wave's time for n steps: a round trip shared by decode_ahead steps plus each step's math, and the rest of the
// first round trip (the pipeline filling); decode_ahead 1: n x (round trip + math).
double part_ns(int64_t n, int bucket, int kv_dtype, int gfx) {
  const double ahead = decode_ahead(bucket, kv_dtype, gfx);
  return double(n) * (kRoundTripNs / ahead + step_math_ns(kv_dtype)) + kRoundTripNs * (ahead - 1.0) / ahead;
}

double split_ns(const Plan& pl, int cus, int64_t g) {
  const double step_bytes = 2.0 * decode_step_keys(pl.bucket) * pl.row_bytes;  // K and V
  const double partials = g > 1 ? 2.0 * double(pl.rows) * g * decode_part_row_bytes(pl.bucket) : 0.0;
  const double hbm = (double(pl.items / pl.chunks) * pl.steps * step_bytes + partials) / pl.hbm_bytes_per_ns;
  const double rounds =
      double(ceil_div(pl.items * g, int64_t(cus) * waves_per_cu(pl.bucket, pl.kv_dtype, pl.gfx, pl.lds_per_cu)));
  const double waves = rounds * part_ns(ceil_div(pl.steps, g), pl.bucket, pl.kv_dtype, pl.gfx);
  const double merge = g > 1 ? double(ceil_div(g, int64_t(DECODE_MERGE_BATCH) * pl.merge_groups)) * kRoundTripNs : 0.0;
  return std::max(hbm, waves) + merge;
}

Plan make_plan(const AttentionFwdArgs& a) {
  Plan pl;
  pl.bucket = gfx942_bucket(int(a.head_dim));
  pl.group = int(a.heads / a.heads_k);
  pl.chunks = int(ceil_div(int64_t(pl.group) * a.seq_q, DECODE_ROWS));
  pl.items = a.batch * a.heads_k * pl.chunks;
  pl.rows = a.batch * a.heads * a.seq_q;
  pl.steps = ceil_div(a.seq_k, decode_step_keys(pl.bucket));
  pl.merge_tiles = int(ceil_div(a.head_dim, 16));
  pl.merge_groups = decode_merge_groups(int(std::min<int64_t>(int64_t(pl.group) * a.seq_q, DECODE_ROWS)));
  pl.kv_dtype = int(a.kv_dtype);
  pl.row_bytes = a.kv_dtype == RTC_KV_DTYPE_SAME ? 2.0 * pl.bucket
                 : rtc_kv_fp4(a.kv_dtype)        ? pl.bucket / 2.0 + 1.0
                                                 : double(pl.bucket);
  if (a.hbm_gbps > 0) pl.hbm_bytes_per_ns = a.hbm_gbps;
  if (a.lds_per_cu > 0) pl.lds_per_cu = a.lds_per_cu;
  pl.gfx = a.gfx_arch;
  const int cus = a.num_cus;
  pl.splits = decode_splits(a, pl.steps, kMinStepsPerPart, cus > 0 && pl.items > 0,
                            [&](int64_t g) { return split_ns(pl, cus, g); });
  pl.workspace_bytes = pl.splits > 1 ? pl.items * pl.splits * decode_part_bytes(pl.bucket) : 0;
  return pl;
}

// Workgroups of the attention stage: items x splits, and with more than one chunk per (sequence, K/V head) the units
// (parts of a (sequence, K/V head)) rounded up to 8, whose chunks go to one XCD (gfx942_decode/scheduler.h).
int64_t attn_grid(const Plan& pl) {
  const int64_t units = pl.items / pl.chunks * pl.splits;
  return pl.chunks == 1 ? units : ceil_div(units, 8) * 8 * pl.chunks;
}

std::string why_not(const void* p, const char* vendor) {
  const AttentionFwdArgs& a = args_of(p);
  const std::string v = vendor;
  if (v != "hip" && v != "host")
    return "vendor=" + rtc::quote(v) + " is not accepted by the gfx942_decode kernel; accepted: hip, host";
  const int mode = kv_mode(a);
  const char* rows = mode == RTC_KV_DENSE ? "seq_q" : "max_seqlen_q";
  if (a.seq_q > DECODE_MAX_Q)
    return std::string(rows) + "=" + std::to_string(a.seq_q) +
           " is not accepted by the gfx942_decode kernel; accepted: at most " + std::to_string(DECODE_MAX_Q) +
           " query rows per sequence (decode; longer calls go to the prefill kernel)";
  if (a.head_dim % 8 != 0 || gfx942_bucket(int(a.head_dim)) == 0)
    return "head_dim=" + std::to_string(a.head_dim) +
           " is not accepted by the gfx942_decode kernel; accepted: a multiple of 8 from 8 to 256";
  // q and o: one buffer resource over the rows of a (sequence, K/V head)'s group of q heads.
  const int64_t group = a.heads / a.heads_k;
  const struct {
    const char* name;
    const int64_t* st;
  } qo[] = {{"q", a.q_strides}, {"o", a.o_strides}};
  for (const auto& t : qo) {
    const int64_t span = decode_group_span_bytes(a.seq_q, t.st[1], group, t.st[2], a.head_dim);
    if (t.st[1] < 0 || t.st[2] < 0 || span >= (int64_t(1) << 32))
      return std::string(t.name) + "_strides=(" + std::to_string(t.st[0]) + ", " + std::to_string(t.st[1]) + ", " +
             std::to_string(t.st[2]) + ") over " + std::to_string(a.seq_q) + " rows and " + std::to_string(group) +
             " heads span " + std::to_string(span) +
             " bytes; the gfx942_decode kernel reads a (sequence, K/V head)'s q heads through one buffer resource "
             "and accepts non-negative row and head strides with a span below 4 GiB";
  }
  // K and V: one resource over a sequence's rows of a K/V head (dense, varlen) or over one page.
  const int64_t kv_rows = mode == RTC_KV_PAGED ? a.page_size : mode == RTC_KV_VARLEN ? a.total_k : a.seq_k;
  const struct {
    const char* name;
    int64_t stride;
  } kv[] = {{"k", a.k_strides[1]}, {"v", a.v_strides[1]}};
  for (const auto& t : kv) {
    const int64_t span = kv_rows <= 0 ? 0 : ((kv_rows - 1) * t.stride + kv_row_units(a)) * kv_unit_bytes(a);
    if (t.stride < 0 || span > int64_t(decode_no_row()))
      return std::string(t.name) + "_strides[1]=" + std::to_string(t.stride) + " over " + std::to_string(kv_rows) +
             " rows spans " + std::to_string(span) +
             " bytes; the gfx942_decode kernel accepts a non-negative row stride with a span of at most " +
             std::to_string(decode_no_row()) + " bytes (4 GiB - 16) per (sequence, K/V head) or page";
  }
  const Plan pl = make_plan(a);
  if (attn_grid(pl) >= (int64_t(1) << 31))
    return "batch*heads_k*ceil(heads/heads_k*" + std::string(rows) +
           "/16)*splits=" + std::to_string(pl.items * pl.splits) +
           " workgroups is too many for the gfx942_decode kernel; accepted: < 2^31";
  return "";
}

int64_t workspace_bytes(const void* p) { return make_plan(args_of(p)).workspace_bytes; }

// Workgroups of each stage, in launch order: the attention stage, then the merge (one per item and 16-column tile of
// O) when split.
std::vector<std::pair<int, int64_t>> stages(const Plan& pl) {
  std::vector<std::pair<int, int64_t>> s = {{DECODE_STAGE_ATTN, attn_grid(pl)}};
  if (pl.splits > 1) s.push_back({DECODE_STAGE_MERGE, pl.items * pl.merge_tiles});
  return s;
}

std::string plan_json(const void* p) {
  const AttentionFwdArgs& a = args_of(p);
  const Plan pl = make_plan(a);
  const int64_t planned_ns = a.num_cus > 0 ? int64_t(split_ns(pl, a.num_cus, pl.splits)) : 0;
  std::vector<std::pair<std::string, int64_t>> f = {{"bucket", pl.bucket},
                                                    {"group", pl.group},
                                                    {"chunks", pl.chunks},
                                                    {"items", pl.items},
                                                    {"steps", pl.steps},
                                                    {"step_keys", decode_step_keys(pl.bucket)},
                                                    {"steps_ahead", decode_ahead(pl.bucket, pl.kv_dtype, pl.gfx)},
                                                    {"splits", pl.splits},
                                                    {"merge_tiles", pl.merge_tiles},
                                                    {"merge_groups", pl.merge_groups},
                                                    {"planned_ns", planned_ns},
                                                    {"workspace_bytes", pl.workspace_bytes},
                                                    {"block", DECODE_THREADS}};
  const char* names[] = {"grid_attn", "grid_merge"};
  for (const auto& s : stages(pl)) f.push_back({names[s.first], s.second});
  return json_object(f);
}

void launch_decode(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionFwdArgs& a = args_of(p);
  const Plan pl = make_plan(a);
  require_workspace(a, pl.workspace_bytes, "the gfx942_decode kernel");
  DecodeParams dp;
  std::memset(&dp, 0, sizeof dp);
  static_cast<AttnParams&>(dp) = fill_params(a);
  dp.tail_split = pl.splits;
  dp.group = pl.group;
  dp.chunks = pl.chunks;
  dp.splits = pl.splits;
  // Same stream, in order, so the merge sees the parts' partials.
  for (const auto& s : stages(pl)) {
    if (s.second == 0) continue;  // no sequence, no K/V head: nothing to write
    RTC_CHECK(s.second < (int64_t(1) << 31), RTC_ERR_ARG,
              "the gfx942_decode kernel needs " + std::to_string(s.second) + " workgroups for stage " +
                  std::to_string(s.first) + "; accepted: fewer than 2^31");
    dp.stage = s.first;
    const unsigned grid[3] = {unsigned(s.second), 1, 1};
    launch(program, t, a, grid, DECODE_THREADS, 0, &dp, sizeof dp);  // static LDS only
  }
}

// The LUT path of every cache format; the native FP4 path is gfx950_decode's (its variants need gfx950's MFMA).
std::string why_not_lut(const void* p, const char* vendor) {
  if (args_of(p).kv_dtype == RTC_KV_DTYPE_FP4_E2M1_NATIVE)
    return "kv_dtype=4 (fp4_e2m1_native) is not accepted by the gfx942_decode kernel; accepted: 0 (same), 1 "
           "(fp8_e4m3), "
           "2 (fp8_e4m3fnuz), 3 (fp4_e2m1); the native FP4 path is the gfx950_decode kernel's";
  return why_not(p, vendor);
}

// The same kernel's native FP4 path (kv_dtype fp4_e2m1_native, gfx950): the manifest's gfx950_decode entry, whose
// refusals name it.
std::string why_not_native(const void* p, const char* vendor) {
  const AttentionFwdArgs& a = args_of(p);
  if (a.kv_dtype != RTC_KV_DTYPE_FP4_E2M1_NATIVE)
    return "kv_dtype=" + std::to_string(a.kv_dtype) +
           " is not accepted by the gfx950_decode kernel; accepted: 4 (fp4_e2m1_native, an FP4 cache read by the "
           "scaled "
           "MFMA)";
  std::string why = why_not(p, vendor);
  const std::string ours = "the gfx942_decode kernel";
  const size_t at = why.find(ours);
  if (at != std::string::npos)
    why.replace(at, ours.size(), "the gfx950_decode kernel (gfx942_decode's native FP4 path)");
  return why;
}

}  // namespace

rtc::KernelHost gfx942_decode_host() {
  return {"gfx942_decode", why_not_lut, workspace_bytes, plan_json, launch_decode};
}
rtc::KernelHost gfx950_decode_host() {
  return {"gfx950_decode", why_not_native, workspace_bytes, plan_json, launch_decode};
}

}  // namespace attention_fwd
