// Portable SIMT attention forward (no matrix instructions): the correctness fallback on every arch.
//
// One block of 128 threads owns 16 query rows of one (batch, head); grid = (ceil(Sq/16), H, B).
// Packed sequences (RTC_KV): batch counts sequences, Sq is the longest one's length, and blocks past
// their own sequence's end exit at once; paged K/V rows are found through the block table.
// Query head h reads K/V head kv_head(h) (GQA/MQA). With RTC_MASK, the block visits only the KV
// tiles its rows' windows reach, and scores outside a row's window are -Inf.
// Thread t serves row r = t / 8 and, inside that row, lane c = t % 8:
//   scores:  keys c, c+8, c+16, c+24 of each 32-row KV tile
//   P·V:     head-dim chunks (8 values each) c, c+8, c+16, c+24 (those below head_dim/8)
// K and V tiles are staged in shared memory; the O accumulator stays in registers.
// Elements (RTC_DTYPE) are bf16 or fp16, read exactly into fp32; P and O are rounded to the element type:
// bf16 with the variant's mode (RTC_ROUND), fp16 to nearest even (docs/numerics.md).
// A quantized cache (RTC_KV_DTYPE, packed calls): K / V rows are read as bytes and staged as their exact elements;
// the scores take the FP8 descale or the FP4 row's scale in fp32, O the FP8 V descale, p the FP4 V row's (kv_quant.h).
// Score modifications (RTC_SCORE_MOD: the soft cap, ALiBi) go on each score before the mask (score_mod.h).
// Dropout (RTC_DROPOUT): each score's keep bit is drawn with it (dropout.h); l sums every p, P V takes the kept ones
// times 1 / (1 - p), scaled in fp32 before their rounding.
#include "platform.h"
#include "attn_params.h"
#include "bf16_round.h"
#include "fp16_round.h"
#include "kv_quant.h"
#include "score_mod.h"
#include "dropout.h"

#ifndef RTC_HEAD_DIM_MAX
#error "RTC_HEAD_DIM_MAX (head-dim bucket: 32, 64, 96, 128, 192 or 256) must be defined"
#endif
// A bucket serves every head dim from one chunk (8) up to it in steps of 8: the loops run p.head_dim / 8
// chunks, so only the shared-memory pitch and the accumulator's size follow the bucket.
#if RTC_HEAD_DIM_MAX % 8 != 0 || RTC_HEAD_DIM_MAX < 8 || RTC_HEAD_DIM_MAX > 256
#error "RTC_HEAD_DIM_MAX must be a multiple of 8 in [8, 256]"
#endif
#if RTC_DTYPE != RTC_DTYPE_BF16 && RTC_DTYPE != RTC_DTYPE_FP16
#error "RTC_DTYPE must be 0 (bf16) or 1 (fp16)"
#endif

