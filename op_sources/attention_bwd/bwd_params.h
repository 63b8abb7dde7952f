// The parameter block of the attention backward kernels, shared by host and kernels: the forward's call (AttnParams:
// q, k, v, the forward's output o and its LSE, the sizes, the window, the scale, packed sequences) and the gradients'
// tensors. Strides are in elements, in (batch, seq, head) order; packed calls use the seq stride from each
// sequence's first row, as the forward does.
#pragma once
#include "attn_params.h"

struct BwdParams {
  AttnParams a;               // a.o: the forward's output; a.lse: its LSE (natural log), which P is recomputed from
  const rtc_elem_t* dout;     // dO, the gradient of o
  rtc_i64 do_sb, do_ss, do_sh;
  const float* dlse;          // null, or the gradient of the LSE (the LSE's layout)
  rtc_elem_t* dq;
  rtc_i64 dq_sb, dq_ss, dq_sh;
  rtc_elem_t* dk;             // [.., heads_k, D]: summed over the query heads of each K/V head
  rtc_i64 dk_sb, dk_ss, dk_sh;
  rtc_elem_t* dv;
  rtc_i64 dv_sb, dv_ss, dv_sh;
  float* delta;               // workspace: delta_i = rowsum(dO_i o_i) - dlse_i, fp32 in the LSE's layout
  float* dq_accum;            // null, or (a kernel that adds dQ up in fp32 from its DKDV stage) workspace: the sums,
      // in the kernel's own layout, zeroed by its delta stage and rounded into dq by DQ_STORE
  int stage;  // BWD_STAGE_*: the launches of one call, in order
};

#define BWD_STAGE_DELTA 0  // delta, one thread a row
#define BWD_STAGE_DKDV 1  // dK and dV, a block per key tile of one K/V head
#define BWD_STAGE_DQ 2  // dQ, a block per query tile of one head
#define BWD_STAGE_DQ_STORE 3  // (dq_accum set, in place of BWD_STAGE_DQ) dq from the fp32 sums
