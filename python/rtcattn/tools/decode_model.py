"""Static bandwidth model of the gfx942 decode kernel (`python -m rtcattn isa --decode-model [--arch A]`): per decode
case, the bytes the kernel moves and lower bounds on its time, from the runtime's plan of the call (splits, grids) and
the code object's KV loop (coreport), set against the case's KV bytes at the arch's part's HBM bandwidth (the
machine: prefill_model.MACHINES, MI300X for gfx942, MI355X for gfx950). A model, not a measurement: no AMD GPU was
available.

The attention stage takes the longest of three bounds: HBM (every (sequence, K/V head)'s K and V once, the later chunks
of one finding them in L2, the block table, q and o, the partials of the call's rows written), the waves' steps (a
part's time on one wave, in rounds of the resident workgroups: the code object's KV loop replayed with its own loads and
waits, wave_seconds; a price from the loop's counts, part_seconds, is printed beside it), and the SIMDs' issue (every
wave-step's instructions spread over the CUs' SIMDs). The loop holds the plan's steps_ahead steps (params.h
decode_ahead: that many steps' loads in flight), so its counts are that many steps'. The merge stage, when the call is
split, adds its round trips (16 parts' partials a trip for each of the merge's part groups, the plan's merge_groups:
lanes the item's rows leave spare) and the partials read back.
"""
from __future__ import annotations

import math
import re
from collections import deque

from ..ops.attention_fwd import OP
from ..ops.attention_fwd.bench_decode import DECODE_CASES
from .isa_classes import TRANSCENDENTAL
from .prefill_model import MFMA_CYCLES, MI300X, TRANS_CYCLES, VALU_CYCLES, Machine

KERNEL = "gfx942_decode"
LATENCY_S = 2e-6                  # an assumption: one loaded round trip to HBM (the planner's figure too)
SCALAR_LATENCY_S = 0.2e-6         # an assumption: a block-table read by s_load (16 page ids a scalar-cache line)
# The machine's figures are the prefill model's (MI300X's CUs, HBM peak, clock; a wave64 VALU issues in 4 cycles, a
# transcendental in 16, a 16x16x16 MFMA keeps the matrix pipe 16 cycles: 512 flops a SIMD a clock at peak). An MFMA's
# issue takes one slot of the SIMD's issue (ISSUE_CYCLES), after which an independent VALU issues while it runs
# (gfx942's co-execution: LLVM's MFMA issue rules, fit to thread traces, let a VALU issue one slot after an XDL MFMA
# with 8-byte sources), so the VALU and the matrix pipe work side by side, as the prefill model takes them. An
# instruction that reads an MFMA's result waits for it: 4 passes + 3 wait states after its issue, a slot each
# (LLVM's gfx940 hazard table: an N-pass XDL write before a VALU read needs N + 3 wait states).
ISSUE_CYCLES = 4
MFMA_RESULT_CYCLES = (4 + 3) * ISSUE_CYCLES
MERGE_BATCH = 16                  # partials the merge loads per round trip (DECODE_MERGE_BATCH)
TARGET = 1.25                     # the issue's: the bound within 1.25x of the KV bytes at 5.3 TB/s
FP4_OVER_FP8 = 0.55               # the issue's: the FP4 cache's bound at most 0.55x the FP8 cache's
# The cache's element types (the kv_dtype axis) the model takes, with their argument-block code (RTC_KV_DTYPE_*)
KV_DTYPES = {"same": 0, "fp8_e4m3": 1, "fp8_e4m3fnuz": 2, "fp4_e2m1": 3}

# The decode cases (B, context, Hq, Hk, page, Sq, D): the benchmark's (`bench --shapes decode`), one list.
CASES = [(c.b, c.context, c.hq, c.hk, c.page, c.sq, c.d) for c in DECODE_CASES]


def _lib():
    from ..runtime import dispatch
    return dispatch.lib()


def bucket_of(d: int) -> int:
    from ..runtime import manifest
    return next(b for b in manifest.load().op(OP).kernel(KERNEL).axes["head_dim"].buckets if b >= d)


def row_bytes(d: int, kv_dtype: str = "same") -> float:
    """Bytes one key row of K (or of V) of one head takes: 16-bit elements, FP8 bytes, or FP4 nibbles and the row's
    E8M0 scale byte."""
    return {"same": 2 * d, "fp8_e4m3": d, "fp8_e4m3fnuz": d, "fp4_e2m1": d / 2 + 1}[kv_dtype]


