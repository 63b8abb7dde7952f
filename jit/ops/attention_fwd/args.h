// The argument block of attention_fwd: what the Python layer fills (pointers, strides, sizes) for one call.
#pragma once
#include <cstddef>
#include <cstdint>
#include "attn_params.h"
#include "score_mod.h"
#include "dropout.h"
#include "op_registry.h"

// X(name, C type, ArgKind, count). Strides are in elements, in (batch, seq, head) order whatever the
// layout. Sizes travel as 64-bit so the checks see (and name) the caller's true value. The runtime
// describes this list to Python (rtc_ops_json): it is the only definition.
// clang-format off: a table, its columns aligned by hand
#define ATTENTION_FWD_ARGS(X)                                                                  \
  X(q, const void*, Ptr, 1)                                                                    \
  X(k, const void*, Ptr, 1)                                                                    \
  X(v, const void*, Ptr, 1)                                                                    \
  X(o, void*, Ptr, 1)                                                                          \
  X(lse, float*, Ptr, 1)            /* null when not requested; else [B, H, Sq] contiguous */  \
  X(workspace, void*, Ptr, 1)                                                                  \
  X(workspace_bytes, int64_t, I64, 1)                                                          \
  X(q_strides, int64_t, I64, 3)                                                                \
  X(k_strides, int64_t, I64, 3)                                                                \
  X(v_strides, int64_t, I64, 3)                                                                \
  X(o_strides, int64_t, I64, 3)                                                                \
  X(batch, int64_t, I64, 1)                                                                    \
  X(heads, int64_t, I64, 1)                                                                    \
  X(seq_q, int64_t, I64, 1)                                                                    \
  X(seq_k, int64_t, I64, 1)                                                                    \
  X(head_dim, int64_t, I64, 1)                                                                 \
  X(heads_k, int64_t, I64, 1)       /* K/V heads; heads % heads_k == 0 (GQA/MQA) */            \
  X(window_left, int64_t, I64, 1)   /* -1 = unbounded (read by the masked variants) */        \
  X(window_right, int64_t, I64, 1)  /* -1 = unbounded; causal = 0 */                          \
  X(softmax_scale, float, F32, 1)                                                              \
  X(tail_split, int32_t, I32, 1)    /* -1 = the planner decides, 0 = off, >1 = forced parts */ \
  X(max_splits, int32_t, I32, 1)    /* 0 = the kernel's own cap, n >= 1 = at most n parts */   \
  X(num_cus, int32_t, I32, 1)       /* CUs / SMs of the device (planner input; <= 0 unknown) */ \
  X(hbm_gbps, int32_t, I32, 1)      /* the device's memory bandwidth, GB/s (planner input; <= 0 unknown) */ \
  X(lds_per_cu, int32_t, I32, 1)    /* LDS / shared memory bytes a CU holds (planner input; <= 0 unknown) */ \
  X(gfx_arch, int32_t, I32, 1)      /* AMD: the arch's gfx hex digits, 0x942, 0x90a, 0x950 (planner input; 0 other) */ \
  /* Packed sequences (varlen), and K/V in pages (paged): null pointers for a dense call. Then */  \
  /* batch counts sequences, seq_q / seq_k are max_seqlen_q / max_seqlen_k, q / o are           */  \
  /* [total_q, heads, D] (strides[0] unused) and k / v [total_k, heads_k, D] or, paged,         */  \
  /* [num_pages, page_size, heads_k, D] (strides: page, row, head); lse is [heads, total_q].    */  \
  /* seqused_k set: sequence b uses seqused_k[b] keys from its first key row (varlen cu_k[b],   */  \
  /* paged its block-table row's first), clamped to max_seqlen_k and to the rows it can reach;  */  \
  /* cu_seqlens_k then gives only the first rows (varlen) and its last entry is never read.     */  \
  X(cu_seqlens_q, const void*, Ptr, 1)  /* int32 [batch + 1] */                                 \
  X(cu_seqlens_k, const void*, Ptr, 1)  /* int32 [batch + 1] */                                 \
  X(block_table, const void*, Ptr, 1)   /* paged: int32, row b at b * table_stride */           \
  X(seqused_k, const void*, Ptr, 1)     /* null, or int32 [batch]: sequence b's keys (above) */  \
  X(total_q, int64_t, I64, 1)                                                                  \
  X(total_k, int64_t, I64, 1)           /* varlen: rows of k / v */                             \
  X(page_size, int64_t, I64, 1)                                                                \
  X(num_pages, int64_t, I64, 1)                                                                \
  X(pages_per_seq, int64_t, I64, 1)     /* block-table entries per sequence */                  \
  X(table_stride, int64_t, I64, 1)                                                             \
  /* A quantized K / V cache (kv_dtype: the kv_dtype axis's value, RTC_KV_DTYPE_*; packed calls only): k / v hold */ \
  /* bytes, and their strides count storage units, a byte (an FP8 value, or two FP4 values: D / 2 a row).        */ \
  /* FP8: a stored value stands for value * descale (FA3's k_descale / v_descale), fp32 at (sequence b, K/V    */ \
  /* head h) b * strides[0] + h * strides[1] (0, 0: one value), null for 1. FP4: one E8M0 byte per key row and */ \
  /* head, at the (page, row, head) strides in bytes like k / v's (varlen: page stride 0).                    */ \
  X(kv_dtype, int32_t, I32, 1)          /* RTC_KV_DTYPE_SAME (q's dtype), _FP8_E4M3, _FP8_E4M3FNUZ, _FP4_E2M1(_NATIVE) */ \
  X(k_descale, const float*, Ptr, 1)                                                           \
  X(v_descale, const float*, Ptr, 1)                                                           \
  X(k_descale_strides, int64_t, I64, 2)                                                        \
  X(v_descale_strides, int64_t, I64, 2)                                                        \
  X(k_scale, const void*, Ptr, 1)                                                              \
  X(v_scale, const void*, Ptr, 1)                                                              \
  X(k_scale_strides, int64_t, I64, 3)                                                          \
  X(v_scale_strides, int64_t, I64, 3)                                                          \
  /* Score modifications (the score_mod axis, RTC_SCORE_MOD: score_mod.h): softcap > 0 caps each scaled score s   */ \
  /* at softcap * tanh(s / softcap) (0: off); alibi_slopes (null: off) adds -slope * |j - (i + Sk - Sq)|, the      */ \
  /* fp32 slope of (sequence or batch b, query head h) at b * strides[0] + h * strides[1] ([Hq]: strides[0] 0).    */ \
  X(softcap, float, F32, 1)                                                                    \
  X(alibi_slopes, const float*, Ptr, 1)                                                        \
  X(alibi_strides, int64_t, I64, 2)                                                            \
  /* Dropout (the dropout axis, RTC_DROPOUT: dropout.h): dropout_p in [0, 1) (0: off); rng_state int64 [2], the  */ \
  /* Philox key and counter offset the keep mask is a function of (required with dropout_p > 0).                 */ \
  X(dropout_p, float, F32, 1)                                                                  \
  X(rng_state, const void*, Ptr, 1)