namespace {

constexpr int kThreads = 128;
constexpr int kRows = 16;                        // query rows per block
constexpr int kTile = 32;                        // KV rows per shared-memory tile
constexpr int kLanesPerRow = kThreads / kRows;   // 8
constexpr int kKeysPerLane = kTile / kLanesPerRow;
constexpr int kChunks = RTC_HEAD_DIM_MAX / 8;    // 16-byte chunks of 8 elements per row
constexpr int kChunksPerLane = (kChunks + kLanesPerRow - 1) / kLanesPerRow;
constexpr int kPad = kChunks + 1;                // one spare chunk per row staggers the banks
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kNegMax = -3.402823466e38f;      // -FLT_MAX: the running max never becomes -Inf

struct alignas(16) Chunk {  // 8 elements, two per word, lower index in the low half
  rtc_u32 w[4];
};

// The element type: fp32 of the element in the low / high half of a word, a word of two O values, and a word of two
// canonical NaNs (a row that sees keys and ends with l = 0); P's rounding is written out in tile_softmax_pv. (A
// namespace-scope constexpr becomes a device global under NVRTC, and a function for P changes NVRTC's schedule:
// either would change the bf16 code objects, which these keep byte for byte.)
#if RTC_DTYPE == RTC_DTYPE_FP16
RTC_DEVICE float elem_lo_f32(rtc_u32 w) { return rtc_fp16_lo_f32(w); }
RTC_DEVICE float elem_hi_f32(rtc_u32 w) { return rtc_fp16_hi_f32(w); }
RTC_DEVICE rtc_u32 pack_o(float a, float b) { return rtc_f32x2_to_fp16x2_rtne(a, b); }
RTC_DEVICE rtc_u32 nan_pair() { return RTC_FP16_NAN | (RTC_FP16_NAN << 16); }
#else
RTC_DEVICE float elem_lo_f32(rtc_u32 w) { return rtc_bf16_lo_f32(w); }
RTC_DEVICE float elem_hi_f32(rtc_u32 w) { return rtc_bf16_hi_f32(w); }
RTC_DEVICE rtc_u32 pack_o(float a, float b) {
  return (rtc_u32)rtc_f32_to_bf16(a) | ((rtc_u32)rtc_f32_to_bf16(b) << 16);
}
RTC_DEVICE rtc_u32 nan_pair() { return 0x7FFF7FFFu; }
#endif

struct Smem {
  rtc_smem<Chunk, kRows * kPad> q;
  rtc_smem<Chunk, kTile * kPad> k;
  rtc_smem<Chunk, kTile * kChunks> v;
  rtc_smem<float, kRows * kTile> s;  // scores of the tile, already in the log2 domain
#if RTC_KV_FP4
  rtc_smem<float, kTile> k_scale;  // the tile's key rows' E8M0 scales, as fp32
  rtc_smem<float, kTile> v_scale;
#endif
#if RTC_DROPOUT
  rtc_smem<unsigned char, kRows * kTile> keep;  // the tile's keep bits (dropout.h)
#endif
};

// The type of a K / V row's storage: the element, or the bytes of a quantized cache.
#if RTC_KV_DTYPE == RTC_KV_DTYPE_SAME
typedef rtc_elem_t kv_store_t;
#else
typedef unsigned char kv_store_t;
#endif

RTC_DEVICE float fast_exp2(float x) {
#if defined(RTC_NVIDIA)
  return exp2f(x);
#else
  return __builtin_exp2f(x);
#endif
}

// The reciprocal the soft cap takes: IEEE division, the portable one.
struct IeeeRcp {
  RTC_DEVICE float operator()(float x) const { return 1.0f / x; }
};
struct FastExp2 {
  RTC_DEVICE float operator()(float x) const { return fast_exp2(x); }
};

RTC_DEVICE float fast_log2(float x) {
#if defined(RTC_NVIDIA)
  return log2f(x);
#else
  return __builtin_log2f(x);
#endif
}

// A row of 8 consecutive elements at `src`; one 16-byte load when the caller proved alignment.
RTC_DEVICE Chunk load_chunk(const rtc_elem_t* src, bool aligned) {
  Chunk c;
  if (aligned) {
    // Field by field: returning *src or c would merge two pointers and force c into scratch.
    const Chunk g = rtc_gld(reinterpret_cast<const Chunk*>(src));
    for (int i = 0; i < 4; ++i) c.w[i] = g.w[i];
  } else {
    for (int i = 0; i < 4; ++i) c.w[i] = (rtc_u32)rtc_gld(src + 2 * i) | ((rtc_u32)rtc_gld(src + 2 * i + 1) << 16);
  }
  return c;
}

RTC_DEVICE void store_chunk(rtc_elem_t* dst, const Chunk& c, bool aligned) {
  if (aligned) {
    rtc_gst(reinterpret_cast<Chunk*>(dst), c);
    return;
  }
  for (int i = 0; i < 4; ++i) {
    rtc_gst(dst + 2 * i, (rtc_elem_t)(c.w[i] & 0xFFFFu));
    rtc_gst(dst + 2 * i + 1, (rtc_elem_t)(c.w[i] >> 16));
  }
}

// Whether every row start base + i*row_stride is 16-byte aligned (views may start anywhere).
RTC_DEVICE bool rows_aligned(const rtc_elem_t* base, rtc_i64 row_stride) {
  return (((rtc_u64)base | (rtc_u64)(row_stride * 2)) & 15u) == 0;
}

// Copies `rows` valid rows of `nch` chunks into a shared tile with row pitch `pitch`; the rest
// of the tile's rows become zeros so no later read sees stale data. src(row) is the row's first
// element, or null for a row that reads as zeros (a paged row whose page id is out of range).
template <int N, class RowSrc>
RTC_DEVICE void stage_rows(rtc_smem<Chunk, N>& dst, int pitch, int tile_rows, const RowSrc& src, int rows, int nch,
                           bool aligned) {
  const int total = tile_rows * nch;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int row = i / nch, ch = i - row * nch;
    Chunk c = {{0u, 0u, 0u, 0u}};
    const rtc_elem_t* r = row < rows ? src(row) : nullptr;
    if (r != nullptr) c = load_chunk(r + ch * 8, aligned);
    dst.st(row * pitch + ch, c);
  }
}

