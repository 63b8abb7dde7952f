// Host side of the attention op: fills AttnParams and launches per kernel kind (baseline, sm90).
#include "attn_params_host.h"
#include "common.h"
#include "knobs.h"
#include "launch_gfx942.h"
#include "launch_sm90.h"
#include "op_attention.h"
#include "program.h"
#include <cmath>
#include <cstring>

namespace rtc {
namespace {

void validate(const rtc_attention_args* a) {
  RTC_CHECK(a, RTC_ERR_ARG, "rtc_attention_args is null");
  RTC_CHECK(a->q && a->k && a->v && a->o, RTC_ERR_ARG, "q, k, v and o pointers must all be non-null");
  auto positive = [](int v, const char* name, int min) {
    RTC_CHECK(v >= min, RTC_ERR_ARG,
              std::string(name) + "=" + std::to_string(v) + " is not accepted; accepted: >= " + std::to_string(min));
  };
  positive(a->batch, "batch", 1);
  positive(a->heads, "heads", 1);
  positive(a->seq_q, "seq_q", 1);
  positive(a->seq_k, "seq_k", 1);
  positive(a->head_dim, "head_dim", 1);
  RTC_CHECK(std::isfinite(a->softmax_scale), RTC_ERR_ARG,
            "softmax_scale=" + std::to_string(a->softmax_scale) + " is not accepted; accepted: a finite float");
  RTC_CHECK(a->tail_split >= -1, RTC_ERR_ARG,
            "tail_split=" + std::to_string(a->tail_split) + " is not accepted; accepted: -1 (plan), 0 (off), >1");
}

AttnParams fill(const rtc_attention_args* a) {
  AttnParams p;
  std::memset(&p, 0, sizeof p);
  p.q = static_cast<const rtc_bf16_t*>(a->q);
  p.k = static_cast<const rtc_bf16_t*>(a->k);
  p.v = static_cast<const rtc_bf16_t*>(a->v);
  p.o = static_cast<rtc_bf16_t*>(a->o);
  p.lse = a->lse;
  p.workspace = a->workspace;
  p.workspace_bytes = a->workspace_bytes;
  p.q_sb = a->q_strides[0]; p.q_ss = a->q_strides[1]; p.q_sh = a->q_strides[2];
  p.k_sb = a->k_strides[0]; p.k_ss = a->k_strides[1]; p.k_sh = a->k_strides[2];
  p.v_sb = a->v_strides[0]; p.v_ss = a->v_strides[1]; p.v_sh = a->v_strides[2];
  p.o_sb = a->o_strides[0]; p.o_ss = a->o_strides[1]; p.o_sh = a->o_strides[2];
  p.batch = a->batch; p.heads = a->heads; p.seq_q = a->seq_q; p.seq_k = a->seq_k;
  p.head_dim = a->head_dim;
  p.scale = a->softmax_scale;
  p.scale_log2 = float(double(a->softmax_scale) * 1.4426950408889634);  // log2(e)
  // RTCATTN_NO_TAIL turns off a planned split; an explicit request still wins.
  p.tail_split = (a->tail_split == -1 && knob_bool("RTCATTN_NO_TAIL")) ? 0 : a->tail_split;
  return p;
}

[[noreturn]] void unknown_kind(const char* kind) {
  RTC_FAIL(RTC_ERR_ARG, std::string("kernel_kind=") + quote(kind ? kind : "(null)") +
                            " is not accepted; accepted: baseline, sm90, gfx942");
}

void launch_baseline(uint64_t program, const AttnParams& p, const char* vendor, int device, void* stream) {
  // One workgroup of 128 threads per 16 query rows of one (head, batch).
  rtc_launch_config cfg{};
  cfg.vendor = vendor;
  cfg.device = device;
  cfg.stream = stream;
  cfg.grid[0] = unsigned((p.seq_q + 15) / 16);
  cfg.grid[1] = unsigned(p.heads);
  cfg.grid[2] = unsigned(p.batch);
  cfg.block[0] = 128; cfg.block[1] = 1; cfg.block[2] = 1;
  cfg.shared_bytes = 0;
  launch_program(program, &cfg, &p, sizeof p);
}

// Runtime arguments each kernel kind takes (vendor, alignment, strides): why_not returns "" or the
// reason. Dispatch asks before it chooses, so a kind that declines falls back to the next kernel of
// the manifest. A null why_not takes whatever validate() accepts. One row per kind.
struct KindSupport {
  const char* kind;
  std::string (*why_not)(const rtc_attention_args* a, const char* vendor);
};
const KindSupport kKindSupport[] = {
    {"baseline", nullptr},
    {"sm90", why_not_sm90},
    {"gfx942", why_not_gfx942},
};

}  // namespace

std::string attention_supports(const char* kind, const rtc_attention_args* a, const char* vendor) {
  validate(a);
  RTC_CHECK(vendor, RTC_ERR_ARG, "vendor is null; accepted: hip, cuda, host");
  const std::string k = kind ? kind : "";
  for (const KindSupport& row : kKindSupport)
    if (k == row.kind) return row.why_not ? row.why_not(a, vendor) : std::string();
  unknown_kind(kind);
}

int64_t attention_workspace_bytes(const char* kind, const rtc_attention_args* a) {
  validate(a);
  std::string k = kind ? kind : "";
  if (k == "baseline") return 0;
  if (k == "sm90") return workspace_bytes_sm90(a);
  if (k == "gfx942") return workspace_bytes_gfx942(a);
  unknown_kind(kind);
}

int attention_fwd(uint64_t program, const char* kind, const rtc_attention_args* a, const char* vendor,
                  int device, void* stream) {
  validate(a);
  RTC_CHECK(vendor, RTC_ERR_ARG, "vendor is null; accepted: hip, cuda, host");
  AttnParams p = fill(a);
  std::string k = kind ? kind : "";
  if (k == "baseline") {
    launch_baseline(program, p, vendor, device, stream);
    return RTC_OK;
  }
  if (k == "gfx942") return launch_gfx942(program, &p, a, vendor, device, stream);
  if (k == "sm90") return launch_sm90(program, &p, a, vendor, device, stream);
  unknown_kind(kind);
}

}  // namespace rtc