// clang-format on

struct AttentionFwdArgs {
  ATTENTION_FWD_ARGS(RTC_ARG_MEMBER)
};

// How the call's sequences are stored: the kv-axis value (RTC_KV_*, attn_params.h) the call needs.
inline int kv_mode(const AttentionFwdArgs& a) {
  return a.block_table ? RTC_KV_PAGED : a.cu_seqlens_q ? RTC_KV_VARLEN : RTC_KV_DENSE;
}

// Whether the call has a window (the mask-axis value RTC_MASK 1: a causal or sliding window).
inline bool masked(const AttentionFwdArgs& a) { return a.window_left != -1 || a.window_right != -1; }

// The score_mod-axis value (RTC_SCORE_MOD, score_mod.h) the call needs: a soft cap, ALiBi, both or neither.
inline int score_mod(const AttentionFwdArgs& a) {
  return (a.softcap > 0 ? RTC_SCORE_SOFTCAP : 0) | (a.alibi_slopes ? RTC_SCORE_ALIBI : 0);
}

// The dropout-axis value (RTC_DROPOUT, dropout.h) the call needs.
inline int dropout(const AttentionFwdArgs& a) { return a.dropout_p > 0 ? 1 : 0; }

// Bytes of one K / V storage unit (a 16-bit element, or a byte of a quantized cache) and the units of a row of D.
inline int64_t kv_unit_bytes(const AttentionFwdArgs& a) { return a.kv_dtype == RTC_KV_DTYPE_SAME ? 2 : 1; }
inline int64_t kv_row_units(const AttentionFwdArgs& a) { return rtc_kv_fp4(a.kv_dtype) ? a.head_dim / 2 : a.head_dim; }