#if RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
// A quantized row's chunk `ch` (8 values: FP8 8 bytes, FP4 4) as its exact elements, byte by byte (rows and strides
// may have any alignment).
RTC_DEVICE Chunk load_chunk_q(const unsigned char* row, int ch) {
  Chunk c;
#if RTC_KV_FP4
  for (int i = 0; i < 4; ++i) c.w[i] = kv_fp4x2_elems(rtc_gld(row + ch * 4 + i));
#else
  for (int i = 0; i < 4; ++i)
    c.w[i] = kv_fp8_elem(rtc_gld(row + ch * 8 + 2 * i)) | (kv_fp8_elem(rtc_gld(row + ch * 8 + 2 * i + 1)) << 16);
#endif
  return c;
}

// stage_rows for a quantized cache's rows (src(row): the row's first byte, or null for a row of zeros).
template <int N, class RowSrc>
RTC_DEVICE void stage_rows_q(rtc_smem<Chunk, N>& dst, int pitch, int tile_rows, const RowSrc& src, int rows, int nch) {
  const int total = tile_rows * nch;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int row = i / nch, ch = i - row * nch;
    Chunk c = {{0u, 0u, 0u, 0u}};
    const unsigned char* r = row < rows ? src(row) : nullptr;
    if (r != nullptr) c = load_chunk_q(r, ch);
    dst.st(row * pitch + ch, c);
  }
}
#endif

// Rows `stride` elements apart from `base` (q, and k / v unless paged).
struct StridedRows {
  const rtc_elem_t* base;
  rtc_i64 stride;
  RTC_DEVICE const rtc_elem_t* operator()(int row) const { return base + (rtc_i64)row * stride; }
};

// Key rows j0 + row of sequence b of one K/V head: through the block table when paged.
struct KvRows {
  const AttnParams& p;
  const kv_store_t* base;  // dense / varlen: the sequence's row 0 of the head; paged: the pool's head
  rtc_i64 page_stride, row_stride;
  int b, j0;
  RTC_DEVICE const kv_store_t* operator()(int row) const {
    const int j = j0 + row;
    if (RTC_KV != RTC_KV_PAGED) return base + (rtc_i64)j * row_stride;
    const int page = page_of(p, b, j);
    return page < 0 ? nullptr : base + (rtc_i64)page * page_stride + (rtc_i64)(j % p.page_size) * row_stride;
  }
};

