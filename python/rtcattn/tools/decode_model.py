"""Static bandwidth model of the gfx942 decode kernel on MI300X (`python -m rtcattn isa --decode-model`): per decode
case, the bytes the kernel moves and lower bounds on its time, from the runtime's plan of the call (splits, grids) and
the code object's KV loop (coreport), set against the case's KV bytes at MI300X's 5.3 TB/s. A model, not a
measurement: no AMD GPU was available.

The attention stage takes the longest of three bounds: HBM (every (sequence, K/V head)'s K and V once, the later
chunks of one finding them in L2, the block table, q and o, the partials written), the waves' steps (a wave requests
the next step's K right after a step's S^T MFMAs and its V after the LDS write: a step costs the longer of one loaded
round trip to memory, LATENCY_S, plus the S^T MFMAs, and the step's instructions; in rounds of the resident
workgroups), and the SIMDs' issue (every wave-step's instructions spread over the CUs' SIMDs). The merge stage, when
the call is split, adds its round trips (16 parts' partials a trip) and the partials read back.
"""
from __future__ import annotations

import math

from ..ops.attention_fwd import OP
from ..ops.attention_fwd.bench_decode import DECODE_CASES
from ..runtime.dispatch import EMULATED_CUS

KERNEL = "gfx942_decode"
CUS = EMULATED_CUS["gfx942-emu"]  # MI300X's compute units, as the runtime plans the emulated part
HBM_BYTES_PER_S = 5.3e12          # MI300X's HBM3 peak, the yardstick
CLOCK_HZ = 2.1e9
LATENCY_S = 2e-6                  # an assumption: one loaded round trip to HBM (the planner's figure too)
VALU_CYCLES, TRANS_CYCLES, MFMA_CYCLES = 4, 16, 16  # issue cycles of a wave64 instruction, as the prefill model's
MERGE_BATCH = 16                  # partials the merge loads per round trip (DECODE_MERGE_BATCH)
TARGET = 1.25                     # the issue's: the bound within 1.25x of the KV bytes at 5.3 TB/s

# The decode cases (B, context, Hq, Hk, page, Sq, D): the benchmark's (`bench --shapes decode`), one list.
CASES = [(c.b, c.context, c.hq, c.hk, c.page, c.sq, c.d) for c in DECODE_CASES]


def _lib():
    from ..runtime import dispatch
    return dispatch.lib()


def bucket_of(d: int) -> int:
    from ..runtime import manifest
    return next(b for b in manifest.load().op(OP).kernel(KERNEL).axes["head_dim"].buckets if b >= d)


def plan(case: tuple, cus: int = CUS) -> dict:
    """The runtime's plan of the case as a paged call (fake addresses: the plan reads no memory)."""
    b, ctx, hq, hk, page, sq, d = case
    pages = math.ceil(ctx / page)
    q_st, kv_st = (hq * d, hq * d, d), (page * hk * d, hk * d, d)
    args = _lib().op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, q_strides=q_st, k_strides=kv_st,
                          v_strides=kv_st, o_strides=q_st, batch=b, heads=hq, seq_q=sq, seq_k=ctx, head_dim=d,
                          heads_k=hk, window_left=-1, window_right=0, softmax_scale=d ** -0.5, tail_split=-1,
                          num_cus=cus, cu_seqlens_q=1 << 44, cu_seqlens_k=1 << 45, block_table=1 << 46,
                          total_q=b * sq, total_k=0, page_size=page, num_pages=b * pages, pages_per_seq=pages,
                          table_stride=pages)
    return _lib().op_plan(OP, KERNEL, args)


def step_seconds(loop: dict) -> float:
    """One wave's KV step of instructions: its VALU, transcendentals and MFMAs one after another."""
    cycles = (loop["valu"] - loop["trans"]) * VALU_CYCLES + loop["trans"] * TRANS_CYCLES + loop["mfma"] * MFMA_CYCLES
    return cycles / CLOCK_HZ


def wave_step_seconds(loop: dict) -> float:
    """One wave's KV step in time: a round trip for the loads requested after the previous step's S^T MFMAs (half
    the loop's MFMAs), or the step's instructions when they take longer."""
    return max(LATENCY_S + loop["mfma"] // 2 * MFMA_CYCLES / CLOCK_HZ, step_seconds(loop))


def model(case: tuple, loop: dict, waves_per_simd: int, cus: int = CUS) -> dict:
    """The bounds of one case (seconds) from its plan, the KV loop's counts and the code object's occupancy."""
    b, ctx, hq, hk, page, sq, d = case
    p = plan(case, cus)
    bucket, splits, items, steps = p["bucket"], p["splits"], p["items"], p["steps"]
    kv = b * ctx * hk * d * 2 * 2
    part = 16 * (bucket + 2) * 4
    partials = items * splits * part if splits > 1 else 0
    attn_bytes = kv + 2 * b * sq * hq * d * 2 + b * math.ceil(ctx / page) * 4 + partials
    step = step_seconds(loop)
    slots = cus * 4 * waves_per_simd
    rounds = math.ceil(p["grid_attn"] / slots)
    out = {"case": case, "splits": splits, "grid_attn": p["grid_attn"], "kv_bytes": kv,
           "ideal": kv / HBM_BYTES_PER_S,
           "hbm": attn_bytes / HBM_BYTES_PER_S,
           "waves": rounds * math.ceil(steps / splits) * wave_step_seconds(loop),
           "issue": items * steps * step / (cus * 4),
           "merge": (math.ceil(splits / MERGE_BATCH) * LATENCY_S + partials / HBM_BYTES_PER_S) if splits > 1 else 0.0}
    out["bound"] = max(out["hbm"], out["waves"], out["issue"]) + out["merge"]
    out["ratio"] = out["bound"] / out["ideal"]
    return out


def case_models(report_of) -> list:
    """Every case's model; report_of(bucket): the code-object report (coreport.Report) of the case's variant (paged,
    causal, rtne, bf16), for its loop counts and occupancy."""
    out = []
    for case in CASES:
        r = report_of(bucket_of(case[6]))
        out.append(model(case, r.loop, r.waves_per_simd))
    return out


def print_model(rows: list, table) -> None:
    """The models of case_models as a table (table(rows, cols): coreport's)."""
    us = lambda s: f"{s * 1e6:.1f}"  # noqa: E731
    table([(" ".join(map(str, m["case"])), m["splits"], m["grid_attn"], f"{m['kv_bytes'] / 1e6:.0f}", us(m["ideal"]),
            us(m["hbm"]), us(m["waves"]), us(m["issue"]), us(m["merge"]), us(m["bound"]), f"{m['ratio']:.2f}")
           for m in rows],
          ("B ctx Hq Hk page Sq D", "splits", "grid", "KV MB", "ideal us", "hbm us", "waves us", "issue us",
           "merge us", "bound us", "bound/ideal"))
    total = sum(m["bound"] for m in rows) / sum(m["ideal"] for m in rows)
    print(f"\nideal = KV bytes / 5.3 TB/s; bound = max(hbm, waves, issue) + merge (a {LATENCY_S * 1e6:.0f} us round "
          f"trip assumed);\nthe set: sum of bounds / sum of ideals = {total:.2f} (target {TARGET})")
