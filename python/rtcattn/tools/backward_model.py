"""Static model of the gfx942 backward kernel (attention_bwd's `gfx942`, op_sources/attention_bwd/gfx942.hip) on
MI300X, set against AITER v3's published MI300X backward figures (`python -m rtcattn isa --backward-model`). A model,
not a measurement: no AMD GPU was available.

Per call, the kernel's three launches one after another, their grids the runtime's plan of the call:
- delta: a thread a query row reads its O and dO rows and writes delta (fp32): those bytes at MI300X's HBM bandwidth.
- dK / dV: a block per 64 keys of one K/V head runs an iteration per 16-row tile of every query head of its group;
  under a causal mask only the tiles whose rows reach its keys.
- dQ: a block per 64 query rows of one head runs an iteration per 16-key tile its rows reach (causal: up to the
  diagonal).
An iteration costs its loop's bound (iteration_cycles): the largest of the busy cycles of the matrix pipe, the VALU
(transcendentals at a quarter of its rate) and the LDS (a CU's), and of one wave's instruction issue. The issue term
is an assumption: a CU's issue turns over its 4 SIMDs, one a cycle, and takes at most one instruction of a wave a
turn (GCN's, which CDNA3 keeps), so a wave issues at most one instruction every 4 cycles, however many pipes are
free; with one wave a SIMD nothing else fills those turns. The pipes' cycles count the waves a SIMD holds, from the
code object's registers and LDS (coreport.Report.waves_per_simd: three at D 128 since the kernel asks for two waves a
SIMD there, 158 VGPRs a wave and 16.6 KiB of LDS a block; one before, at 280 VGPRs and AGPRs), each
wave a block's (four waves a block, one a SIMD). The instructions counted are those every iteration runs
(coreport.iteration_path: not the step to the next query head, nor the LSE rows the first 16 threads stage). The
blocks go to the CUs' slots (as many blocks a CU as waves a SIMD) in launch order, each to the first slot free:
never below the longest block, nor below the work over the slots.
Not counted: the blocks' prologues and epilogues (operand loads, the gradients' stores), memory latency, the tiles'
loads (from L2 mostly: a dK / dV block reads its group's Q and dO rows, once per 64 keys), the few scalar instructions
a causal dK / dV block spends on each tile it skips, 64-bit VALU operations at their lower rates, launch gaps. Each
omission makes the model's time shorter: its TF/s is an upper bound on what the kernel's code allows.

FLOPs: the backward's convention, 2.5 times the forward's, 10 B Hq Sq Sk D, halved under a causal mask (the op's
bench: BwdCase.flops), as AITER's figures count them.
"""
from __future__ import annotations

import heapq
import math

from ..ops.attention_bwd import OP
from ..ops.attention_bwd.bench import BwdCase
from .prefill_model import CLOCK_HZ, CUS, HBM_BYTES_PER_S, LDS_BYTES_PER_CLK, MFMA_CYCLES, TRANS_CYCLES, VALU_CYCLES

KERNEL = "gfx942"
ISSUE_CYCLES = 4      # a wave's instructions: one every 4 cycles at most (the assumption above)
TILE = 16             # rows (dK / dV) or keys (dQ) of one iteration: gfx942.hip's kTile
HEAD_DIM = 128        # the cases' head dim (and bucket)
# Products per tile pair, as MFMAs of D / 16 k-steps or column tiles each: dK / dV forms S and dP, then dV and dK
# (four); dQ forms S^T and dP^T again, then dQ (three). They tell the two stages' loops apart in the code object.
DKDV_PRODUCTS, DQ_PRODUCTS = 4, 3

# AITER v3's published MI300X backward figures, TF/s (ROCm/aiter, op_tests/cpp/mha/README.md, the performance table
# added by PR #1270: bf16, BSHD, batch mode, D 128, seqlen_q = seqlen_kv). BWD-a16: dQ accumulated in 16-bit
# atomics; BWD-a32: in fp32 (the kind of sums this kernel keeps). (B, Hq, Hk, S, causal) -> (a16, a32).
AITER_SOURCE = "ROCm/aiter op_tests/cpp/mha/README.md (PR #1270), MI300X"
AITER = {(1, 64, 8, 8192, False): (473.0, 441.82), (4, 64, 8, 8192, False): (511.65, 468.71),
         (8, 64, 8, 8192, False): (537.04, 475.07), (1, 64, 8, 16384, False): (519.21, 441.55),
         (4, 32, 8, 4096, False): (505.82, 457.38),
         (1, 64, 8, 8192, True): (481.895, 433.285), (4, 64, 8, 8192, True): (482.505, 434.645),
         (8, 64, 8, 8192, True): (474.02, 432.715), (1, 64, 8, 16384, True): (458.075, 412.04),
         (4, 32, 8, 4096, True): (464.83, 416.54)}


def _lib():
    from ..runtime import dispatch
    return dispatch.lib()