// fp32 dot products of one query row with this lane's keys, the elements' exact fp32 values as operands.
RTC_DEVICE void tile_scores(const Smem& sm, int r, int c, int nch, float (&acc)[kKeysPerLane]) {
  for (int t = 0; t < kKeysPerLane; ++t) acc[t] = 0.0f;
  for (int ch = 0; ch < nch; ++ch) {
    const Chunk qc = sm.q.ld(r * kPad + ch);
    for (int t = 0; t < kKeysPerLane; ++t) {
      const Chunk kc = sm.k.ld((c + kLanesPerRow * t) * kPad + ch);
      float a = acc[t];
      for (int w = 0; w < 4; ++w) {
        a += elem_lo_f32(qc.w[w]) * elem_lo_f32(kc.w[w]);
        a += elem_hi_f32(qc.w[w]) * elem_hi_f32(kc.w[w]);
      }
      acc[t] = a;
    }
  }
}

struct RowState {
  float m;  // running max of the log2-domain scores
  float l;  // running sum of the unrounded fp32 p
  float o[kChunksPerLane][8];
};

// The online-softmax step for one tile: new max, rescale, p = exp2(s - m), O += p·V with p rounded to the element
// type (an FP4 cache: then times its V row's scale, exactly).
// A NaN score leaves m alone (comparisons are false) and makes p, hence l and O, NaN.
RTC_DEVICE void tile_softmax_pv(const Smem& sm, int r, int c, int nch, int valid, float drop_scale, RowState& st) {
  float mx = st.m;
  for (int j = 0; j < valid; ++j) {
    const float s = sm.s.ld(r * kTile + j);
    mx = s > mx ? s : mx;
  }
  const float alpha = fast_exp2(st.m - mx);
  st.m = mx;
  st.l *= alpha;
  for (int u = 0; u < kChunksPerLane; ++u)
    for (int e = 0; e < 8; ++e) st.o[u][e] *= alpha;
  for (int j = 0; j < valid; ++j) {
    const float p = fast_exp2(sm.s.ld(r * kTile + j) - mx);
    st.l += p;
#if RTC_DROPOUT
    const float pd = sm.keep.ld(r * kTile + j) ? p * drop_scale : 0.0f;  // a dropped p adds to l, not to O
#else
    const float pd = p;
    (void)drop_scale;
#endif
#if RTC_DTYPE == RTC_DTYPE_FP16
    const float pb = rtc_fp16_to_f32(rtc_f32_to_fp16_rtne(pd));  // nearest even; below 2^-25 it is 0
#else
    const float pb = rtc_bf16_to_f32(rtc_f32_to_bf16(pd));  // with the variant's mode
#endif
#if RTC_KV_FP4
    const float pv = pb * sm.v_scale.ld(j);
#else
    const float pv = pb;
#endif
    for (int u = 0; u < kChunksPerLane; ++u) {
      const int ch = c + kLanesPerRow * u;
      if (ch >= nch) break;
      const Chunk vc = sm.v.ld(j * kChunks + ch);
      for (int w = 0; w < 4; ++w) {
        st.o[u][2 * w] += pv * elem_lo_f32(vc.w[w]);
        st.o[u][2 * w + 1] += pv * elem_hi_f32(vc.w[w]);
      }
    }
  }
}

// O / l rounded to the element type (bf16: with the mode), and the LSE. l == 0: every score the row saw was -Inf. A row that sees
// no key (sees_key false) is then the empty row: +0, LSE -Inf (numerics §8), even where O holds 0 * NaN
// from a V NaN. A row that sees keys got there through scores past -FLT_MAX (or Inf inputs), and a 0
// row would pass for a right answer: it is NaN, O the canonical NaN and LSE NaN (numerics §4). A select per row
// after the KV loop, none in it: the loop cannot tell the two -Inf apart (masking writes -Inf).
RTC_DEVICE void write_row(const RowState& st, bool sees_key, rtc_elem_t* orow, float* lse, int c, int nch,
                          bool aligned) {
  const bool empty = st.l == 0.0f;
  const rtc_u32 blank = sees_key ? nan_pair() : 0u;  // two elements
  for (int u = 0; u < kChunksPerLane; ++u) {
    const int ch = c + kLanesPerRow * u;
    if (ch >= nch) break;
    Chunk out;
    for (int w = 0; w < 4; ++w) {
      const float a = empty ? 0.0f : st.o[u][2 * w] / st.l;
      const float b = empty ? 0.0f : st.o[u][2 * w + 1] / st.l;
      out.w[w] = empty ? blank : pack_o(a, b);
    }
    store_chunk(orow + ch * 8, out, aligned);
  }
  if (lse != nullptr && c == 0)
    rtc_gst(lse, empty ? rtc_bits_f32(sees_key ? 0x7FC00000u : 0xFF800000u) : (st.m + fast_log2(st.l)) * kLn2);
}

}  // namespace

