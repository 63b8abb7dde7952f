// The argument block of attention_bwd: the forward call's fields, by the forward's own list (the backward's call is
// checked as its forward: attention_fwd's validate_args), then the gradients'.
#pragma once
#include <cstddef>
#include <cstdint>
#include "../attention_fwd/args.h"
#include "op_registry.h"

// X(name, C type, ArgKind, count), as ATTENTION_FWD_ARGS. Of the forward's fields the backward reads q, k, v, o (the
// forward's output), lse (required: P is recomputed from it), workspace, the strides, the sizes, the window, the scale
// and the packed sequences' cu_seqlens / totals; a paged or quantized cache (block_table, kv_dtype) and seqused_k are
// refused: they take no gradients. Gradient strides are in elements, in (batch, seq, head) order, as q's.
// clang-format off: a table, its columns aligned by hand
#define ATTENTION_BWD_ARGS(X)                                                                      \
  ATTENTION_FWD_ARGS(X)                                                                            \
  X(dout, const void*, Ptr, 1)        /* dO, o's shape */                                          \
  X(dout_strides, int64_t, I64, 3)                                                                 \
  X(dlse, const float*, Ptr, 1)       /* null, or the gradient of lse (lse's layout) */            \
  X(dq, void*, Ptr, 1)                /* q's shape */                                              \
  X(dk, void*, Ptr, 1)                /* k's shape: summed over each K/V head's query heads */     \
  X(dv, void*, Ptr, 1)                                                                             \
  X(dq_strides, int64_t, I64, 3)                                                                   \
  X(dk_strides, int64_t, I64, 3)                                                                   \
  X(dv_strides, int64_t, I64, 3)                                                                   \
  X(deterministic, int32_t, I32, 1)   /* 1: the same bits run to run (every kernel so far is) */
// clang-format on

struct AttentionBwdArgs {
  ATTENTION_BWD_ARGS(RTC_ARG_MEMBER)
};
