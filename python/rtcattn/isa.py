"""Code-object report of the gfx942 fast kernel (registers, LDS, scratch, per-KV-iteration instruction mix) and its
static issue model."""
from __future__ import annotations

import argparse
import heapq
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

OP, KERNEL = "attention_fwd", "gfx942"
ARCHS = ("gfx942", "gfx90a")
CLOCK_HZ, CUS = 2.1e9, 304
MFMA_CYCLES, VALU_CYCLES, TRANS_CYCLES, LDS_BYTES_PER_CLK = 16, 4, 16, 128
TRANSCENDENTAL = re.compile(r"^v_(exp|log|rcp|rsq|sqrt|sin|cos)_f32")
# Bytes one wave64 instruction moves through the LDS (reads, writes, cross-lane traffic, DMA fill).
LDS_BYTES = {"ds_read_b32": 256, "ds_write_b32": 256, "ds_read_b64": 512, "ds_write_b64": 512,
             "ds_read2_b64": 1024, "ds_read_b128": 1024, "ds_write_b128": 1024, "ds_swizzle_b32": 256,
             "ds_bpermute_b32": 256}
# MoonMath's published MI300X times (ms) for the seed shapes (B, H, S): RTNE, RTZ.
MOONMATH_MS = {(2, 24, 8192): (3.083, 2.983), (2, 24, 16384): (11.670, 11.385), (1, 32, 16384): (8.013, 7.731),
               (4, 16, 16384): (15.591, 15.055), (1, 64, 16384): (15.528, 15.040), (2, 24, 32768): (46.002, 44.075),
               (2, 16, 65536): (117.612, 114.665), (2, 8, 86016): (101.071, 99.397),
               (1, 16, 131072): (232.517, 226.152)}
# A serving-like packed batch for the varlen model: 12 sequences (self-attention), Hq 32, Hk 8, D 128.
VARLEN_MIX = (8192, 4096, 4096, 2048, 1024, 1024, 512, 300, 7000, 1500, 333, 2100)
VARLEN_HEADS = (32, 8)