RTC_KERNEL(128) attention_fwd_baseline(AttnParams whole) {
  RTC_SHARED(Smem, sm);
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kRows;
  const Seq seq = seq_of(whole, b);
  if (q0 >= seq.len_q) return;  // packed sequences: the grid covers the longest one
  const AttnParams p = seq_view(whole, seq);  // this sequence's lengths: its own bottom-right masks
  const int r = threadIdx.x / kLanesPerRow, c = threadIdx.x % kLanesPerRow;
  const int nch = p.head_dim / 8;
  const rtc_elem_t* qb = p.q + seq.q_off + (rtc_i64)h * p.q_sh + (rtc_i64)q0 * p.q_ss;
  const int hk = kv_head(p, h);
  const kv_store_t* k_store = reinterpret_cast<const kv_store_t*>(p.k);
  const kv_store_t* v_store = reinterpret_cast<const kv_store_t*>(p.v);
  const KvRows kr{p, k_store + seq.k_off + (rtc_i64)hk * p.k_sh, p.k_sb, p.k_ss, b, 0};
  const KvRows vr{p, v_store + seq.v_off + (rtc_i64)hk * p.v_sh, p.v_sb, p.v_ss, b, 0};
#if RTC_KV_FP8
  const float k_descale = kv_descale(p.k_descale, p.kd_sb, p.kd_sh, b, hk);
#elif RTC_KV_FP4
  const unsigned char* ks_head = p.k_scale + (rtc_i64)hk * p.ks_sh;
  const unsigned char* vs_head = p.v_scale + (rtc_i64)hk * p.vs_sh;
#endif
  const int q_rows = p.seq_q - q0 < kRows ? p.seq_q - q0 : kRows;
  // The keys of this block: from the first row's window start to the last row's window end.
  int kv_begin = 0, kv_end = p.seq_k;
  KeyRange mine = {0, (rtc_i64)p.seq_k - 1};  // this thread's row's keys: empty for a sequence without keys
  if (RTC_MASK) {
    const KeyRange first = key_range(p, q0), last = key_range(p, q0 + q_rows - 1);
    kv_begin = (int)(first.lo / kTile) * kTile;
    kv_end = last.hi < first.lo ? kv_begin : (int)last.hi + 1;  // no key for any row: no tile
    mine = key_range(p, q0 + r);
  }
  // Paged rows start at a page's rows: aligned when the pool and all its strides are.
  const bool paged = RTC_KV == RTC_KV_PAGED;
#if RTC_KV_DTYPE == RTC_KV_DTYPE_SAME
  const bool k_al = rows_aligned(kr.base, p.k_ss) && (!paged || rows_aligned(p.k, p.k_sb));
  const bool v_al = rows_aligned(vr.base, p.v_ss) && (!paged || rows_aligned(p.v, p.v_sb));
#else
  (void)paged;
#endif

  stage_rows(sm.q, kPad, kRows, StridedRows{qb, p.q_ss}, q_rows, nch, rows_aligned(qb, p.q_ss));
  // This row's position among the keys, and its ALiBi slope (score_mod.h).
  const rtc_i64 diag = (rtc_i64)q0 + r + p.seq_k - p.seq_q;
  const float slope_log2 = RTC_ALIBI ? alibi_log2(rtc_gld(p.alibi_slopes + alibi_offset(p, b, h))) : 0.0f;
#if RTC_DROPOUT
  const DropoutState drop = {(rtc_u64)rtc_gld(p.rng_state), (rtc_u64)rtc_gld(p.rng_state + 1)};
#endif
  RowState st;
  st.m = kNegMax;
  st.l = 0.0f;
  for (int u = 0; u < kChunksPerLane; ++u)
    for (int e = 0; e < 8; ++e) st.o[u][e] = 0.0f;

  for (int kv0 = kv_begin; kv0 < kv_end; kv0 += kTile) {
    const int valid = p.seq_k - kv0 < kTile ? p.seq_k - kv0 : kTile;
    __syncthreads();  // the previous tile's K, V and scores are no longer read
    KvRows kt = kr, vt = vr;
    kt.j0 = vt.j0 = kv0;
#if RTC_KV_DTYPE == RTC_KV_DTYPE_SAME
    stage_rows(sm.k, kPad, kTile, kt, valid, nch, k_al);
    stage_rows(sm.v, kChunks, kTile, vt, valid, nch, v_al);
#else
    stage_rows_q(sm.k, kPad, kTile, kt, valid, nch);
    stage_rows_q(sm.v, kChunks, kTile, vt, valid, nch);
#endif
#if RTC_KV_FP4
    if ((int)threadIdx.x < valid) {  // valid <= kTile < kThreads: one key row a thread
      float ks, vs;
      kv_row_scales(p, ks_head, vs_head, b, seq.k_row, kv0 + threadIdx.x, ks, vs);
      sm.k_scale.st(threadIdx.x, ks);
      sm.v_scale.st(threadIdx.x, vs);
    }
#endif
    __syncthreads();
    float acc[kKeysPerLane];
    tile_scores(sm, r, c, nch, acc);
    for (int t = 0; t < kKeysPerLane; ++t) {
      const int j = c + kLanesPerRow * t;
      const bool seen = !RTC_MASK || (kv0 + j >= mine.lo && kv0 + j <= mine.hi);
#if RTC_KV_FP8
      acc[t] *= k_descale;  // the score of the dequantized keys, rounded once (numerics §10)
#elif RTC_KV_FP4
      if (j < valid) acc[t] *= sm.k_scale.ld(j);  // a power of two: exact
#endif
      const float t2 = modded_score(acc[t], p, slope_log2, kv0 + j, diag, FastExp2{}, IeeeRcp{}).t;
      if (j < valid) sm.s.st(r * kTile + j, seen ? t2 : rtc_bits_f32(0xFF800000u));
#if RTC_DROPOUT
      if (j < valid) sm.keep.st(r * kTile + j, dropout_keep(drop, p.drop_threshold, p.heads, b, h, q0 + r, kv0 + j));
#endif
    }
    __syncthreads();
    tile_softmax_pv(sm, r, c, nch, valid, p.drop_scale, st);
  }

  if (r >= q_rows) return;
#if RTC_KV_FP8
  const float v_descale = kv_descale(p.v_descale, p.vd_sb, p.vd_sh, b, hk);
  for (int u = 0; u < kChunksPerLane; ++u)
    for (int e = 0; e < 8; ++e) st.o[u][e] *= v_descale;  // O of the dequantized values, before / l (numerics §10)
#endif
  rtc_elem_t* orow = p.o + seq.o_off + (rtc_i64)h * p.o_sh + (rtc_i64)(q0 + r) * p.o_ss;
  float* lse = p.lse ? p.lse + seq.lse_off + (rtc_i64)h * seq.lse_head_stride + q0 + r : nullptr;
  write_row(st, mine.lo <= mine.hi, orow, lse, c, nch, rows_aligned(orow, 0));
}
RTC_EXPORT_KERNEL(attention_fwd_baseline, AttnParams)
