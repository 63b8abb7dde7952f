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

// The plan of the bucket the call's variant was compiled for (the manifest's sm90 buckets are the plans').
Sm90Plan plan_of(const AttentionFwdArgs& a) { return sm90_plan(int(a.head_dim)); }

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
  for (const auto& t : tensors) {
    std::string why = aligned_why_not("sm90", t.name, t.ptr, t.st, t.align);
    if (!why.empty()) return why;
  }
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
bool dynamic_tiles(const AttentionFwdArgs& a) {
  return a.window_left != -1 || a.window_right != -1 || kv_mode(a) != RTC_KV_DENSE;
}

int64_t workspace_bytes(const void* p) { return dynamic_tiles(args_of(p)) ? SM90_WORKSPACE_BYTES : 0; }

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
                      {"l2_heads", l2_section_heads(a)}});
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
  const KvMaps kv = sm90_kv_maps(a, block_n);
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
    RTC_CHECK(a.workspace && a.workspace_bytes >= SM90_WORKSPACE_BYTES, RTC_ERR_ARG,
              "workspace_bytes=" + std::to_string(a.workspace_bytes) +
                  " is too small for the masked sm90 kernel; "
                  "accepted: >= " +
                  std::to_string(SM90_WORKSPACE_BYTES) + " (rtc_op_workspace_bytes)");
    rtc::cuda_memset_d32(t.device, a.workspace, 0u, SM90_WORKSPACE_BYTES / 4, t.stream);
  }
  launch(program, t, a, grid, unsigned(sm90_threads(pl)), unsigned(shared_bytes(a)), &sp, sizeof sp);
}

}  // namespace

rtc::KernelHost sm90_host() { return {"sm90", why_not, workspace_bytes, plan_json, launch_sm90}; }

}  // namespace attention_fwd
