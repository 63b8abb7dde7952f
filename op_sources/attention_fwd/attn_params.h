// The parameter block of every attention forward kernel: one struct, passed by value, shared by host and kernels.
#pragma once
#include "platform.h"

// Strides are in elements and always given in (batch, seq, head) order whatever the layout;
// the head-dim stride is 1 (checked on the host). Offsets are computed in 64 bits.
struct AttnParams {
  const rtc_bf16_t* q;
  const rtc_bf16_t* k;
  const rtc_bf16_t* v;
  rtc_bf16_t* o;
  float* lse;                 // [B, H, Sq] contiguous fp32, natural log; null when not requested
  void* workspace;            // caller-allocated scratch (tail-split partials, V transpose); may be null
  rtc_i64 workspace_bytes;
  rtc_i64 q_sb, q_ss, q_sh;   // strides of q
  rtc_i64 k_sb, k_ss, k_sh;
  rtc_i64 v_sb, v_ss, v_sh;
  rtc_i64 o_sb, o_ss, o_sh;
  int batch, heads, seq_q, seq_k, head_dim;
  float scale;                // softmax scale (default 1/sqrt(D))
  float scale_log2;           // scale * log2(e): scores go to the log2 domain with one multiply
  int tail_split;             // fast kernels: number of KV parts of the tail (0 = off); baseline ignores
  int reserved;
};
