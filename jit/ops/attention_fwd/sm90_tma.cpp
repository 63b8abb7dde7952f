// TMA tensor maps for the sm_90a kernels (sm90.cpp, sm90_decode.cpp).
#include "sm90_tma.h"
#include "common.h"
#include "cuda_driver.h"
#include <cstring>
#include <string>

namespace attention_fwd {

using rtc::cuda_check;
using rtc::cuda_driver;

static_assert(sizeof(Sm90TensorMap) == 128 && alignof(Sm90TensorMap) == 64,
              "Sm90TensorMap must match CUtensorMap (128 bytes, 64-byte aligned)");

void require_tensor_maps(const char* kernel) {
  const rtc::CudaDriver& cu = cuda_driver();
  RTC_CHECK(cu.why.empty(), RTC_ERR_UNAVAILABLE, cu.why);
  RTC_CHECK(cu.encode_tiled, RTC_ERR_UNAVAILABLE,
            std::string("the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA >= 12), which the ") + kernel +
                " kernel needs");
}

Sm90TensorMap sm90_tensor_map(const char* name, const void* ptr, const int64_t (&st)[3], int64_t d, int64_t seq,
                              int64_t heads, int64_t batch, unsigned box_rows, int unit) {
  // Elements travel as 16-bit words, bf16 and fp16 alike, or as bytes (FP8): TMA only moves them, and its zero fill
  // is +0 in each.
  const int kUint8 = 0, kUint16 = 1, kInterleaveNone = 0, kSwizzle128 = 3, kL2Promote256 = 3, kOobZero = 0;
  const uint64_t u = uint64_t(unit);
  uint64_t dims[4] = {uint64_t(d), uint64_t(seq), uint64_t(heads), uint64_t(batch)};
  uint64_t strides[3] = {uint64_t(st[1]) * u, uint64_t(st[2]) * u, uint64_t(st[0]) * u};
  unsigned box[4] = {unsigned(128 / unit), box_rows, 1, 1};
  unsigned elem[4] = {1, 1, 1, 1};
  Sm90TensorMap m;
  std::memset(&m, 0, sizeof m);
  cuda_check(cuda_driver().encode_tiled(&m, unit == 1 ? kUint8 : kUint16, 4, const_cast<void*>(ptr), dims, strides, box,
                                        elem, kInterleaveNone, kSwizzle128, kL2Promote256, kOobZero),
             RTC_ERR_LAUNCH, std::string("cuTensorMapEncodeTiled(") + name + ")");
  return m;
}

KvMaps sm90_kv_maps(const AttentionFwdArgs& a, unsigned block_rows) {
  KvMaps m;
  m.box_rows = int(block_rows);
  m.page_shift = 0;
  const int64_t d = kv_row_units(a);
  const int unit = int(kv_unit_bytes(a)), mode = kv_mode(a);
  if (mode == RTC_KV_DENSE) {
    m.k = sm90_tensor_map("k", a.k, a.k_strides, d, a.seq_k, a.heads_k, a.batch, block_rows, unit);
    m.v = sm90_tensor_map("v", a.v, a.v_strides, d, a.seq_k, a.heads_k, a.batch, block_rows, unit);
  } else if (mode == RTC_KV_PAGED) {
    m.box_rows = int(block_rows & -block_rows);
    if (a.page_size < m.box_rows) m.box_rows = int(a.page_size);
    while ((int64_t(1) << m.page_shift) < a.page_size) ++m.page_shift;
    m.k = sm90_tensor_map("k", a.k, a.k_strides, d, a.page_size, a.heads_k, a.num_pages, unsigned(m.box_rows), unit);
    m.v = sm90_tensor_map("v", a.v, a.v_strides, d, a.page_size, a.heads_k, a.num_pages, unsigned(m.box_rows), unit);
  } else {  // packed rows: one "batch" of total rows (its stride is never stepped; any valid value does)
    const int64_t k_st[3] = {a.k_strides[1], a.k_strides[1], a.k_strides[2]};
    const int64_t v_st[3] = {a.v_strides[1], a.v_strides[1], a.v_strides[2]};
    m.k = sm90_tensor_map("k", a.k, k_st, d, a.total_k, a.heads_k, 1, block_rows, unit);
    m.v = sm90_tensor_map("v", a.v, v_st, d, a.total_k, a.heads_k, 1, block_rows, unit);
  }
  return m;
}

}  // namespace attention_fwd