@dataclass
class Report:
    arch: str
    mode: str
    compiler: str
    notes: dict
    loop: dict = field(default_factory=dict)   # static counts of the KV loop body (the unmasked steady loop)
    mask: str = "none"
    masked_loop: dict = field(default_factory=dict)  # window variants: the loop of the blocks a window cuts
    kv: str = "dense"

    @property
    def waves_per_simd(self) -> int:
        """Waves per SIMD the code object allows (512-entry unified VGPR file, 64 KiB LDS, 4 SIMDs)."""
        regs = self.notes["vgpr_count"] + self.notes["agpr_count"]
        by_regs = 8 if regs == 0 else min(8, 512 // (math.ceil(regs / 8) * 8))
        lds = self.notes["group_segment_fixed_size"]
        groups = 64 * 1024 // lds if lds else 8
        waves_per_group_per_simd = math.ceil(self.notes["max_flat_workgroup_size"] / 64 / 4)
        return min(by_regs, groups * waves_per_group_per_simd)


def _tool(name: str) -> str:
    for cand in (f"{name}-19", name):
        path = shutil.which(cand)
        if path:
            return path
    raise FileNotFoundError(f"{name}-19 (or {name}) is not on PATH; tried {name}-19, {name}; install llvm-19")


def parse_notes(text: str) -> dict:
    keys = ("vgpr_count", "agpr_count", "sgpr_count", "group_segment_fixed_size", "private_segment_fixed_size",
            "max_flat_workgroup_size", "vgpr_spill_count", "sgpr_spill_count")
    out = {k: 0 for k in keys}
    for k in keys:
        m = re.search(rf"\.{k}:\s+(\d+)", text)
        if m:
            out[k] = int(m.group(1))
    return out


def _instructions(disasm: str) -> list:
    """(address, mnemonic, operands) of every instruction of the disassembly."""
    out = []
    for line in disasm.splitlines():
        m = re.match(r"^\s+(\S+)\s*(.*?)\s*//\s*([0-9A-Fa-f]+):", line)
        if m:
            out.append((int(m.group(3), 16), m.group(1), m.group(2)))
    return out


def _branch_target(addr: int, op: str, args: str):
    """Target address of an SOPP branch with an immediate, else None."""
    if not (op.startswith("s_cbranch") or op == "s_branch") or not args.strip().isdigit():
        return None
    simm16 = int(args) & 0xFFFF  # SOPP: target = next instruction + 4 * signed simm16
    return addr + 4 + 4 * (simm16 - 0x10000 if simm16 & 0x8000 else simm16)


def _successors(insts: list) -> dict:
    """Control-flow successors of every instruction address (straight-line, branch target, or both)."""
    succ = {}
    for i, (addr, op, args) in enumerate(insts):
        nxt = [insts[i + 1][0]] if i + 1 < len(insts) else []
        target = _branch_target(addr, op, args)
        if op == "s_branch" and target is not None:
            succ[addr] = [target]
        elif op.startswith(("s_endpgm", "s_setpc", "s_branch")):
            succ[addr] = []
        else:
            succ[addr] = nxt + ([target] if target is not None else [])
    return succ


def _walk(start: int, edges: dict, stop: int = None) -> set:
    seen, todo = {start}, [start]
    while todo:
        for n in edges.get(todo.pop(), ()):
            if n not in seen and n != stop:
                seen.add(n)
                todo.append(n)
    return seen


def kv_loop(insts: list) -> list:
    """The KV loop: of the loops (back edges whose target reaches the branch again, so that block
    placement's backward jumps between straight-line code do not count), the one whose body holds
    the most MFMAs. The body is the natural loop of the head, over all its back edges: what lies on
    a path from the head back to it, wherever the compiler placed it, and nothing peeled before or
    after the loop. Ties go to the larger body: clang may give one loop a second latch that jumps
    to an instruction before the first latch's target (group B's K refill, placed after the loop,
    does); that is the same loop, since the kernel has no loop around the KV loop."""
    bodies = _loop_bodies(insts)
    loops = kv_loops(insts, bodies)
    return max(loops, key=len) if loops else []


def kv_loops(insts: list, bodies: dict = None) -> list:
    """Every loop with the most MFMAs: the steady KV loop, and under a window also the loops of the
    blocks the window cuts (the same MFMAs, a masked softmax), in address order."""
    if bodies is None:
        return kv_loops(insts, _loop_bodies(insts))
    loops = [[x for x in insts if x[0] in addrs] for addrs in bodies.values()]
    most = max((sum(1 for x in b if x[1].startswith("v_mfma")) for b in loops), default=0)
    return sorted((b for b in loops if most and sum(1 for x in b if x[1].startswith("v_mfma")) == most),
                  key=lambda b: b[0][0])


def _loop_bodies(insts: list) -> dict:
    succ = _successors(insts)
    pred = {}
    for a, ns in succ.items():
        for n in ns:
            pred.setdefault(n, []).append(a)
    bodies = {}
    for addr, op, args in insts:
        target = _branch_target(addr, op, args)
        if target is None or target > addr:
            continue
        ahead = _walk(target, succ)
        if addr in ahead:
            bodies.setdefault(target, {target}).update(_walk(addr, pred, stop=target) & ahead)
    return bodies


def count(body: list) -> dict:
    c = {"mfma": 0, "valu": 0, "trans": 0, "cndmask": 0, "lds": 0, "lds_bytes": 0, "vmem": 0, "lds_dma": 0,
         "s_waitcnt": 0, "s_barrier": 0, "total": len(body)}
    for _, op, args in body:
        if op.startswith("v_mfma"):
            c["mfma"] += 1
        elif op.startswith("v_"):
            c["valu"] += 1
            c["trans"] += bool(TRANSCENDENTAL.match(op))
            c["cndmask"] += op.startswith("v_cndmask")
        elif op.startswith("ds_"):
            c["lds"] += 1
            c["lds_bytes"] += LDS_BYTES.get(op, 256)
        elif op.startswith(("buffer_", "global_", "flat_", "scratch_")):
            c["vmem"] += 1
            if args.rstrip().endswith(" lds"):
                c["lds_dma"] += 1
                c["lds_bytes"] += 256
        elif op.startswith("s_waitcnt"):
            c["s_waitcnt"] += 1
        elif op == "s_barrier":
            c["s_barrier"] += 1
    return c


def analyse(code: bytes) -> tuple:
    """(notes, instructions with addresses relative to the kernel symbol) of one code object."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.co"
        path.write_bytes(code)
        notes = subprocess.run([_tool("llvm-readelf"), "--notes", str(path)], capture_output=True, text=True,
                               check=True).stdout
        dis = subprocess.run([_tool("llvm-objdump"), "-d", str(path)], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"^([0-9a-f]+) <" + _spec().kernel(KERNEL).symbol + ">:", dis, re.M)
    start = int(m.group(1), 16) if m else 0
    return parse_notes(notes), [(a - start, op, args) for a, op, args in _instructions(dis)]


def _spec():
    from .runtime import manifest
    return manifest.load().op(OP)


def axis_values(axis: str) -> list:
    return _spec().axis_values(axis)


def build(arch: str, mode: str, mask: str = "none", kv: str = "dense"):
    """The product's build of one variant (manifest request, runtime cache, compiler order): the very
    code object a call would load."""
    from .runtime import dispatch, manifest
    v = manifest.load().variant_for(OP, KERNEL, arch, {"round_mode": mode, "mask": mask, "kv": kv, "head_dim": 128})
    return dispatch.build(v)


def report(arch: str, mode: str, mask: str = "none", kv: str = "dense") -> Report:
    res = build(arch, mode, mask, kv)
    notes, insts = analyse(res.code())
    r = Report(arch, mode, res.compiler_id, notes, mask=mask, kv=kv)
    loops = [count(b) for b in kv_loops(insts)]
    r.loop = min(loops, key=lambda c: (c["cndmask"], -c["total"])) if mask != "none" else count(kv_loop(insts))
    if mask != "none":
        r.masked_loop = max(loops, key=lambda c: (c["cndmask"], c["total"]))
    r.loop["mfma_total"] = sum(1 for x in insts if x[1].startswith("v_mfma"))
    r.loop["has_mfma16_bf16"] = any(x[1] in ("v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x16bf16_1k") for x in insts)
    return r


# ---- the static issue model ------------------------------------------------------------------------
def iteration_cycles(loop: dict) -> dict:
    """Busy cycles per KV iteration: per SIMD (two waves, one of each group) for the matrix pipe and the
    VALU, per CU (eight waves) for the LDS. The largest bounds the iteration."""
    mfma = 2 * loop["mfma"] * MFMA_CYCLES
    valu = 2 * ((loop["valu"] - loop["trans"]) * VALU_CYCLES + loop["trans"] * TRANS_CYCLES)
    lds = 8 * loop["lds_bytes"] / LDS_BYTES_PER_CLK
    return {"mfma": mfma, "valu": valu, "lds": lds, "bound": max(mfma, valu, lds)}


def plan(shape: tuple, cus: int = CUS, split: bool = True, causal: bool = False) -> dict:
    """The runtime's launch plan of the gfx942 kernel for a (B, H, S) problem: the planner of a real call."""
    from .runtime import dispatch
    b, h, s = shape
    strides = (s * h * 128, h * 128, 128)
    args = dispatch.lib().op_args(OP, q=1, k=1, v=1, o=1, q_strides=strides, k_strides=strides, v_strides=strides,
                                  o_strides=strides, batch=b, heads=h, seq_q=s, seq_k=s, head_dim=128, heads_k=h,
                                  window_left=-1, window_right=0 if causal else -1,
                                  softmax_scale=1.0, tail_split=-1 if split else 0, num_cus=cus)
    return dispatch.lib().op_plan(OP, KERNEL, args)


def causal_lower_bound_ms(shape: tuple, cycles: float, masked_cycles: float, cus: int = CUS) -> float:
    """Causal: the items' kv blocks (as the kernel visits them, from the runtime's plan), the unmasked at
    `cycles` and the masked at `masked_cycles` per iteration, spread evenly over the CUs (the items go
    longest first), but never below the longest item alone."""
    p = plan(shape, cus, split=False, causal=True)
    per_item = p["blocks_total"] and ((p["blocks_total"] - p["blocks_masked"]) * cycles
                                      + p["blocks_masked"] * masked_cycles)
    return max(per_item / cus, p["blocks_max_item"] * masked_cycles) / CLOCK_HZ * 1e3


def lower_bound_ms(shape: tuple, cycles: float, split: bool, cus: int = CUS) -> float:
    """Rounds of one workgroup per CU, each nkb iterations; the fractional last round either waits for
    its items whole or (split) runs them as parts, as the runtime plans them (merge not counted)."""
    p = plan(shape, cus, split)
    nkb, g, tail = p["nkb"], p["split_g"], p["tail"]
    full, rest = divmod(p["items"], cus)
    if tail:  # the planner split the last round's `tail` items into g parts
        full, rest = divmod(p["items"] - tail, cus)
        last = math.ceil(rest / cus) * nkb + math.ceil(tail * g / cus) * math.ceil(nkb / g)
    else:
        last = math.ceil(rest / cus) * nkb
    return (full * nkb + last) * cycles / CLOCK_HZ * 1e3


def varlen_items(lens, heads: int, causal: bool) -> list:
    """(unmasked, masked) kv blocks of every work item of a packed self-attention batch, in the packed
    grid's order (q block index descending, then sequence, then head), as the kernel visits them."""
    per_seq = [_item_blocks(s, causal) for s in lens]
    order = []
    for qb in range(max(len(b) for b in per_seq) - 1, -1, -1):
        for blocks in per_seq:
            if qb < len(blocks):
                order += [blocks[qb]] * heads
    return order


def _item_blocks(s: int, causal: bool) -> list:
    """(unmasked, masked) kv blocks of each 384-row q block of one (1, 1, s) self-attention problem: kv_span
    (attn_params.h) for Sq = Sk, no window or causal; the tests hold it to the runtime's plan."""
    nkb = math.ceil(s / 64)
    if not causal:
        return [(s // 64, nkb - s // 64)] * math.ceil(s / 384)
    out = []
    for q0 in range(0, s, 384):
        rows = min(384, s - q0)
        end = (q0 + rows - 1) // 64 + 1                  # blocks up to the last row's diagonal
        full = min((q0 + 1) // 64, s // 64)              # blocks every row sees whole
        out.append((full, end - full))
    return out


def varlen_model_ms(lens, heads: int, cycles: float, masked_cycles: float, causal: bool, cus: int = CUS) -> dict:
    """Static model of one packed call: every item costs its blocks at the loop bounds (unmasked at
    `cycles`, cut blocks at `masked_cycles`), one workgroup per CU. `bound`: the work spread evenly, but
    never below the longest item; `greedy`: the items dealt in grid order to the first free CU. Not
    counted: the V^T stage, per-item prologue/epilogue, memory stalls. A model, not a measurement."""
    items = [u * cycles + m * masked_cycles for u, m in varlen_items(lens, heads, causal)]
    free = [0.0] * cus
    for c in items:
        heapq.heappush(free, heapq.heappop(free) + c)
    ms = lambda cyc: cyc / CLOCK_HZ * 1e3  # noqa: E731
    return {"items": len(items), "bound": ms(max(sum(items) / cus, max(items))), "greedy": ms(max(free))}


def varlen_model(arch: str = "gfx942", mode: str = "rtne", lens=VARLEN_MIX, heads=VARLEN_HEADS) -> list:
    """The varlen mix next to the same sequences padded to the longest (a dense (B, Hq, max) call), causal
    and not, from the code objects' loop bounds. Rows of dicts, for the bench or the CLI."""
    hq, _ = heads
    plain, window = report(arch, mode, "none", "varlen"), report(arch, mode, "window", "varlen")
    dense, dense_w = report(arch, mode, "none", "dense"), report(arch, mode, "window", "dense")
    rows = []
    for causal in (False, True):
        r = window if causal else plain
        cyc = iteration_cycles(r.loop)["bound"]
        masked = iteration_cycles(r.masked_loop)["bound"] if causal else cyc
        m = varlen_model_ms(lens, hq, cyc, masked, causal)
        padded = (len(lens), hq, max(lens))
        if causal:
            pad = causal_lower_bound_ms(padded, iteration_cycles(dense_w.loop)["bound"],
                                        iteration_cycles(dense_w.masked_loop)["bound"])
        else:
            pad = lower_bound_ms(padded, iteration_cycles(dense.loop)["bound"], True)
        rows.append({"causal": causal, "items": m["items"], "bound_ms": m["bound"], "greedy_ms": m["greedy"],
                     "padded_dense_ms": pad, "cycles": cyc, "masked_cycles": masked})
    return rows


def print_varlen_model(rows: list, lens=VARLEN_MIX, heads=VARLEN_HEADS) -> None:
    print(f"\nVARLEN STATIC MODEL — a model from loop instruction counts, not a measurement: {len(lens)} sequences "
          f"{list(lens)}, Hq {heads[0]}, Hk {heads[1]}, D 128 (V^T stage, prologues and memory stalls not counted)")
    _table([(("causal" if r["causal"] else "non-causal"), r["items"], f"{r['bound_ms']:.3f}", f"{r['greedy_ms']:.3f}",
              f"{r['padded_dense_ms']:.3f}") for r in rows],
           ("mask", "work items", "bound ms", "greedy dispatch ms", "dense padded to the longest ms"))


# ---- the command -----------------------------------------------------------------------------------
def print_reports(reports: list) -> None:
    cols = ("variant", "compiler", "vgpr", "agpr", "sgpr", "lds", "scratch", "wg", "waves/simd",
            "mfma", "valu", "trans", "cndmask", "lds_ops", "vmem", "waitcnt", "barrier")
    rows = [(f"{r.arch} {r.mode} {r.mask} {r.kv}", r.compiler, r.notes["vgpr_count"], r.notes["agpr_count"],
             r.notes["sgpr_count"], r.notes["group_segment_fixed_size"], r.notes["private_segment_fixed_size"],
             r.notes["max_flat_workgroup_size"], r.waves_per_simd, r.loop["mfma"], r.loop["valu"], r.loop["trans"],
             r.loop["cndmask"], r.loop["lds"], r.loop["vmem"], r.loop["s_waitcnt"], r.loop["s_barrier"])
            for r in reports]
    rows += [(f"{r.arch} {r.mode} {r.mask} {r.kv}: cut blocks", r.compiler, "", "", "", "", "", "", "",
              m["mfma"], m["valu"], m["trans"], m["cndmask"], m["lds"], m["vmem"], m["s_waitcnt"], m["s_barrier"])
             for r in reports for m in ([r.masked_loop] if r.masked_loop else [])]
    _table(rows, cols)
    print("per KV iteration = static counts of the KV loop body of one wave (each wave runs it once per 64-row "
          "block);\nthe loop is the steady state: MFMA step 0 (QK only) before it, the last block's softmax "
          "(with the kv\nmask) and PV after it are peeled and not counted")


def print_model(reports: list) -> None:
    print("\nSTATIC ISSUE MODEL — a lower bound from instruction counts, not a measurement "
          f"({CUS} CUs, {CLOCK_HZ / 1e9:.1f} GHz, MFMA {MFMA_CYCLES} cyc, VALU x{VALU_CYCLES}, "
          f"transcendental x{TRANS_CYCLES})")
    for r in reports:
        c = iteration_cycles(r.loop)
        print(f"{r.arch} {r.mode} {r.mask}: cycles/iteration mfma {c['mfma']:.0f}, valu {c['valu']:.0f}, "
              f"lds {c['lds']:.0f} -> bound {c['bound']:.0f} ({max(c, key=lambda k: c[k] if k != 'bound' else -1)})")
    rows = []
    for shape, (rtne, rtz) in MOONMATH_MS.items():
        row = [str(shape)]
        for mode, meas in (("rtne", rtne), ("rtz", rtz)):
            rep = next((r for r in reports if r.mode == mode and r.mask == "none"), None)
            if rep is None:
                row += ["-", "-", f"{meas:.3f}"]
                continue
            cyc = iteration_cycles(rep.loop)["bound"]
            row += [f"{lower_bound_ms(shape, cyc, False):.3f}", f"{lower_bound_ms(shape, cyc, True):.3f}",
                    f"{meas:.3f}"]
            if lower_bound_ms(shape, cyc, True) > meas:
                row[-1] += " (bound above: too much non-MFMA work)"
        rows.append(row)
    _table(rows, ("shape (B,H,S)", "model rtne ms", "model rtne split", "MoonMath rtne ms (measured)",
                  "model rtz ms", "model rtz split", "MoonMath rtz ms (measured)"))
    causal = [r for r in reports if r.mask == "window"]
    if causal:
        print("\ncausal (window variant: full blocks at the steady loop's bound, cut blocks at the masked loop's)")
        rows = []
        for shape in MOONMATH_MS:
            row = [str(shape)]
            for r in causal:
                full = next(x for x in reports if x.mask == "none" and x.mode == r.mode)
                cut = iteration_cycles(r.masked_loop)["bound"]
                row.append(f"{causal_lower_bound_ms(shape, iteration_cycles(r.loop)['bound'], cut):.3f}")
                row.append(f"{lower_bound_ms(shape, iteration_cycles(full.loop)['bound'], True):.3f}")
            rows.append(row)
        _table(rows, ["shape (B,H,S)"]
               + [c for r in causal for c in (f"causal {r.mode} ms", f"non-causal {r.mode} ms")])


def _table(rows, cols) -> None:
    w = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    for r in (cols, ["-" * n for n in w], *rows):
        print("  ".join(str(x).ljust(n) for x, n in zip(r, w)))


def add_parser(sub) -> None:
    p = sub.add_parser("isa", help="code-object report of the gfx942 fast kernel (and --model: static issue model)")
    p.add_argument("--arch", default="gfx942", choices=ARCHS, help="gfx942 (clang) or gfx90a (hipRTC/clang)")
    p.add_argument("--model", action="store_true", help="also print the static issue model beside MoonMath's times")
    p.add_argument("--kv", default="dense", choices=("dense", "varlen", "paged", "all"),
                   help="which kv variants to report")
    p.add_argument("--varlen-model", action="store_true",
                   help="print the static model of the 12-sequence varlen mix (Hq 32, Hk 8) beside the padded "
                        "dense call")
    p.set_defaults(func=cmd_isa)


def cmd_isa(args) -> int:
    kvs = axis_values("kv") if args.kv == "all" else [args.kv]
    reports = [report(args.arch, mode, mask, kv) for kv in kvs for mask in axis_values("mask")
               for mode in axis_values("round_mode")]
    print_reports(reports)
    if args.model:
        print_model([r for r in reports if r.kv == "dense"])
    if args.varlen_model:
        print_varlen_model(varlen_model(args.arch))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rtcattn")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