def plan(case: tuple, machine: Machine = MI300X, kv_dtype: str = "same") -> dict:
    """The runtime's plan of the case as a paged call on the machine (its CUs, HBM bandwidth, LDS per CU and arch,
    as the Python layer fills them for a device of its arch; fake addresses: the plan reads no memory); a quantized
    cache's strides count bytes (FP4: the HND pool and its scales [pages, page, Hk])."""
    b, ctx, hq, hk, page, sq, d = case
    pages = math.ceil(ctx / page)
    q_st, kv_st = (hq * d, hq * d, d), (page * hk * d, hk * d, d)
    quant = {}
    if kv_dtype == "fp4_e2m1":
        kv_st = (page * hk * d // 2, d // 2, page * d // 2)
        quant = dict(k_scale=1 << 47, v_scale=1 << 48, k_scale_strides=(page * hk, hk, 1),
                     v_scale_strides=(page * hk, hk, 1))
    args = _lib().op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, q_strides=q_st, k_strides=kv_st,
                          v_strides=kv_st, o_strides=q_st, batch=b, heads=hq, seq_q=sq, seq_k=ctx, head_dim=d,
                          heads_k=hk, window_left=-1, window_right=0, softmax_scale=d ** -0.5, tail_split=-1,
                          num_cus=machine.cus, hbm_gbps=machine.hbm_gbps, lds_per_cu=machine.lds_per_cu,
                          gfx_arch=machine.gfx_arch,
                          cu_seqlens_q=1 << 44, cu_seqlens_k=1 << 45, block_table=1 << 46,
                          total_q=b * sq, total_k=0, page_size=page, num_pages=b * pages, pages_per_seq=pages,
                          table_stride=pages, kv_dtype=KV_DTYPES[kv_dtype], **quant)
    return _lib().op_plan(OP, KERNEL, args)


def step_seconds(loop: dict, machine: Machine = MI300X) -> float:
    """One wave-step's time on its SIMD: the issue of its VALU, transcendentals and MFMAs (a slot each MFMA) beside
    the matrix pipe's 16 cycles an MFMA, whichever is longer (the two run side by side)."""
    issue = (loop["valu"] - loop["trans"]) * VALU_CYCLES + loop["trans"] * TRANS_CYCLES + loop["mfma"] * ISSUE_CYCLES
    return max(issue, loop["mfma"] * MFMA_CYCLES) / machine.clock_hz


