// Host side of the sm_90a attention kernel: TMA tensor maps through the dlopened driver, persistent grid, launch.
#include "op.h"
#include "common.h"
#include "cuda_driver.h"
#include "sm90/params.h"
#include "sm90_tma.h"
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace attention_fwd {
namespace {

using rtc::cuda_check;
using rtc::cuda_driver;
using rtc::CudaDriver;

const AttentionFwdArgs& args_of(const void* p) { return *static_cast<const AttentionFwdArgs*>(p); }

static_assert(offsetof(Sm90AttnParams, a) == 384, "Sm90AttnParams: the three maps come first");
static_assert(sizeof(Sm90AttnParams) % 64 == 0, "Sm90AttnParams: a whole number of 64-byte lines");

// What TMA and the kernel's 4-byte output stores need of one tensor: "" or why not.

// The call's variant has a mask (RTC_MASK) when either window bound is set.

// The plan of the variant the call runs (its bucket's: the manifest's sm90 buckets are the plans'; the open
// variant's block width).
Sm90Plan plan_of(const AttentionFwdArgs& a) { return sm90_plan(int(a.head_dim), masked(a), kv_mode(a)); }

// 4-D map over (d, s, h, b): bshd and bhsd differ only in the strides (bytes, s/h/b order). d is the call's head
// dim: the boxes of a tile's last 64-column block past it read zeros.

int sm_count(const AttentionFwdArgs& a, int device) {
  if (a.num_cus > 0) return a.num_cus;
  int dev = 0, n = 0;
  cuda_check(cuda_driver().device_get(&dev, device), RTC_ERR_LAUNCH, "cuDeviceGet");
  const int kMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  cuda_check(cuda_driver().device_attribute(&n, kMultiprocessorCount, dev), RTC_ERR_LAUNCH,
             "cuDeviceGetAttribute(SM count)");
  return n;
}

// Query-row tiles of one (head, batch), the plan's block_m rows each.
int64_t m_blocks(const AttentionFwdArgs& a) {
  const int64_t bm = sm90_block_m(plan_of(a));
  return (a.seq_q + bm - 1) / bm;
}
// Tiles over (head, batch); INT64_MAX when that overflows (why_not refuses it).
int64_t tile_count(const AttentionFwdArgs& a) {
  int64_t tiles = 0;
  if (__builtin_mul_overflow(m_blocks(a), a.heads * a.batch, &tiles)) return INT64_MAX;
  return tiles;
}

// The dynamic shared memory of a launch: tiles, rings and barriers, plus the packed schedule's table.
int64_t tiles_bytes(const AttentionFwdArgs& a) { return sm90_smem_bytes(plan_of(a), kv_mode(a)); }
int64_t shared_bytes(const AttentionFwdArgs& a) {
  return tiles_bytes(a) + (kv_mode(a) == RTC_KV_DENSE ? 0 : SM90_SCHEDULE_BYTES(a.batch, m_blocks(a)));
}
constexpr int64_t kMaxShared = kSm90MaxShared;

// A quantized K / V cache (sm90/expand.h): the workspace rows its expansion fills (varlen: the cache's total_k rows;
// paged: a slot per sequence of the most keys it can have, its block-table row's capacity, or with seqused_k (bounded
// by max_seqlen_k: attn_params.h used_keys) min(capacity, max_seqlen_k)), and where the expanded K and V sit in the
// workspace, after the tile counter.
bool quantized(const AttentionFwdArgs& a) { return a.kv_dtype != RTC_KV_DTYPE_SAME; }
int64_t kv_slot(const AttentionFwdArgs& a) {
  const int64_t capacity = int64_t(a.pages_per_seq) * a.page_size;  // validate(): each < 2^31
  return a.seqused_k ? std::min<int64_t>(capacity, a.seq_k) : capacity;
}
int64_t expanded_rows(const AttentionFwdArgs& a) {
  if (!quantized(a)) return 0;
  return kv_mode(a) == RTC_KV_PAGED ? a.batch * kv_slot(a) : a.total_k;
}
constexpr int64_t kExpandAlign = 256;
int64_t expanded_bytes(const AttentionFwdArgs& a) {  // one of K, V
  return (expanded_rows(a) * a.heads_k * a.head_dim * 2 + kExpandAlign - 1) / kExpandAlign * kExpandAlign;
}
constexpr int64_t kExpandFirst = (SM90_WORKSPACE_BYTES + kExpandAlign - 1) / kExpandAlign * kExpandAlign;
// The expansion's grid: lanes per cache row (its 4-byte units, a power of two up to a warp) and CTAs per (sequence,
// K/V head), enough for max_seqlen_k's rows at one row per lane group, at most 8 (a longer sequence is walked in
// strides, sm90/expand.h).
int expand_lanes(const AttentionFwdArgs& a) {
  const int64_t units = a.kv_dtype == RTC_KV_DTYPE_FP4_E2M1 ? a.head_dim / 8 : a.head_dim / 4;
  int lanes = 1;
  while (lanes < units && lanes < 32) lanes *= 2;
  return lanes;
}
int expand_ctas(const AttentionFwdArgs& a) {
  const int64_t rows_per_cta = int64_t(sm90_threads(plan_of(a))) / expand_lanes(a);
  return int(std::max<int64_t>(1, std::min<int64_t>(8, (a.seq_k + rows_per_cta - 1) / rows_per_cta)));
}

std::string why_not(const void* p, const char* vendor) {
  const AttentionFwdArgs* a = &args_of(p);
  if (!vendor || std::string(vendor) != "cuda")
    return std::string("vendor=") + rtc::quote(vendor ? vendor : "(null)") +
           " is not accepted by the sm90 kernel; accepted: cuda";
  const int64_t d_max = kSm90Plans[kSm90PlanCount - 1].head_dim;
  if (a->head_dim < 8 || a->head_dim > d_max || a->head_dim % 8 != 0)
    return "head_dim=" + std::to_string(a->head_dim) +
           " is not accepted by the sm90 kernel; accepted: a multiple of 8 in [8, " + std::to_string(d_max) + "]";
  const struct {
    const char* name;
    const void* ptr;
    const int64_t (&st)[3];
    int64_t align;
  } tensors[] = {{"q", a->q, a->q_strides, 8},
                 {"k", a->k, a->k_strides, 8},
                 {"v", a->v, a->v_strides, 8},
                 {"o", a->o, a->o_strides, 2}};
  if (quantized(*a) && a->kv_dtype != RTC_KV_DTYPE_FP8_E4M3 && a->kv_dtype != RTC_KV_DTYPE_FP4_E2M1)
    return "kv_dtype=" + std::to_string(a->kv_dtype) +
           " is not accepted by the sm90 kernel; accepted: 0 (same: K/V in q's dtype), 1 (fp8_e4m3), 3 (fp4_e2m1)";
  for (const auto& t : tensors) {
    // A quantized cache is read by its expansion in 4-byte units: strides in bytes, multiples of 4.
    const bool cache = quantized(*a) && (t.name[0] == 'k' || t.name[0] == 'v');
    std::string why = aligned_why_not("sm90", t.name, t.ptr, t.st, cache ? 4 : t.align);
    if (!why.empty()) return why;
  }
  if (quantized(*a) &&
      (expanded_rows(*a) >= (int64_t(1) << 31) || a->batch * a->heads_k * expand_ctas(*a) >= (int64_t(1) << 31)))
    return "the expanded cache's rows (paged: batch*block_table.shape[1]*page_size, or with seqused_k at most "
           "batch*max_seqlen_k; varlen: total_k)=" +
           std::to_string(expanded_rows(*a)) + " are too many for the sm90 kernel; accepted: < 2^31";
  const int64_t tiles = tile_count(*a);
  if (tiles >= (int64_t(1) << 31))
    return "ceil(seq_q/" + std::to_string(sm90_block_m(plan_of(*a))) + ")*heads*batch=" + std::to_string(tiles) +
           " is too large for the sm90 kernel; accepted: < 2^31";
  if (shared_bytes(*a) > kMaxShared)
    return "batch=" + std::to_string(a->batch) + " sequences with max_seqlen_q=" + std::to_string(a->seq_q) +
           " need a " + std::to_string(shared_bytes(*a) - tiles_bytes(*a)) +
           "-byte tile schedule (sm90/schedule.h), more than the sm90 kernel's free shared memory; accepted: a "
           "schedule of at most " +
           std::to_string(kMaxShared - tiles_bytes(*a)) + " bytes";
  return "";
}

// (batch, head) pairs per section of the masked dense tile order (sm90/scheduler.h): as many as keep the
// section's K/V within SM90_L2_SECTION_BYTES, whole groups of query heads over one K/V head.
int64_t l2_section_heads(const AttentionFwdArgs& a) {
  const int64_t kv_bytes = std::max<int64_t>(1, int64_t(a.seq_k) * a.head_dim * 2 * 2);  // K and V, 16-bit
  const int64_t group = a.heads_k > 0 ? std::max<int64_t>(1, a.heads / a.heads_k) : 1;
  const int64_t g = std::max<int64_t>(1, SM90_L2_SECTION_BYTES / kv_bytes) * group;
  return std::min<int64_t>(g, std::max<int64_t>(1, int64_t(a.heads) * a.batch));
}

// The masked and the packed variants take tiles from a counter (SM90_WORKSPACE_BYTES); the dense
// unmasked one needs none.
bool dynamic_tiles(const AttentionFwdArgs& a) { return masked(a) || kv_mode(a) != RTC_KV_DENSE; }

int64_t workspace_bytes(const void* p) {
  const AttentionFwdArgs& a = args_of(p);
  if (quantized(a)) return kExpandFirst + 2 * expanded_bytes(a);  // the counter, then the expanded K and V
  return dynamic_tiles(a) ? SM90_WORKSPACE_BYTES : 0;
}

std::string plan_json(const void* p) {
  const AttentionFwdArgs& a = args_of(p);
  const int64_t tiles = tile_count(a);
  // The grid is min(tiles, SMs); with num_cus unknown here, the plan shows the tile count.
  const int64_t grid = a.num_cus > 0 && a.num_cus < tiles ? a.num_cus : tiles;
  const Sm90Plan pl = plan_of(a);
  return json_object({{"head_dim_bucket", pl.head_dim},
                      {"block_n", pl.block_n},
                      {"stages", pl.stages},
                      {"q_stages", sm90_q_stages(pl, kv_mode(a))},
                      {"block_m", sm90_block_m(pl)},
                      {"num_tiles", tiles},
                      {"grid_x", grid},
                      {"block", sm90_threads(pl)},
                      {"shared_bytes", shared_bytes(a)},
                      {"workspace_bytes", workspace_bytes(p)},
                      {"dynamic_tiles", dynamic_tiles(a)},
                      {"l2_heads", l2_section_heads(a)},
                      {"expanded_rows", expanded_rows(a)},
                      {"expand_ctas", quantized(a) ? int64_t(a.batch) * a.heads_k * expand_ctas(a) : 0}});
}

void launch_sm90(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionFwdArgs& a = args_of(p);
  require_tensor_maps("sm90");
  alignas(64) Sm90AttnParams sp;
  std::memset(&sp, 0, sizeof sp);
  const Sm90Plan pl = plan_of(a);
  const unsigned block_m = unsigned(sm90_block_m(pl)), block_n = unsigned(pl.block_n);
  const int64_t d = a.head_dim;
  if (kv_mode(a) == RTC_KV_DENSE) {
    sp.tmap_q = sm90_tensor_map("q", a.q, a.q_strides, d, a.seq_q, a.heads, a.batch, block_m);
  } else {  // packed rows: one "batch" of total rows (its stride is never stepped; any valid value does)
    const int64_t q_st[3] = {a.q_strides[1], a.q_strides[1], a.q_strides[2]};
    sp.tmap_q = sm90_tensor_map("q", a.q, q_st, d, a.total_q, a.heads, 1, block_m);
  }
  // A quantized cache: the attention reads the expanded rows as a varlen cache in q's dtype.
  AttentionFwdArgs x = a;
  if (quantized(a)) {
    require_workspace(a, workspace_bytes(p), "the sm90 kernel over a quantized cache");
    char* ws = static_cast<char*>(a.workspace);
    sp.kx = reinterpret_cast<rtc_elem_t*>(ws + kExpandFirst);
    sp.vx = reinterpret_cast<rtc_elem_t*>(ws + kExpandFirst + expanded_bytes(a));
    sp.kv_slot = int(kv_slot(a));
    sp.expand_lanes = expand_lanes(a);
    sp.expand_ctas = expand_ctas(a);
    x.k = sp.kx;
    x.v = sp.vx;
    for (int64_t(*st)[3] : {&x.k_strides, &x.v_strides}) {
      (*st)[0] = 0;
      (*st)[1] = a.heads_k * a.head_dim;
      (*st)[2] = a.head_dim;
    }
    x.kv_dtype = RTC_KV_DTYPE_SAME;
    x.block_table = nullptr;  // packed rows
    x.total_k = expanded_rows(a);
  }
  const KvMaps kv = sm90_kv_maps(x, block_n);
  sp.tmap_k = kv.k;
  sp.tmap_v = kv.v;
  sp.kv_box = kv.box_rows;
  sp.page_shift = kv.page_shift;
  sp.a = fill_params(a);
  sp.num_m_blocks = int(m_blocks(a));
  const int64_t tiles = tile_count(a);
  sp.num_tiles = int(tiles);
  sp.l2_heads = int(l2_section_heads(a));
  const int sms = sm_count(a, t.device);
  const unsigned grid[3] = {unsigned(tiles < sms ? tiles : sms), 1, 1};
  if (dynamic_tiles(a)) {  // the tile counter starts at 0, on the launch's stream, before the kernel
    require_workspace(a, SM90_WORKSPACE_BYTES, "the masked sm90 kernel");
    rtc::cuda_memset_d32(t.device, a.workspace, 0u, SM90_WORKSPACE_BYTES / 4, t.stream);
  }
  if (quantized(a) && a.batch * a.heads_k > 0) {  // the expansion first, on the same stream
    sp.stage = SM90_STAGE_EXPAND;
    const unsigned eg[3] = {unsigned(a.batch * a.heads_k * sp.expand_ctas), 1, 1};
    launch(program, t, a, eg, unsigned(sm90_threads(pl)), 0u, &sp, sizeof sp);
  }
  sp.stage = SM90_STAGE_ATTN;
  launch(program, t, a, grid, unsigned(sm90_threads(pl)), unsigned(shared_bytes(a)), &sp, sizeof sp);
}

}  // namespace

rtc::KernelHost sm90_host() { return {"sm90", why_not, workspace_bytes, plan_json, launch_sm90}; }

}  // namespace attention_fwd