def iteration_cycles(loop: dict, waves_per_simd: int) -> dict:
    """One iteration's busy cycles, each SIMD holding waves_per_simd waves (each a block's) that run it side by side:
    the matrix pipe and the VALU per SIMD, the LDS per CU (4 SIMDs' waves), a wave's issue (not shared: its own
    turns). The largest (`bound`, named by `by`) bounds the iteration; `pipes`: the largest but the issue's."""
    c = {"mfma": waves_per_simd * loop["mfma"] * MFMA_CYCLES,
         "valu": waves_per_simd * ((loop["valu"] - loop["trans"]) * VALU_CYCLES + loop["trans"] * TRANS_CYCLES),
         "lds": 4 * waves_per_simd * loop["lds_bytes"] / LDS_BYTES_PER_CLK,
         "issue": loop["total"] * ISSUE_CYCLES}
    c["by"] = max(c, key=c.get)
    c["bound"], c["pipes"] = c[c["by"]], max(c["mfma"], c["valu"], c["lds"])
    return c


def key_range(row: int, sq: int, sk: int, causal: bool) -> tuple:
    """Keys [lo, hi] row `row` sees (attn_params.h's key_range; causal: the window (-1, 0), aligned bottom-right)."""
    return 0, (min(row + sk - sq, sk - 1) if causal else sk - 1)


def dkdv_tiles(j0: int, sq: int, sk: int, causal: bool) -> int:
    """16-row tiles of one query head that the dK / dV block of keys j0 .. j0 + 63 runs (its skip test)."""
    j_last = min(sk, j0 + 4 * TILE) - 1
    return sum(1 for i0 in range(0, sq, TILE)
               if not (key_range(min(i0 + TILE, sq) - 1, sq, sk, causal)[1] < j0
                       or key_range(i0, sq, sk, causal)[0] > j_last))


def dq_tiles(i0: int, sq: int, sk: int, causal: bool) -> int:
    """16-key tiles that the dQ block of rows i0 .. i0 + 63 runs (its kv_begin .. kv_end)."""
    if not causal:
        return math.ceil(sk / TILE)
    first, last = key_range(i0, sq, sk, causal), key_range(min(i0 + 4 * TILE, sq) - 1, sq, sk, causal)
    begin = first[0] // TILE * TILE
    end = begin if last[1] < first[0] else last[1] + 1
    return max(0, math.ceil((end - begin) / TILE))


def plan(case: tuple) -> dict:
    """The runtime's plan of the case (fake addresses: the plan reads no memory): the three launches' grids."""
    b, hq, hk, s, causal = case
    d = HEAD_DIM
    qs, ks = (s * hq * d, hq * d, d), (s * hk * d, hk * d, d)
    args = _lib().op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, lse=1 << 44, dout=1 << 45, dq=1 << 46,
                          dk=1 << 47, dv=1 << 48, q_strides=qs, o_strides=qs, dout_strides=qs, dq_strides=qs,
                          k_strides=ks, v_strides=ks, dk_strides=ks, dv_strides=ks, batch=b, heads=hq, heads_k=hk,
                          seq_q=s, seq_k=s, head_dim=d, window_left=-1, window_right=0 if causal else -1,
                          softmax_scale=d ** -0.5)
    return _lib().op_plan(OP, KERNEL, args)


def makespan(costs, slots: int) -> float:
    """Blocks of these costs, in launch order, each to the first of `slots` slots free: the last one's end."""
    free = [0.0] * slots
    for c in costs:
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def flops(case: tuple) -> float:
    b, hq, hk, s, causal = case
    return BwdCase(b, hq, hk, s, HEAD_DIM, causal, "rtne", False).flops()