def wave_step_seconds(loop: dict, ahead: int = 1, machine: Machine = MI300X) -> float:
    """One wave's KV step in time (loop: one step's counts): a round trip, shared by the `ahead` steps whose loads
    are in flight together, for the loads requested after an earlier step's S^T MFMAs (half the step's MFMAs), or the
    step's instructions when they take longer."""
    return max(LATENCY_S / ahead + loop["mfma"] // 2 * MFMA_CYCLES / machine.clock_hz, step_seconds(loop, machine))


def part_seconds(loop: dict, steps: int, ahead: int = 1, machine: Machine = MI300X) -> float:
    """A wave's time for a part of `steps` steps priced from the loop's counts, in the form of the planner's part_ns
    (gfx942_decode.cpp; its step's math is step_math_ns, by format, not from a loop): a step each
    wave_step_seconds, and the rest of the first round trip (the pipeline filling; none at ahead 1)."""
    return steps * wave_step_seconds(loop, ahead, machine) + LATENCY_S * (ahead - 1) / ahead


_WAIT = re.compile(r"(vmcnt|lgkmcnt)\((\d+)\)")
_REG = re.compile(r"\b([va])(?:\[(\d+):(\d+)\]|(\d+))")


def _regs(operands: str) -> list:
    """The vector / accumulator registers named in an operand list ("v[64:67], v68, a3" -> v64..v67, v68, a3)."""
    out = []
    for kind, lo, hi, one in _REG.findall(operands):
        first = int(one if one else lo)
        out += [f"{kind}{r}" for r in range(first, (int(hi) if hi else first) + 1)]
    return out


def wave_seconds(body: list, steps: int, ahead: int = 1, machine: Machine = MI300X) -> float:
    """One wave's time for `steps` KV steps: the loop body (coreport's loop_body, `ahead` steps an iteration)
    replayed in address order ceil(steps / ahead) times on one clock. Each VALU, transcendental and MFMA takes its
    issue cycles (step_seconds'), an MFMA issuing no sooner than the matrix pipe is free of the one before it (16
    cycles after that one's issue), and a VALU that reads an MFMA's result no sooner than MFMA_RESULT_CYCLES after
    that MFMA's issue; a vector load returns LATENCY_S after its issue and a scalar load SCALAR_LATENCY_S;
    s_waitcnt vmcnt(n) waits until at most n vector loads are in flight (they return in order), lgkmcnt(0) for every
    scalar load (LDS's waits are not modelled). The loads of the loop's first iteration are issued before it, at time
    0, as many as an iteration issues. Cycles at the machine's clock."""
    vmem = sum(1 for _, op, _ in body if op.startswith(("buffer_load", "global_load")))
    vm, sm, t, pipe = deque([0.0] * vmem), [], 0.0, 0.0
    cycles = {"mfma": ISSUE_CYCLES, "trans": TRANS_CYCLES, "valu": VALU_CYCLES}
    ready = {}  # register -> when the MFMA that writes it has its result
    reads = [_regs(args.split(",", 1)[1]) if "," in args else [] for _, _, args in body]
    writes = [_regs(args.split(",", 1)[0]) if op.startswith("v_mfma") else [] for _, op, args in body]
    for _ in range(math.ceil(steps / ahead)):
        for i, (_, op, args) in enumerate(body):
            if op.startswith("s_waitcnt"):
                for counter, n in _WAIT.findall(args):
                    if counter == "vmcnt":
                        while len(vm) > int(n):
                            t = max(t, vm.popleft() + LATENCY_S)
                    elif int(n) == 0 and sm:
                        t = max([t] + [x + SCALAR_LATENCY_S for x in sm])
                        sm = []
            elif op.startswith(("buffer_load", "global_load")):
                vm.append(t)
            elif op.startswith(("s_load", "s_buffer_load")):
                sm.append(t)
            elif op.startswith("v_"):
                kind = "mfma" if op.startswith("v_mfma") else "trans" if TRANSCENDENTAL.match(op) else "valu"
                if kind != "mfma":  # an MFMA after an MFMA it accumulates onto waits for the pipe only
                    t = max([t] + [ready[r] for r in reads[i] if r in ready])
                if kind == "mfma":
                    t = max(t, pipe)
                    pipe = t + MFMA_CYCLES / machine.clock_hz
                    for r in writes[i]:
                        ready[r] = t + MFMA_RESULT_CYCLES / machine.clock_hz
                t += cycles[kind] / machine.clock_hz
    return t


def per_step(loop: dict, ahead: int) -> dict:
    """The loop's counts per KV step: the loop holds `ahead` steps."""
    return {k: v / ahead for k, v in loop.items() if k in ("valu", "trans", "mfma")}


def model(case: tuple, loop: dict, waves_per_simd: float, machine: Machine = MI300X, kv_dtype: str = "same",
          body: list = None) -> dict:
    """The bounds of one case (seconds) from its plan, the KV loop's counts and the code object's occupancy (a CU's
    resident waves over its 4 SIMDs: 1.5 where LDS lets a CU hold 6 one-wave workgroups); kv_bytes (and the ideal
    time) are the bytes the cache's format takes, scales included. The bound's waves are a part replayed with the loop
    body's own loads and waits (wave_seconds), given a body; "priced" is the part priced from the loop's counts
    (part_seconds: a round trip over the steps in flight plus the S^T MFMAs a step, or the step's instructions),
    which the waves fall back on without a body. The plan, the rounds, the clock and HBM are the machine's."""
    b, ctx, hq, hk, page, sq, d = case
    cus = machine.cus
    p = plan(case, machine, kv_dtype)
    bucket, splits, items, steps = p["bucket"], p["splits"], p["items"], p["steps"]
    ahead = p["steps_ahead"]
    loop = per_step(loop, ahead)
    kv = b * ctx * hk * row_bytes(d, kv_dtype) * 2
    part_row = (bucket + 2) * 4  # a row's O, m and l (decode_part_row_bytes): the rows of the call only
    partials = b * hq * sq * splits * part_row if splits > 1 else 0
    attn_bytes = kv + 2 * b * sq * hq * d * 2 + b * math.ceil(ctx / page) * 4 + partials
    step = step_seconds(loop, machine)
    slots = round(cus * 4 * waves_per_simd)
    rounds = math.ceil(p["grid_attn"] / slots)
    out = {"case": case, "kv_dtype": kv_dtype, "splits": splits, "merge_groups": p["merge_groups"],
           "grid_attn": p["grid_attn"], "kv_bytes": kv,
           "ideal": kv / machine.hbm_bytes_per_s,
           "hbm": attn_bytes / machine.hbm_bytes_per_s,
           "priced": rounds * part_seconds(loop, math.ceil(steps / splits), ahead, machine),
           "issue": items * steps * step / (cus * 4),
           "merge": (math.ceil(splits / (MERGE_BATCH * p["merge_groups"])) * LATENCY_S
                     + partials / machine.hbm_bytes_per_s) if splits > 1 else 0.0}
    out["waves"] = rounds * wave_seconds(body, math.ceil(steps / splits), ahead, machine) if body else out["priced"]
    out["bound"] = max(out["hbm"], out["waves"], out["issue"]) + out["merge"]
    out["ratio"] = out["bound"] / out["ideal"]
    return out


def case_models(report_of, kv_dtype: str = "same", machine: Machine = MI300X) -> list:
    """Every case's model on the machine; report_of(bucket, kv_dtype): the code-object report (coreport.Report) of the
    case's variant (paged, causal, rtne, bf16, the cache's kv_dtype), for its loop counts and occupancy."""
    out = []
    for case in CASES:
        r = report_of(bucket_of(case[6]), kv_dtype)
        out.append(model(case, r.loop, r.waves_per_cu / 4, machine, kv_dtype=kv_dtype, body=r.loop_body))  # / 4 SIMDs
    return out


def set_bound(rows: list) -> float:
    """The decode set's time bound: the sum of its cases' bounds (seconds)."""
    return sum(m["bound"] for m in rows)


def print_models(by_dtype: dict, table, machine: Machine = MI300X) -> None:
    """print_model for each cache format (kv_dtype -> case_models rows on the machine), then the set's bounds side by
    side and the FP4 / FP8 ratio against the issue's target."""
    print(f"machine: {machine.name}, {machine.cus} CUs, {machine.hbm_bytes_per_s / 1e12:g} TB/s, "
          f"{machine.clock_hz / 1e9:g} GHz")
    for kv_dtype, rows in by_dtype.items():
        print(f"\n== KV cache: {kv_dtype} ==")
        print_model(rows, table, machine)
    print()
    table([(t, f"{sum(m['kv_bytes'] for m in rows) / 1e6:.0f}", f"{set_bound(rows) * 1e6:.1f}",
            f"{set_bound(rows) / set_bound(by_dtype['same']):.2f}" if "same" in by_dtype else "")
           for t, rows in by_dtype.items()], ("kv_dtype", "KV MB (scales incl.)", "set bound us", "vs same"))
    if "fp8_e4m3" in by_dtype and "fp4_e2m1" in by_dtype:
        r = set_bound(by_dtype["fp4_e2m1"]) / set_bound(by_dtype["fp8_e4m3"])
        print(f"FP4 / FP8 set bound = {r:.3f} (target <= {FP4_OVER_FP8})")


def print_model(rows: list, table, machine: Machine = MI300X) -> None:
    """The models of case_models as a table (table(rows, cols): coreport's)."""
    us = lambda s: f"{s * 1e6:.1f}"  # noqa: E731
    table([(" ".join(map(str, m["case"])), m["splits"], m["grid_attn"], f"{m['kv_bytes'] / 1e6:.0f}", us(m["ideal"]),
            us(m["hbm"]), us(m["waves"]), us(m["priced"]), us(m["issue"]), us(m["merge"]), us(m["bound"]),
            f"{m['ratio']:.2f}")
           for m in rows],
          ("B ctx Hq Hk page Sq D", "splits", "grid", "KV MB", "ideal us", "hbm us", "waves us", "priced us",
           "issue us", "merge us", "bound us", "bound/ideal"))
    total = sum(m["bound"] for m in rows) / sum(m["ideal"] for m in rows)
    print(f"\nideal = KV bytes / {machine.hbm_bytes_per_s / 1e12:g} TB/s; bound = max(hbm, waves, issue) + merge; "
          f"waves: the KV loop's loads and waits replayed (a {LATENCY_S * 1e6:.0f} us round trip assumed), "
          f"priced: from the loop's counts;"
          f"\nthe set: sum of bounds / sum of ideals = {total:.2f} (target {TARGET})")
