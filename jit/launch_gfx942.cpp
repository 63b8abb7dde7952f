// Host side of the gfx942 fast attention kernel: the tail-split planner, workspace sizing, three launches per call.
#include "launch_gfx942.h"
#include "attn_params_host.h"
#include "../csrc_common/gfx942/params.h"
#include "common.h"
#include "program.h"
#include <cstring>
#include <string>

namespace rtc {
namespace {

// AttnParams is trivial, so the derived fields start right after it on the host and on the GPU.
static_assert(sizeof(Gfx942Params) == sizeof(AttnParams) + 40, "Gfx942Params size changed: check the kernel");

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Cost of the last round in kv blocks: unsplit, every tail item streams all nkb blocks; split in
// g parts, ceil(tail*g / cus) waves of ceil(nkb/g) blocks plus the merge (about 3 blocks' time).
int pick_split(int64_t tail, int cus, int nkb) {
  if (tail == 0 || nkb < 48 || tail * 19 > int64_t(cus) * 18) return 1;  // nothing stranded, or too little to win
  int best_g = 1;
  int64_t best = nkb;
  for (int g = 2; g <= 2 * cus / tail && g <= nkb / 4; ++g) {
    const int64_t cost = ceil_div(tail * g, cus) * ceil_div(nkb, g) + 3;
    if (cost < best) best = cost, best_g = g;
  }
  return best_g;
}

void check_span(const char* name, int64_t rows, int64_t row_stride) {
  const int64_t bytes = rows <= 0 ? 0 : ((rows - 1) * row_stride + GFX942_HEAD_DIM) * 2;
  RTC_CHECK(row_stride >= 0 && bytes < (int64_t(1) << 32), RTC_ERR_ARG,
            std::string(name) + "_strides[1]=" + std::to_string(row_stride) + " over " + std::to_string(rows) +
                " rows spans " + std::to_string(bytes) + " bytes; the gfx942 kernel rebases its buffer resources per "
                "(batch, head) and accepts a non-negative row stride with a span below 4 GiB per (batch, head)");
}

void validate(const rtc_attention_args* a) {
  RTC_CHECK(a->head_dim == GFX942_HEAD_DIM, RTC_ERR_ARG,
            "head_dim=" + std::to_string(a->head_dim) + " is not accepted by the gfx942 kernel; accepted: 128");
  check_span("q", GFX942_Q_ROWS, a->q_strides[1]);
  check_span("o", GFX942_Q_ROWS, a->o_strides[1]);
  check_span("k", a->seq_k, a->k_strides[1]);
  check_span("v", a->seq_k, a->v_strides[1]);
}

void launch_stage(uint64_t program, Gfx942Params& gp, int stage, int64_t groups, const char* vendor, int device,
                  void* stream) {
  RTC_CHECK(groups > 0 && groups < (int64_t(1) << 31), RTC_ERR_ARG,
            "the gfx942 kernel needs " + std::to_string(groups) + " workgroups for stage " + std::to_string(stage) +
                "; accepted: fewer than 2^31 (reduce batch*heads*seq)");
  gp.stage = stage;
  rtc_launch_config cfg{};
  cfg.vendor = vendor;
  cfg.device = device;
  cfg.stream = stream;
  cfg.grid[0] = unsigned(groups);
  cfg.grid[1] = cfg.grid[2] = 1;
  cfg.block[0] = GFX942_THREADS;
  cfg.block[1] = cfg.block[2] = 1;
  cfg.shared_bytes = 0;  // static LDS only
  launch_program(program, &cfg, &gp, sizeof gp);
}

}  // namespace

Gfx942Plan plan_gfx942(const rtc_attention_args* a) {
  validate(a);
  Gfx942Plan pl;
  pl.nqb = int(ceil_div(a->seq_q, GFX942_Q_ROWS));
  pl.nkb = int(ceil_div(a->seq_k, GFX942_KV_ROWS));
  pl.items = int64_t(a->batch) * a->heads * pl.nqb;
  const int cus = a->num_cus;
  int64_t tail = cus > 0 ? pl.items % cus : 0;
  int g = 1;
  if (a->tail_split > 1) {  // forced: the last (possibly full) round's items, as many parts as asked
    if (tail == 0) tail = cus > 0 && cus < pl.items ? cus : pl.items;
    g = a->tail_split < pl.nkb ? a->tail_split : pl.nkb;
  } else if (a->tail_split == -1 && cus > 0) {
    g = pick_split(tail, cus, pl.nkb);
  }
  if (g < 2) tail = 0, g = 1;
  pl.tail = int(tail);
  pl.split_g = g;
  pl.n_prefix = int(pl.items - tail);
  pl.n_swz = pl.n_prefix / 8 * 8;
  pl.vt_bytes = int64_t(a->batch) * a->heads * pl.nkb * GFX942_VT_BLOCK_BYTES;
  pl.workspace_bytes = pl.vt_bytes + int64_t(pl.tail) * pl.split_g * GFX942_PART_BYTES;
  return pl;
}

int64_t workspace_bytes_gfx942(const rtc_attention_args* a) { return plan_gfx942(a).workspace_bytes; }

std::string why_not_gfx942(const rtc_attention_args* a, const char* vendor) {
  const std::string v = vendor ? vendor : "";
  if (v != "hip" && v != "host")
    return "vendor=" + quote(vendor ? vendor : "(null)") + " is not accepted by the gfx942 kernel; accepted: hip, host";
  try {
    validate(a);
  } catch (const RtcError& e) {
    return e.what();
  }
  return "";
}

int launch_gfx942(uint64_t program, AttnParams* p, const rtc_attention_args* a, const char* vendor, int device,
                  void* stream) {
  const std::string why = why_not_gfx942(a, vendor);
  RTC_CHECK(why.empty(), RTC_ERR_ARG, why);
  const Gfx942Plan pl = plan_gfx942(a);
  RTC_CHECK(a->workspace && a->workspace_bytes >= pl.workspace_bytes, RTC_ERR_ARG,
            "workspace_bytes=" + std::to_string(a->workspace_bytes) + " is too small for the gfx942 kernel; accepted: >= " +
                std::to_string(pl.workspace_bytes) + " (rtc_attention_workspace_bytes with the same args)");
  Gfx942Params gp;
  std::memset(&gp, 0, sizeof gp);
  static_cast<AttnParams&>(gp) = *p;
  gp.tail_split = pl.split_g;
  gp.nqb = pl.nqb;
  gp.nkb = pl.nkb;
  gp.n_prefix = pl.n_prefix;
  gp.tail = pl.tail;
  gp.split_g = pl.split_g;
  gp.n_swz = pl.n_swz;
  gp.vt_bytes = pl.vt_bytes;
  // Same stream, in order: V^T, then whole items and split parts in one grid, then the merge.
  launch_stage(program, gp, GFX942_STAGE_VT, int64_t(a->batch) * a->heads * pl.nkb, vendor, device, stream);
  launch_stage(program, gp, GFX942_STAGE_ATTN, pl.n_prefix + int64_t(pl.tail) * pl.split_g, vendor, device, stream);
  if (pl.tail > 0)
    launch_stage(program, gp, GFX942_STAGE_MERGE, int64_t(pl.tail) * (GFX942_Q_ROWS / GFX942_MERGE_ROWS), vendor,
                 device, stream);
  return RTC_OK;
}

}  // namespace rtc