def model(case: tuple, loops: tuple, waves_per_simd: int, cus: int = CUS) -> dict:
    """One case's bound (seconds): loops = (dK / dV loop, dQ loop) of its variant's code object (Report.loops,
    stage_loops), waves_per_simd its occupancy. `pipes_tflops`: the same without the issue term."""
    b, hq, hk, s, causal = case
    p = plan(case)
    slots = cus * waves_per_simd
    cyc = [iteration_cycles(loop, waves_per_simd) for loop in loops]
    # Launch order: x fastest (key or row blocks), then heads, then the batch; a block's cost depends on x alone.
    kv_its = [hq // hk * dkdv_tiles(x * 4 * TILE, s, s, causal) for x in range(p["dkdv_grid_x"])]
    q_its = [dq_tiles(x * 4 * TILE, s, s, causal) for x in range(p["dq_grid_x"])]

    def stage(its: list, blocks_per_x: int, cycles: float) -> float:
        return makespan([n * cycles for n in its] * blocks_per_x, slots) / CLOCK_HZ

    delta = b * hq * s * (2 * 2 * HEAD_DIM + 4) / HBM_BYTES_PER_S  # O and dO read (16-bit), delta written (fp32)
    out = {"case": case, "plan": p, "dkdv_cycles": cyc[0], "dq_cycles": cyc[1], "dkdv_its": max(kv_its),
           "dq_its": max(q_its), "delta": delta, "dkdv": stage(kv_its, p["dkdv_grid_y"] * p["grid_z"], cyc[0]["bound"]),
           "dq": stage(q_its, hq * p["grid_z"], cyc[1]["bound"]), "flops": flops(case)}
    out["total"] = delta + out["dkdv"] + out["dq"]
    out["tflops"] = out["flops"] / out["total"] / 1e12
    pipes = (delta + stage(kv_its, p["dkdv_grid_y"] * p["grid_z"], cyc[0]["pipes"])
             + stage(q_its, hq * p["grid_z"], cyc[1]["pipes"]))
    out["pipes_tflops"] = out["flops"] / pipes / 1e12
    return out


def stage_loops(report) -> tuple:
    """(dK / dV loop, dQ loop) of a backward code-object report (coreport.report(op=OP)): the loops with 4 and 3
    products' MFMAs per iteration (D / 16 each), exactly one of each."""
    steps = report.head_dim // 16
    found = []
    for products in (DKDV_PRODUCTS, DQ_PRODUCTS):
        match = [c for c in report.loops if c["mfma"] == products * steps]
        if len(match) != 1:
            raise ValueError(f"{report.name}: {len(match)} loops with {products * steps} MFMAs an iteration, not one "
                             f"(loops' MFMAs: {[c['mfma'] for c in report.loops]})")
        found.append(match[0])
    return tuple(found)


def models(report_of) -> list:
    """Rows of every case of AITER's table above. report_of(mask): the bf16 rtne dense D 128 variant's code-object
    report (coreport.Report of op attention_bwd), mask "none" or "window" (causal)."""
    reports = {causal: report_of("window" if causal else "none") for causal in (False, True)}
    rows = []
    for case in AITER:
        r = reports[case[4]]
        m = model(case, stage_loops(r), r.waves_per_simd)
        m["report"], (m["a16"], m["a32"]) = r, AITER[case]
        m["vs_a32"], m["vs_a16"] = m["tflops"] / m["a32"], m["tflops"] / m["a16"]
        rows.append(m)
    return rows


def print_models(rows: list, table) -> None:
    """The loops per variant (cycles an iteration, per pipe), then the cases against AITER."""
    seen, loops = set(), []
    for m in rows:
        r = m["report"]
        if r.name in seen:
            continue
        seen.add(r.name)
        for stage, loop, cyc in (("dK/dV", stage_loops(r)[0], m["dkdv_cycles"]),
                                 ("dQ", stage_loops(r)[1], m["dq_cycles"])):
            loops.append((r.mask, stage, loop["total"], loop["mfma"], loop["valu"], loop["trans"], loop["lds_bytes"],
                          r.waves_per_simd, cyc["mfma"], cyc["valu"], f"{cyc['lds']:.0f}", cyc["issue"],
                          f"{cyc['bound']:.0f} ({cyc['by']})"))
    table(loops, ("mask", "stage", "instructions", "mfma", "valu", "trans", "lds bytes", "waves/simd", "mfma cyc",
                  "valu cyc", "lds cyc", "issue cyc", "bound cyc"))
    print(f"\nper iteration of one wave (its 16 keys or rows against the block's 16-row or 16-key tile), over the "
          f"instructions every\niteration runs; bound = max(mfma, valu, lds, issue), issue = {ISSUE_CYCLES} cycles an "
          f"instruction (a wave's turns)\n")
    ms = lambda t: f"{t * 1e3:.2f}"  # noqa: E731
    table([(f"{b} {hq}/{hk} {s}", "causal" if c else "full", m["dkdv_its"], m["dq_its"], f"{m['delta'] * 1e6:.0f}",
            ms(m["dkdv"]), ms(m["dq"]), ms(m["total"]), f"{m['tflops']:.0f}", f"{m['pipes_tflops']:.0f}",
            f"{m['a32']:.0f}", f"{m['vs_a32']:.2f}", f"{m['a16']:.0f}", f"{m['vs_a16']:.2f}")
           for m in rows for b, hq, hk, s, c in [m["case"]]],
          ("B Hq/Hk S (D 128)", "mask", "dK/dV its", "dQ its", "delta us", "dK/dV ms", "dQ ms", "total ms",
           "model TF/s", "w/o issue TF/s", "AITER a32", "model/a32", "AITER a16", "model/a16"))
    worst, best = min(m["vs_a32"] for m in rows), max(m["vs_a32"] for m in rows)
    side = "at or above them" if worst >= 1 else "below them" if best < 1 else "on both sides of them"
    print(f"\nits = iterations of the longest block; TF/s = 2.5 x the forward's FLOPs (causal halved) over the model's "
          f"time;\nw/o issue = the same bound without the issue term (the pipes alone); AITER: {AITER_SOURCE}.\n"
          f"The model's bound is {worst:.2f}-{best:.2f}x AITER's a32 figures: {side}. A model from loop instruction "
          f"counts, not a measurement.")
