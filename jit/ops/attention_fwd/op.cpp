// attention_fwd's registration: its argument block, the checks every kernel relies on, its knob and kernels.
#include "op.h"
#include "common.h"
#include "knobs.h"
#include "program.h"
#include "decode_params.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

namespace attention_fwd {
namespace {

using rtc::quote;

// The kernels index rows and heads with 32-bit integers and offsets in 64 bits: every size must fit
// an int, and every tensor's byte extent must fit in 63 bits.
constexpr int64_t kMaxSize = INT32_MAX;
// Pages hold a power of two rows, at least 16 (vLLM's default block): the fast kernels load K/V in
// boxes of min(page_size, block) rows and find a row's page with a shift.
constexpr int64_t kMinPage = 16;

void check_size(int64_t v, const char* name, int64_t max) {
  RTC_CHECK(v >= 1 && v <= max, RTC_ERR_ARG,
            std::string(name) + "=" + std::to_string(v) + " is not accepted; accepted: 1.." + std::to_string(max) +
                " (the kernels index with 32-bit sizes)");
}

// The [batch, rows, heads, D] extent of q, k, v and o in memory: dense [B, S, H]; packed q / o
// [1, total_q, H]; varlen k / v [1, total_k, Hk]; paged k / v [num_pages, page_size, Hk]; rows of `units` elements
// of `unit` bytes (k / v of a quantized cache: bytes, kv_row_units of them; an FP4 cache's scales: one byte a row).
struct View {
  const char* name;
  const void* base;
  int64_t batch, rows, heads;
  const int64_t (&st)[3];
  int64_t units, unit;
};

std::vector<View> views(const AttentionFwdArgs& a) {
  const int mode = kv_mode(a);
  const bool packed = mode != RTC_KV_DENSE;
  const int64_t qb = packed ? 1 : a.batch, qs = packed ? a.total_q : a.seq_q;
  const int64_t kb = mode == RTC_KV_PAGED ? a.num_pages : packed ? 1 : a.batch;
  const int64_t ks = mode == RTC_KV_PAGED ? a.page_size : packed ? a.total_k : a.seq_k;
  const int64_t ku = kv_row_units(a), kb_ = kv_unit_bytes(a);
  std::vector<View> out = {{"q", a.q, qb, qs, a.heads, a.q_strides, a.head_dim, 2},
                           {"k", a.k, kb, ks, a.heads_k, a.k_strides, ku, kb_},
                           {"v", a.v, kb, ks, a.heads_k, a.v_strides, ku, kb_},
                           {"o", a.o, qb, qs, a.heads, a.o_strides, a.head_dim, 2}};
  if (rtc_kv_fp4(a.kv_dtype)) {
    out.push_back({"k_scale", a.k_scale, kb, ks, a.heads_k, a.k_scale_strides, 1, 1});
    out.push_back({"v_scale", a.v_scale, kb, ks, a.heads_k, a.v_scale_strides, 1, 1});
  }
  return out;
}

const char* kv_dtype_name(int64_t t) {
  switch (t) {
    case RTC_KV_DTYPE_SAME: return "same";
    case RTC_KV_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case RTC_KV_DTYPE_FP8_E4M3FNUZ: return "fp8_e4m3fnuz";
    case RTC_KV_DTYPE_FP4_E2M1: return "fp4_e2m1";
    case RTC_KV_DTYPE_FP4_E2M1_NATIVE: return "fp4_e2m1_native";
    default: return "?";
  }
}

// A quantized cache's extra arguments: present exactly when its format needs them (a descale with FP8, which may be
// null for 1; both scales with FP4), and a descale's [batch, heads_k] extent addressable.
void validate_kv_dtype(const AttentionFwdArgs& a) {
  const int t = a.kv_dtype;
  RTC_CHECK(t >= RTC_KV_DTYPE_SAME && t <= RTC_KV_DTYPE_FP4_E2M1_NATIVE, RTC_ERR_ARG,
            "kv_dtype=" + std::to_string(t) + " is not accepted; accepted: 0 (same: K/V in q's dtype), 1 (fp8_e4m3), " +
                "2 (fp8_e4m3fnuz), 3 (fp4_e2m1), 4 (fp4_e2m1_native)");
  const std::string what = std::string("kv_dtype=") + std::to_string(t) + " (" + kv_dtype_name(t) + ")";
  RTC_CHECK(t == RTC_KV_DTYPE_SAME || kv_mode(a) != RTC_KV_DENSE, RTC_ERR_ARG,
            what + " on a dense call is not accepted; accepted: a quantized cache with packed sequences (cu_seqlens)");
  const bool fp8 = t == RTC_KV_DTYPE_FP8_E4M3 || t == RTC_KV_DTYPE_FP8_E4M3FNUZ, fp4 = rtc_kv_fp4(t);
  const struct {
    const char* name;
    const void* ptr;
    bool allowed, required;
  } extra[] = {{"k_descale", a.k_descale, fp8, false},
               {"v_descale", a.v_descale, fp8, false},
               {"k_scale", a.k_scale, fp4, fp4},
               {"v_scale", a.v_scale, fp4, fp4}};
  for (const auto& e : extra) {
    RTC_CHECK(e.allowed || !e.ptr, RTC_ERR_ARG,
              std::string(e.name) + " is set with " + what + "; accepted: " +
                  (e.name[2] == 'd' ? "descales only with an FP8 cache" : "E8M0 scales only with an FP4 cache"));
    RTC_CHECK(!e.required || e.ptr, RTC_ERR_ARG,
              std::string(e.name) + " is null with " + what + "; accepted: the cache's E8M0 scales (uint8)");
  }
  RTC_CHECK(
      !fp4 || a.head_dim % 2 == 0, RTC_ERR_ARG,
      "head_dim=" + std::to_string(a.head_dim) + " with " + what + " is not accepted; accepted: an even head dim");
  for (const auto& d : {std::make_pair("k_descale_strides", a.k_descale_strides),
                        std::make_pair("v_descale_strides", a.v_descale_strides)}) {
    const int64_t* st = d.second;
    RTC_CHECK(st[0] >= 0 && st[1] >= 0 && st[0] <= kMaxSize && st[1] <= kMaxSize, RTC_ERR_ARG,
              std::string(d.first) + "=(" + std::to_string(st[0]) + ", " + std::to_string(st[1]) +
                  ") is not accepted; accepted: 0.." + std::to_string(kMaxSize) + " each");
  }
}

// Packed sequences: the sizes that can be checked without reading device memory. The values of
// cu_seqlens and the block table are the kernels' to survive (attn_params.h: seq_of, page_of) and
// the CHECK knob's to verify on the host (Python).
void validate_sequences(const AttentionFwdArgs& a) {
  RTC_CHECK(a.cu_seqlens_q && a.cu_seqlens_k, RTC_ERR_ARG,
            "cu_seqlens_q and cu_seqlens_k must both be non-null for packed sequences");
  check_size(a.total_q, "total_q", kMaxSize);
  if (kv_mode(a) == RTC_KV_PAGED) {
    check_size(a.page_size, "page_size", kMaxSize);
    RTC_CHECK(a.page_size >= kMinPage && (a.page_size & (a.page_size - 1)) == 0, RTC_ERR_ARG,
              "page_size=" + std::to_string(a.page_size) + " is not accepted; accepted: a power of two >= " +
                  std::to_string(kMinPage) + " (16, 32, 64, 128, 256, ...)");
    check_size(a.num_pages, "num_pages", kMaxSize);
    check_size(a.pages_per_seq, "block_table.shape[1]", kMaxSize);
    // Stride 0 is one row shared by every sequence (an expanded table): the kernels read row b at
    // b * table_stride, so it needs nothing else.
    RTC_CHECK(a.table_stride == 0 || (a.table_stride >= a.pages_per_seq && a.table_stride <= kMaxSize), RTC_ERR_ARG,
              "block_table.stride(0)=" + std::to_string(a.table_stride) +
                  " is not accepted; accepted: 0 (one row "
                  "for every sequence) or block_table.shape[1]=" +
                  std::to_string(a.pages_per_seq) + ".." + std::to_string(kMaxSize));
    int64_t entries = 0;
    RTC_CHECK(!__builtin_mul_overflow(a.batch, a.table_stride, &entries) && entries <= kMaxSize, RTC_ERR_ARG,
              "block_table.stride(0)*batch=" + std::to_string(a.table_stride) + "*" + std::to_string(a.batch) +
                  " (batch = len(cu_seqlens_q) - 1) is not accepted; accepted: a block table of at most " +
                  std::to_string(kMaxSize) + " entries");
  } else {
    check_size(a.total_k, "total_k", kMaxSize);
  }
}

void validate(const void* p) { validate_args(*static_cast<const AttentionFwdArgs*>(p)); }

const rtc::KnobRegistration kCheck({"CHECK", rtc::KnobType::Bool, "0", "",
                                    "read packed-sequence metadata back before launch and refuse bad values "
                                    "(cu_seqlens order and totals, block ids): costs a host sync per call"});
const rtc::KnobRegistration kNoTail(
    {"NO_TAIL", rtc::KnobType::Bool, "0", "",
     "turn off the tail KV split the fast attention kernels plan (a forced split stays)"});

#define ATTENTION_FWD_FIELD(name, type, kind, count) RTC_ARG_FIELD(AttentionFwdArgs, name, kind, count),
const rtc::OpRegistration kOp({"attention_fwd",
                               sizeof(AttentionFwdArgs),
                               {ATTENTION_FWD_ARGS(ATTENTION_FWD_FIELD)},
                               validate,
                               {sm90_decode_host(), sm90_host(), gfx950_decode_host(), gfx942_decode_host(),
                                gfx942_host(), baseline_host()}});

}  // namespace

void validate_args(const AttentionFwdArgs& args) {
  const AttentionFwdArgs* a = &args;
  RTC_CHECK(a->q && a->k && a->v && a->o, RTC_ERR_ARG, "q, k, v and o pointers must all be non-null");
  check_size(a->batch, "batch", kMaxSize);
  check_size(a->heads, "heads", kMaxSize);
  // A packed call's seq_q / seq_k are the caller's max_seqlen_q / max_seqlen_k.
  const bool packed = kv_mode(*a) != RTC_KV_DENSE;
  check_size(a->seq_q, packed ? "max_seqlen_q" : "seq_q", kMaxSize);
  check_size(a->seq_k, packed ? "max_seqlen_k" : "seq_k", kMaxSize);
  check_size(a->head_dim, "head_dim", 256);
  check_size(a->heads_k, "heads_k", a->heads);
  RTC_CHECK(a->heads % a->heads_k == 0, RTC_ERR_ARG,
            "heads=" + std::to_string(a->heads) + " is not a multiple of heads_k=" + std::to_string(a->heads_k) +
                "; accepted: query heads a multiple of the K/V heads (GQA/MQA)");
  for (const auto& w : {std::make_pair("window_left", a->window_left), std::make_pair("window_right", a->window_right)})
    RTC_CHECK(w.second >= -1 && w.second <= kMaxSize, RTC_ERR_ARG,
              std::string(w.first) + "=" + std::to_string(w.second) +
                  " is not accepted; accepted: -1 (unbounded) "
                  "or 0.." +
                  std::to_string(kMaxSize));
  if (kv_mode(*a) != RTC_KV_DENSE) validate_sequences(*a);
  RTC_CHECK(!a->seqused_k || packed, RTC_ERR_ARG,
            "seqused_k is set on a dense call; accepted: seqused_k only with packed sequences (cu_seqlens set)");
  validate_kv_dtype(*a);
  for (const View& t : views(*a))
    RTC_CHECK(view_bytes(t.batch, t.rows, t.heads, t.units, t.st, t.unit) >= 0, RTC_ERR_ARG,
              std::string(t.name) + "_strides=(" + std::to_string(t.st[0]) + ", " + std::to_string(t.st[1]) + ", " +
                  std::to_string(t.st[2]) + ") over batch=" + std::to_string(t.batch) +
                  ", rows=" + std::to_string(t.rows) + ", heads=" + std::to_string(t.heads) +
                  " span more than 2^63 bytes; accepted: a view of addressable size");
  RTC_CHECK(std::isfinite(a->softmax_scale) && a->softmax_scale > 0, RTC_ERR_ARG,
            "softmax_scale=" + std::to_string(a->softmax_scale) + " is not accepted; accepted: a finite float > 0");
  RTC_CHECK(std::isfinite(a->softcap) && a->softcap >= 0, RTC_ERR_ARG,
            "softcap=" + std::to_string(a->softcap) + " is not accepted; accepted: 0 (off) or a finite float > 0");
  // The kernels take 2 scale / softcap log2(e) and softcap log2(e) as float32 (fill_params): both must be finite.
  RTC_CHECK(a->softcap == 0 || (std::isfinite(float(2.0 * a->softmax_scale / a->softcap * 1.4426950408889634)) &&
                                std::isfinite(float(double(a->softcap) * 1.4426950408889634))),
            RTC_ERR_ARG,
            "softcap=" + std::to_string(a->softcap) + " with softmax_scale=" + std::to_string(a->softmax_scale) +
                " is not accepted; accepted: 2 * softmax_scale / softcap * log2(e) and softcap * log2(e) finite in "
                "float32");
  for (int i = 0; i < 2; ++i)
    RTC_CHECK(a->alibi_strides[i] >= 0 && a->alibi_strides[i] <= kMaxSize, RTC_ERR_ARG,
              "alibi_strides[" + std::to_string(i) + "]=" + std::to_string(a->alibi_strides[i]) +
                  " is not accepted; accepted: 0.." + std::to_string(kMaxSize));
  RTC_CHECK(std::isfinite(a->dropout_p) && a->dropout_p >= 0 && a->dropout_p < 1, RTC_ERR_ARG,
            "dropout_p=" + std::to_string(a->dropout_p) + " is not accepted; accepted: a float in [0, 1)");
  RTC_CHECK((a->dropout_p > 0) == (a->rng_state != nullptr), RTC_ERR_ARG,
            std::string("rng_state is ") + (a->rng_state ? "set" : "null") + " with dropout_p=" +
                std::to_string(a->dropout_p) + "; accepted: an int64 [2] generator state exactly when dropout_p > 0");
  RTC_CHECK(a->tail_split >= -1, RTC_ERR_ARG,
            "tail_split=" + std::to_string(a->tail_split) + " is not accepted; accepted: -1 (plan), 0 (off), >1");
  RTC_CHECK(a->max_splits >= 0, RTC_ERR_ARG,
            "max_splits=" + std::to_string(a->max_splits) +
                " is not accepted; accepted: 0 (the kernel's own cap) or n >= 1 (a planned split of at most n parts)");
}

// Bytes a strided [B, S, H, D] view of `unit`-byte elements spans, or -1 when that overflows 63 bits.
int64_t view_bytes(int64_t b, int64_t s, int64_t h, int64_t d, const int64_t (&st)[3], int64_t unit) {
  int64_t span = d, term = 0;
  const int64_t ext[3][2] = {{b, st[0]}, {s, st[1]}, {h, st[2]}};
  for (const auto& e : ext) {
    const int64_t stride = e[1] < 0 ? -e[1] : e[1];
    if (__builtin_mul_overflow(e[0] - 1, stride, &term) || __builtin_add_overflow(span, term, &span)) return -1;
  }
  return __builtin_mul_overflow(span, unit, &span) ? -1 : span;
}

// The elements a strided [B, S, H, D] view reaches (strides may be zero or negative).
void add_view(std::vector<rtc_mem_range>& out, const void* base, size_t elem, int64_t b, int64_t s, int64_t h,
              int64_t d, const int64_t (&st)[3]) {
  if (!base) return;
  int64_t lo = 0, hi = d - 1;
  const int64_t ext[3][2] = {{b, st[0]}, {s, st[1]}, {h, st[2]}};
  for (const auto& e : ext) (e[1] < 0 ? lo : hi) += (e[0] - 1) * e[1];
  out.push_back(rtc_mem_range{static_cast<const char*>(base) + lo * int64_t(elem), uint64_t(hi - lo + 1) * elem});
}

AttnParams fill_params(const AttentionFwdArgs& a) {
  AttnParams p;
  std::memset(&p, 0, sizeof p);
  p.q = static_cast<const rtc_elem_t*>(a.q);
  p.k = static_cast<const rtc_elem_t*>(a.k);
  p.v = static_cast<const rtc_elem_t*>(a.v);
  p.o = static_cast<rtc_elem_t*>(a.o);
  p.lse = a.lse;
  p.workspace = a.workspace;
  p.workspace_bytes = a.workspace_bytes;
  p.q_sb = a.q_strides[0];
  p.q_ss = a.q_strides[1];
  p.q_sh = a.q_strides[2];
  p.k_sb = a.k_strides[0];
  p.k_ss = a.k_strides[1];
  p.k_sh = a.k_strides[2];
  p.v_sb = a.v_strides[0];
  p.v_ss = a.v_strides[1];
  p.v_sh = a.v_strides[2];
  p.o_sb = a.o_strides[0];
  p.o_ss = a.o_strides[1];
  p.o_sh = a.o_strides[2];
  // validate() bounded every size by INT32_MAX.
  p.batch = int(a.batch);
  p.heads = int(a.heads);
  p.seq_q = int(a.seq_q);
  p.seq_k = int(a.seq_k);
  p.head_dim = int(a.head_dim);
  p.scale = a.softmax_scale;
  p.scale_log2 = float(double(a.softmax_scale) * 1.4426950408889634);  // log2(e)
  p.tail_split = 0;  // the fast kernels' planners set it
  p.heads_k = int(a.heads_k);
  p.window_left = int(a.window_left);
  p.window_right = int(a.window_right);
  if (a.softcap > 0) {
    p.softcap_log2 = float(double(a.softcap) * 1.4426950408889634);
    p.softcap_exp2 = float(2.0 * double(a.softmax_scale) / double(a.softcap) * 1.4426950408889634);
  }
  p.alibi_slopes = a.alibi_slopes;
  p.alibi_sb = a.alibi_strides[0];
  p.alibi_sh = a.alibi_strides[1];
  if (a.dropout_p > 0) {
    p.rng_state = static_cast<const rtc_i64*>(a.rng_state);
    p.drop_threshold = rtc_u32(std::llround(double(a.dropout_p) * 65536.0));
    p.drop_scale = float(1.0 / (1.0 - double(a.dropout_p)));
  }
  if (kv_mode(a) != RTC_KV_DENSE) {  // validate() bounded these by INT32_MAX
    p.cu_q = static_cast<const int*>(a.cu_seqlens_q);
    p.cu_k = static_cast<const int*>(a.cu_seqlens_k);
    p.block_table = static_cast<const int*>(a.block_table);
    p.seqused_k = static_cast<const int*>(a.seqused_k);
    p.total_q = int(a.total_q);
    p.total_k = int(a.total_k);
    p.page_size = int(a.page_size);
    p.num_pages = int(a.num_pages);
    p.pages_per_seq = int(a.pages_per_seq);
    p.table_stride = int(a.table_stride);
    p.k_descale = a.k_descale;
    p.v_descale = a.v_descale;
    p.kd_sb = a.k_descale_strides[0];
    p.kd_sh = a.k_descale_strides[1];
    p.vd_sb = a.v_descale_strides[0];
    p.vd_sh = a.v_descale_strides[1];
    p.k_scale = static_cast<const unsigned char*>(a.k_scale);
    p.v_scale = static_cast<const unsigned char*>(a.v_scale);
    p.ks_sb = a.k_scale_strides[0];
    p.ks_ss = a.k_scale_strides[1];
    p.ks_sh = a.k_scale_strides[2];
    p.vs_sb = a.v_scale_strides[0];
    p.vs_ss = a.v_scale_strides[1];
    p.vs_sh = a.v_scale_strides[2];
  }
  return p;
}

std::vector<rtc_mem_range> tensor_ranges(const AttentionFwdArgs& a) {
  std::vector<rtc_mem_range> r;
  for (const View& t : views(a)) add_view(r, t.base, size_t(t.unit), t.batch, t.rows, t.heads, t.units, t.st);
  for (const auto& d :
       {std::make_pair(a.k_descale, a.k_descale_strides), std::make_pair(a.v_descale, a.v_descale_strides)})
    if (d.first) {  // fp32 [batch, heads_k] at the (sequence, head) strides; 0, 0: one value
      const int64_t st[3] = {d.second[0], d.second[1], 0};
      add_view(r, d.first, sizeof(float), a.batch, a.heads_k, 1, 1, st);
    }
  if (a.alibi_slopes) {  // fp32 [batch, heads] at its (sequence, head) strides; strides[0] 0: one row for all
    const int64_t st[3] = {a.alibi_strides[0], a.alibi_strides[1], 0};
    add_view(r, a.alibi_slopes, sizeof(float), a.batch, a.heads, 1, 1, st);
  }
  if (a.rng_state) r.push_back(rtc_mem_range{a.rng_state, 2 * sizeof(int64_t)});
  const int mode = kv_mode(a);
  const uint64_t lse_rows = mode == RTC_KV_DENSE ? uint64_t(a.batch) * a.seq_q : uint64_t(a.total_q);
  if (a.lse) r.push_back(rtc_mem_range{a.lse, lse_rows * a.heads * sizeof(float)});
  if (a.workspace && a.workspace_bytes > 0) r.push_back(rtc_mem_range{a.workspace, uint64_t(a.workspace_bytes)});
  if (mode != RTC_KV_DENSE) {
    const uint64_t cu_bytes = uint64_t(a.batch + 1) * sizeof(int32_t);
    r.push_back(rtc_mem_range{a.cu_seqlens_q, cu_bytes});
    r.push_back(rtc_mem_range{a.cu_seqlens_k, cu_bytes});
    if (a.seqused_k) r.push_back(rtc_mem_range{a.seqused_k, uint64_t(a.batch) * sizeof(int32_t)});
  }
  if (mode == RTC_KV_PAGED)
    r.push_back(
        rtc_mem_range{a.block_table, (uint64_t(a.batch - 1) * a.table_stride + a.pages_per_seq) * sizeof(int32_t)});
  return r;
}

void launch(uint64_t program, const rtc::LaunchTarget& t, const AttentionFwdArgs& a, const unsigned (&grid)[3],
            unsigned block, unsigned shared_bytes, const void* params, size_t size) {
  launch_within(program, t, tensor_ranges(a), grid, block, shared_bytes, params, size);
}

void launch_within(uint64_t program, const rtc::LaunchTarget& t, const std::vector<rtc_mem_range>& ranges,
                   const unsigned (&grid)[3], unsigned block, unsigned shared_bytes, const void* params, size_t size) {
  rtc_launch_config cfg{};
  cfg.vendor = t.vendor;
  cfg.device = t.device;
  cfg.stream = t.stream;
  for (int i = 0; i < 3; ++i) cfg.grid[i] = grid[i];
  cfg.block[0] = block;
  cfg.block[1] = cfg.block[2] = 1;
  cfg.shared_bytes = shared_bytes;
  cfg.ranges = ranges.data();
  cfg.n_ranges = int(ranges.size());
  rtc::launch_program(program, &cfg, params, size);
}

void require_workspace(const AttentionFwdArgs& a, int64_t need, const std::string& kernel) {
  RTC_CHECK(need == 0 || (a.workspace && a.workspace_bytes >= need), RTC_ERR_ARG,
            "workspace_bytes=" + std::to_string(a.workspace_bytes) + " is too small for " + kernel +
                "; accepted: >= " + std::to_string(need) + " (rtc_op_workspace_bytes with the same args)");
}

std::string aligned_why_not(const char* kernel, const char* name, const void* ptr, const int64_t (&st)[3],
                            int64_t align_elems) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
  if (addr % 16 != 0)
    return std::string(name) + " pointer is not 16-byte aligned (address % 16 = " + std::to_string(addr % 16) +
           "); the " + kernel + " kernel accepts 16-byte aligned tensors";
  for (int i = 0; i < 3; ++i)
    if (st[i] < 0 || st[i] % align_elems != 0 || st[i] >= (int64_t(1) << 38))
      return std::string(name) + "_strides[" + std::to_string(i) + "]=" + std::to_string(st[i]) +
             " is not accepted by the " + kernel + " kernel; accepted: a multiple of " + std::to_string(align_elems) +
             " elements in [0, 2^38)";
  return "";
}

int decode_splits(const AttentionFwdArgs& a, int64_t steps, int min_steps_per_part, bool can_plan,
                  const std::function<double(int64_t)>& cost) {
  const int request = (a.tail_split == -1 && rtc::knob_bool("NO_TAIL")) ? 0 : a.tail_split;
  if (request > 1) return std::min(request, DECODE_MAX_SPLITS);
  if (request != -1 || !can_plan) return 1;
  const int cap = a.max_splits > 0 ? std::min(a.max_splits, DECODE_MAX_SPLITS) : DECODE_MAX_SPLITS;
  const int64_t most = std::min<int64_t>(steps / min_steps_per_part, cap);
  int best_g = 1;
  double best = cost(1);
  for (int64_t g = 2; g <= most; ++g) {
    const double t = cost(g);
    if (t < best) best = t, best_g = int(g);  // ties keep the fewer parts
  }
  return best_g;
}

std::string json_object(const std::vector<std::pair<std::string, int64_t>>& fields) {
  std::string out = "{";
  for (const auto& f : fields) out += (out.size() > 1 ? ",\"" : "\"") + f.first + "\":" + std::to_string(f.second);
  return out + "}";
}

}  // namespace attention_fwd
