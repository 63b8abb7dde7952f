// Host side of the gfx942 fast kernel: the tail-split planner, workspace sizing, three launches per call.
#include "op.h"
#include "common.h"
#include "gfx942/params.h"
#include "knobs.h"
#include <algorithm>
#include <cstring>
#include <string>

namespace attention_fwd {
namespace {

// AttnParams is trivial, so the derived fields start right after it on the host and on the GPU.
static_assert(sizeof(Gfx942Params) == sizeof(AttnParams) + 40, "Gfx942Params size changed: check the kernel");

const AttentionFwdArgs& args_of(const void* p) { return *static_cast<const AttentionFwdArgs*>(p); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// "64, 96, ...": the buckets, for messages.
#define GFX942_TEXT(...) #__VA_ARGS__
#define GFX942_TEXT_OF(x) GFX942_TEXT(x)
const char* const kBucketList = GFX942_TEXT_OF(GFX942_BUCKETS);

// The shape of the call's head-dim bucket (gfx942/params.h): its q rows per work item, V^T block and partial.
struct Shape {
  int bucket, q_rows;
  int64_t vt_block_bytes, part_bytes;
};
Shape shape_of(const AttentionFwdArgs& a) {
  const int b = gfx942_bucket(int(a.head_dim));  // validate() bounded head_dim by 256
  return {b, gfx942_q_rows(b), gfx942_vt_block_bytes(b), gfx942_part_bytes(b)};
}

// The tail-split plan of one call: a pure function of the problem, num_cus, tail_split, max_splits and
// the NO_TAIL knob.
struct Plan {
  Shape shape = {};
  int nqb = 0, nkb = 0;      // q blocks (the bucket's q rows) and kv blocks (64 rows) per (b, h)
  int64_t items = 0;         // B*H*nqb workgroup-sized work items
  int n_prefix = 0;          // items run whole
  int tail = 0;              // items split (0: none)
  int split_g = 1;           // parts per split item
  int n_swz = 0;             // prefix workgroups under the XCD swizzle
  int vt_head_blocks = 0;    // packed sequences: V^T blocks per K/V head (dense: unused)
  int64_t vt_bytes = 0, workspace_bytes = 0;
};

// Cost of the last round in kv blocks: unsplit, every tail item streams all nkb blocks; split in
// g parts, ceil(tail*g / cus) waves of ceil(nkb/g) blocks plus the merge (about 3 blocks' time).
// max_splits >= 1 caps g (the argument block's max_splits; 0: no cap beyond the planner's own).
int pick_split(int64_t tail, int cus, int nkb, int max_splits) {
  if (tail == 0 || nkb < 48 || tail * 19 > int64_t(cus) * 18) return 1;  // nothing stranded, or too little to win
  int best_g = 1;
  int64_t best = nkb;
  for (int g = 2; g <= 2 * cus / tail && g <= nkb / 4 && (max_splits == 0 || g <= max_splits); ++g) {
    const int64_t cost = ceil_div(tail * g, cus) * ceil_div(nkb, g) + 3;
    if (cost < best) best = cost, best_g = g;
  }
  return best_g;
}

// A [rows, row_units] view of unit_bytes-byte units (16-bit elements; a quantized cache's bytes) with row stride
// row_stride units.
std::string span_why_not(const char* name, int64_t rows, int64_t row_stride, int64_t row_units,
                         int64_t unit_bytes = 2) {
  const int64_t bytes = rows <= 0 ? 0 : ((rows - 1) * row_stride + row_units) * unit_bytes;
  if (row_stride >= 0 && bytes < (int64_t(1) << 32)) return "";
  return std::string(name) + "_strides[1]=" + std::to_string(row_stride) + " over " + std::to_string(rows) +
         " rows spans " + std::to_string(bytes) +
         " bytes; the gfx942 kernel rebases its buffer resources per "
         "(batch, head) and accepts a non-negative row stride with a span below 4 GiB per (batch, head)";
}

// The V^T run of one K/V head of a packed call, from what the host knows without reading a length
// (total_k; the block table's width, which bounds a paged length in seq_of), never from max_seqlen_k except
// with seqused_k, whose values it bounds (used_keys): slot = the most blocks one sequence can need, head_blocks =
// the run (INT64_MAX on overflow).
struct VtRun {
  int64_t slot = 0, head_blocks = 0;
};
VtRun vt_run(const AttentionFwdArgs& a) {
  VtRun r;
  const bool paged = kv_mode(a) == RTC_KV_PAGED;
  if (paged || a.seqused_k) {  // a slot per sequence (gfx942/sequences.h: vt_slot)
    r.slot = ceil_div(paged ? a.pages_per_seq * a.page_size : a.seq_k, GFX942_KV_ROWS);  // validate(): each < 2^31
    if (__builtin_mul_overflow(r.slot, a.batch, &r.head_blocks)) r.head_blocks = INT64_MAX;
  } else {
    r.slot = ceil_div(a.total_k, GFX942_KV_ROWS);
    r.head_blocks = r.slot + a.batch;
  }
  return r;
}

// Packed calls: ints for the work items and the V^T run, and 32-bit V^T offsets inside one sequence.
// The V^T blocks of a (batch, head) or a packed sequence are read at 32-bit offsets through a resource of
// 0xFFFFFFFF records: at most this many blocks, and keys.
int64_t max_vt_blocks(const Shape& sh) { return int64_t(0xFFFFFFFF) / sh.vt_block_bytes; }
int64_t max_vt_keys(const Shape& sh) { return max_vt_blocks(sh) * GFX942_KV_ROWS; }

std::string packed_why_not(const AttentionFwdArgs& a) {
  const Shape sh = shape_of(a);
  const int64_t nqb = ceil_div(a.seq_q, sh.q_rows);
  int64_t items = 0, vt = 0;
  if (__builtin_mul_overflow(a.batch * a.heads, nqb, &items) || items >= (int64_t(1) << 31))
    return "batch*heads*ceil(max_seqlen_q/" + std::to_string(sh.q_rows) + ")=" + std::to_string(items) +
           " work items is too many for the gfx942 kernel; accepted: < 2^31";
  const VtRun run = vt_run(a);
  const bool paged = kv_mode(a) == RTC_KV_PAGED;
  if (run.slot > max_vt_blocks(sh))
    return (paged ? "block_table.shape[1]*page_size=" + std::to_string(a.pages_per_seq) + "*" +
                        std::to_string(a.page_size)
            : a.seqused_k ? "max_seqlen_k=" + std::to_string(a.seq_k) + " (seqused_k set)"
                          : "total_k=" + std::to_string(a.total_k)) +
           " keys per sequence is not accepted by the gfx942 kernel at head dim " + std::to_string(a.head_dim) +
           " (it reads a sequence's V^T at 32-bit offsets); accepted: at most " + std::to_string(max_vt_keys(sh));
  if (__builtin_mul_overflow(a.heads_k, run.head_blocks, &vt) || vt >= (int64_t(1) << 31))
    return "heads_k=" + std::to_string(a.heads_k) + " times " + std::to_string(run.head_blocks) + " V^T blocks (" +
           (paged         ? "batch*ceil(block_table.shape[1]*page_size/64)"
            : a.seqused_k ? "batch*ceil(max_seqlen_k/64)"
                          : "ceil(total_k/64)+batch") +
           ") is too many for the gfx942 kernel; accepted: < 2^31";
  return "";
}

std::string why_not(const void* p, const char* vendor) {
  const AttentionFwdArgs& a = args_of(p);
  const std::string v = vendor;
  if (v != "hip" && v != "host")
    return "vendor=" + rtc::quote(v) + " is not accepted by the gfx942 kernel; accepted: hip, host";
  if (a.head_dim % 8 != 0 || gfx942_bucket(int(a.head_dim)) == 0)
    return "head_dim=" + std::to_string(a.head_dim) +
           " is not accepted by the gfx942 kernel; accepted: a multiple of 8 from 8 to 256 (buckets " + kBucketList +
           ")";
  // The rows one K/V buffer resource spans: a (batch, head), a packed sequence (at most total_k rows),
  // or one page.
  const int mode = kv_mode(a);
  const int64_t kv_rows = mode == RTC_KV_PAGED ? a.page_size : mode == RTC_KV_VARLEN ? a.total_k : a.seq_k;
  for (const std::string& why : {span_why_not("q", shape_of(a).q_rows, a.q_strides[1], a.head_dim),
                                 span_why_not("o", shape_of(a).q_rows, a.o_strides[1], a.head_dim),
                                 span_why_not("k", kv_rows, a.k_strides[1], kv_row_units(a), kv_unit_bytes(a)),
                                 span_why_not("v", kv_rows, a.v_strides[1], kv_row_units(a), kv_unit_bytes(a))})
    if (!why.empty()) return why;
  if (mode != RTC_KV_DENSE && a.tail_split > 1)
    return "tail_split=" + std::to_string(a.tail_split) +
           " is not accepted by the gfx942 kernel for packed "
           "sequences (varlen / paged); accepted: -1 (planned: no split) or 0";
  if (mode != RTC_KV_DENSE) return packed_why_not(a);
  // Every stage's grid is one dimension of < 2^31 workgroups, and the work counters are ints.
  const Shape sh = shape_of(a);
  const int64_t nkb = ceil_div(a.seq_k, GFX942_KV_ROWS), nqb = ceil_div(a.seq_q, sh.q_rows);
  int64_t vt = 0, items = 0;
  if (__builtin_mul_overflow(a.batch * a.heads, nkb, &vt) || vt >= (int64_t(1) << 31) ||
      __builtin_mul_overflow(a.batch * a.heads, nqb, &items) || items >= (int64_t(1) << 31))
    return "batch*heads*ceil(seq_k/64)=" + std::to_string(vt) + " V^T blocks or batch*heads*ceil(seq_q/" +
           std::to_string(sh.q_rows) + ")=" + std::to_string(items) +
           " work items is too many for the gfx942 kernel; accepted: < 2^31 each";
  // A (batch, K/V head)'s V^T blocks are read at 32-bit offsets from its first.
  if (nkb > max_vt_blocks(sh))
    return "seq_k=" + std::to_string(a.seq_k) + " is not accepted by the gfx942 kernel at head dim " +
           std::to_string(a.head_dim) + " (it reads V^T at 32-bit offsets); accepted: at most " +
           std::to_string(max_vt_keys(sh));
  return "";
}

// Packed sequences: every (sequence, head) gets the q blocks of the longest one, longest first, no
// split (the host knows no length); V^T per K/V head in vt_head_blocks blocks (gfx942/sequences.h).
// Paged: nkb is a sequence's V^T slot, the blocks its block-table row can address.
Plan packed_plan(const AttentionFwdArgs& a, Plan pl) {
  const VtRun run = vt_run(a);
  pl.n_prefix = int(pl.items);
  if (kv_mode(a) == RTC_KV_PAGED || a.seqused_k) pl.nkb = int(run.slot);
  pl.vt_head_blocks = int(run.head_blocks);
  pl.vt_bytes = int64_t(a.heads_k) * pl.vt_head_blocks * pl.shape.vt_block_bytes;
  pl.workspace_bytes = pl.vt_bytes;
  // A quantized cache: the expanded K rows, block for block as V^T, and FP4's key scales (gfx942/kv_cache.h).
  if (a.kv_dtype != RTC_KV_DTYPE_SAME) pl.workspace_bytes += pl.vt_bytes;
  if (a.kv_dtype == RTC_KV_DTYPE_FP4_E2M1)
    pl.workspace_bytes += int64_t(a.heads_k) * pl.vt_head_blocks * GFX942_KV_ROWS * 4;
  return pl;
}

Plan make_plan(const AttentionFwdArgs& a) {
  Plan pl;
  pl.shape = shape_of(a);
  pl.nqb = int(ceil_div(a.seq_q, pl.shape.q_rows));
  pl.nkb = int(ceil_div(a.seq_k, GFX942_KV_ROWS));
  pl.items = int64_t(a.batch) * a.heads * pl.nqb;
  if (kv_mode(a) != RTC_KV_DENSE) return packed_plan(a, pl);
  const int cus = a.num_cus;
  // NO_TAIL turns off a planned split; an explicit request still wins.
  const int request = (a.tail_split == -1 && rtc::knob_bool("NO_TAIL")) ? 0 : a.tail_split;
  int64_t tail = cus > 0 ? pl.items % cus : 0;
  int g = 1;
  if (request > 1) {  // forced: the last (possibly full) round's items, as many parts as asked
    if (tail == 0) tail = cus > 0 && cus < pl.items ? cus : pl.items;
    g = request < pl.nkb ? request : pl.nkb;
  } else if (request == -1 && cus > 0) {
    g = pick_split(tail, cus, pl.nkb, a.max_splits);
  }
  if (g < 2) tail = 0, g = 1;
  pl.tail = int(tail);
  pl.split_g = g;
  pl.n_prefix = int(pl.items - tail);
  pl.n_swz = pl.n_prefix / 8 * 8;
  pl.vt_bytes = int64_t(a.batch) * a.heads_k * pl.nkb * pl.shape.vt_block_bytes;  // V^T per K/V head
  pl.workspace_bytes = pl.vt_bytes + int64_t(pl.tail) * pl.split_g * pl.shape.part_bytes;
  return pl;
}

// Workgroups of each stage, in launch order: V^T, then whole items and split parts in one grid,
// then (when split) the merge.
std::vector<std::pair<int, int64_t>> stages(const AttentionFwdArgs& a, const Plan& pl) {
  // V^T: dense one workgroup per block; varlen one per block of the run (pad blocks exit); paged a
  // stride of max_seqlen_k's blocks per (sequence, K/V head) (gfx942/companions.h).
  const int mode = kv_mode(a);
  const int64_t vt = mode == RTC_KV_VARLEN ? int64_t(a.heads_k) * pl.vt_head_blocks
                     : mode == RTC_KV_PAGED
                         ? int64_t(a.batch) * a.heads_k * gfx942_paged_vt_stride(int(a.seq_k), pl.nkb)
                         : int64_t(a.batch) * a.heads_k * pl.nkb;
  std::vector<std::pair<int, int64_t>> s = {{GFX942_STAGE_VT, vt},
                                            {GFX942_STAGE_ATTN, pl.n_prefix + int64_t(pl.tail) * pl.split_g}};
  if (pl.tail > 0) s.push_back({GFX942_STAGE_MERGE, int64_t(pl.tail) * (pl.shape.q_rows / GFX942_MERGE_ROWS)});
  return s;
}

int64_t workspace_bytes(const void* p) { return make_plan(args_of(p)).workspace_bytes; }

// The kv blocks every work item visits, as the kernel computes them (kv_span): their total,
// how many of them a window cuts (masked softmax), and the largest item's count. Items of one
// q block are alike across (b, h), so one pass over the q blocks suffices.
struct BlockCounts {
  int64_t total = 0, masked = 0, max_item = 0;
};
BlockCounts block_counts(const AttentionFwdArgs& a, const Plan& pl) {
  const AttnParams ap = fill_params(a);
  const bool masked = a.window_left != -1 || a.window_right != -1;
  BlockCounts c;
  for (int qb = 0; qb < pl.nqb; ++qb) {
    const int qr = pl.shape.q_rows, q0 = qb * qr, rows = a.seq_q - q0 < qr ? int(a.seq_q - q0) : qr;
    const KvSpan sp = kv_span(ap, q0, rows, GFX942_KV_ROWS, masked);
    c.total += sp.end - sp.begin;
    c.masked += (sp.end - sp.begin) - (sp.full_end - sp.full_begin);
    c.max_item = std::max<int64_t>(c.max_item, sp.end - sp.begin);
  }
  const int64_t bh = a.batch * a.heads;
  c.total *= bh;
  c.masked *= bh;
  return c;
}

std::string plan_json(const void* p) {
  const AttentionFwdArgs& a = args_of(p);
  const Plan pl = make_plan(a);
  const BlockCounts bc = block_counts(a, pl);
  std::vector<std::pair<std::string, int64_t>> f = {{"nqb", pl.nqb},
                                                    {"nkb", pl.nkb},
                                                    {"items", pl.items},
                                                    {"n_prefix", pl.n_prefix},
                                                    {"tail", pl.tail},
                                                    {"split_g", pl.split_g},
                                                    {"n_swz", pl.n_swz},
                                                    {"vt_head_blocks", pl.vt_head_blocks},
                                                    {"vt_bytes", pl.vt_bytes},
                                                    {"workspace_bytes", pl.workspace_bytes},
                                                    {"block", GFX942_THREADS},
                                                    {"bucket", pl.shape.bucket},
                                                    {"q_rows", pl.shape.q_rows},
                                                    {"blocks_total", bc.total},
                                                    {"blocks_masked", bc.masked},
                                                    {"blocks_max_item", bc.max_item}};
  const char* names[] = {"grid_vt", "grid_attn", "grid_merge"};
  for (const auto& s : stages(a, pl)) f.push_back({names[s.first], s.second});
  return json_object(f);
}

void launch_gfx942(uint64_t program, const void* p, const rtc::LaunchTarget& t) {
  const AttentionFwdArgs& a = args_of(p);
  const Plan pl = make_plan(a);
  require_workspace(a, pl.workspace_bytes, "the gfx942 kernel");
  Gfx942Params gp;
  std::memset(&gp, 0, sizeof gp);
  static_cast<AttnParams&>(gp) = fill_params(a);
  gp.tail_split = pl.split_g;
  gp.nqb = pl.nqb;
  gp.nkb = pl.nkb;
  gp.n_prefix = pl.n_prefix;
  gp.tail = pl.tail;
  gp.split_g = pl.split_g;
  gp.n_swz = pl.n_swz;
  gp.vt_head_blocks = pl.vt_head_blocks;
  gp.vt_bytes = pl.vt_bytes;
  // Same stream, in order, so each stage sees the previous one's writes.
  for (const auto& s : stages(a, pl)) {
    RTC_CHECK(s.second > 0 && s.second < (int64_t(1) << 31), RTC_ERR_ARG,
              "the gfx942 kernel needs " + std::to_string(s.second) + " workgroups for stage " +
                  std::to_string(s.first) + "; accepted: fewer than 2^31 (reduce batch*heads*seq)");
    gp.stage = s.first;
    const unsigned grid[3] = {unsigned(s.second), 1, 1};
    launch(program, t, a, grid, GFX942_THREADS, 0, &gp, sizeof gp);  // static LDS only
  }
}

}  // namespace

rtc::KernelHost gfx942_host() { return {"gfx942", why_not, workspace_bytes, plan_json, launch_gfx942}; }

}  // namespace attention_fwd
