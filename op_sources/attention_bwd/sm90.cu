// Fast attention backward for sm_90a (H100/H200) on wgmma, bf16 and fp16, in three launches (bwd_params.h stages):
//   deterministic: delta, dK and dV, dQ: each a pure function of its inputs with no atomics, the gradients the same
//     bits run to run; the dQ stage forms S and dP again (seven GEMMs a (row, key) block).
//   not: delta (and the fp32 dQ sums zeroed), dK and dV with dQ added into the sums (five GEMMs a block, fp32 vector
//     reductions), DQ_STORE (the sums rounded into dq).
// Numerics are the baseline's (docs/numerics.md, the backward), the sums' order aside: fp32 accumulators over the
// tensor cores' sums. Score modifications (RTC_SCORE_MOD: the soft cap, ALiBi): P of the modified score, dS through the
// cap's derivative (sm90/pairs.h, csrc_common/score_mod_sm90.h).
// This file is the kernel's top level; the roles are in sm90/: plan.h (per-bucket tiles, host and kernel), tiles.h
// (shared-memory tiles, copies, GEMM issue), pairs.h (P, dS, packing, stores), dkdv.h and dq.h (the two stages),
// dq_accum.h (the fused dQ: its GEMMs, reductions, zeroing and store).
#include "platform.h"
#include "bwd_common.h"
#include "ptx_sm90.h"
#include "wgmma_sm90.h"
#include "sm90/plan.h"
#include "sm90/tiles.h"
#include "sm90/pairs.h"
#include "sm90/dq_accum.h"
#include "sm90/dkdv.h"
#include "sm90/dq.h"

#if RTC_KV == RTC_KV_PAGED || RTC_KV_DTYPE != RTC_KV_DTYPE_SAME
#error "the backward takes dense or varlen K / V in q's dtype (a paged or quantized cache takes no gradients)"
#endif

// One CTA of 256 threads resident an SM: each stage's accumulators take most of a thread's registers.
extern "C" __global__ void __launch_bounds__(BWD_SM90_THREADS, 1)
    attention_bwd_sm90(const __grid_constant__ BwdParams bp) {
  if (bp.stage == BWD_STAGE_DELTA) {
    if (bp.dq_accum) bwd90::zero_dq_tiles(bp);
    bwd::delta_stage(bp, BWD_SM90_THREADS);
    return;
  }
  if (bp.stage == BWD_STAGE_DQ_STORE) {
    bwd90::dq_store_stage(bp);
    return;
  }
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const rtc_u32 base = (sm90::smem_addr(smem_raw) + 1023u) & ~1023u;
  if (bp.stage == BWD_STAGE_DKDV)
    bwd90::dkdv_stage(bp, base);
  else
    bwd90::dq_stage(bp, base);
}
