// Host pieces the sm_90a kernels share: TMA tensor maps over q, k, v (through the dlopened driver) for each kv form.
#pragma once
#include <cstdint>
#include "args.h"
#include "sm90/params.h"

namespace attention_fwd {

// The driver must be there and offer cuTensorMapEncodeTiled (CUDA >= 12): a clear error naming `kernel` otherwise.
void require_tensor_maps(const char* kernel);

// A 4-D map (d, s, h, b) over tensor `name`, elements of `unit` bytes (2: bf16 / fp16; 1: a quantized cache's
// bytes), strides in elements (batch, seq, head), box (128 bytes of a row, box_rows, 1, 1), 128-byte swizzle, zeros
// out of bounds.
Sm90TensorMap sm90_tensor_map(const char* name, const void* ptr, const int64_t (&st)[3], int64_t d, int64_t seq,
                              int64_t heads, int64_t batch, unsigned box_rows, int unit = 2);

// K and V maps for the call's kv form and cache element (kv_unit_bytes: a quantized cache's maps move its bytes, D
// of them a row for FP8), boxes of block_rows rows: dense [B, S, Hk, D] (batch coordinate b), packed rows
// [total_k, Hk, D] (one "batch"), paged [num_pages, page_size, Hk, D] (the page is the batch coordinate; boxes of
// gcd(page_size, block_rows) rows, so none crosses a page).
struct KvMaps {
  Sm90TensorMap k, v;
  int box_rows;    // rows of a K/V box
  int page_shift;  // paged: log2(page_size) (page sizes are powers of two); else 0
};
KvMaps sm90_kv_maps(const AttentionFwdArgs& a, unsigned block_rows);

}  // namespace attention_fwd
