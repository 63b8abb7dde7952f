"""Code-object report of the gfx942 fast kernels (the prefill kernel `gfx942`, and `gfx942_decode` with --kernel):
registers, LDS, scratch, occupancy and the per-KV-iteration instruction mix of its loops, read from the very code
objects a call loads (`python -m rtcattn isa`). report(op=...) reads another op's kernel too (the backward's
`gfx942`: attention_bwd), whose loops it counts per iteration (Report.loops).

The static issue model built on these counts, with MoonMath's measured times, is a lab tool:
`python3 .ci/lab/gfx942/isa_model.py`."""
from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..ops.attention_fwd import OP
from ..runtime import manifest
from .isa_classes import TRANSCENDENTAL

KERNEL = "gfx942"  # the default kernel of the report
KERNELS = ("gfx942", "gfx942_decode")
ARCHS = ("gfx942", "gfx90a", "gfx950")
# The LLVM whose llvm-readelf / llvm-objdump read an arch's code objects: llvm-19's objdump stops at "Disassembly not
# yet supported for subtarget" on a gfx950 object.
LLVM_MAJOR = {"gfx942": 19, "gfx90a": 19, "gfx950": 22}
# Bytes one wave64 instruction moves through the LDS (reads, writes, cross-lane traffic, DMA fill).
# Bytes a lane loads with one VMEM load, by the op's width suffix.
LOAD_BYTES = {"ubyte": 1, "sbyte": 1, "ushort": 2, "sshort": 2, "dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16}
LDS_BYTES = {"ds_read_b32": 256, "ds_write_b32": 256, "ds_read_b64": 512, "ds_write_b64": 512,
             "ds_read2_b32": 512, "ds_write2_b32": 512, "ds_read2st64_b32": 512, "ds_write2st64_b32": 512,
             "ds_read2_b64": 1024, "ds_write2_b64": 1024, "ds_read2st64_b64": 1024, "ds_write2st64_b64": 1024,
             "ds_read_b128": 1024, "ds_write_b128": 1024, "ds_swizzle_b32": 256, "ds_bpermute_b32": 256}


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
    head_dim: int = 128   # the head-dim bucket
    dtype: str = "bf16"
    kernel: str = KERNEL
    kv_dtype: str = "same"  # the cache's element type (the kv_dtype axis)
    op: str = OP
    # Other ops than the forward's: every loop holding MFMAs (mfma_loops), in address order, counted over the
    # instructions each of its iterations runs (iteration_path); `loop` is then the one with the most MFMAs.
    loops: list = field(default_factory=list)
    # The forward's `loop` as instructions (address, opcode, operands), its rare blocks left out: the order of its
    # loads and waits, which the decode model replays (decode_model.wave_seconds).
    loop_body: list = field(default_factory=list)

    @property
    def name(self) -> str:
        prefix = ("" if self.op == OP else f"{self.op} ") + ("" if self.kernel == KERNEL else f"{self.kernel} ")
        cache = "" if self.kv_dtype == "same" else f" {self.kv_dtype}"
        return f"{prefix}{self.arch} d{self.head_dim} {self.dtype} {self.mode} {self.mask} {self.kv}{cache}"

    @property
    def waves_per_cu(self) -> int:
        """Waves per CU the code object allows (a 512-entry unified VGPR file per SIMD, 4 SIMDs, the arch's LDS per
        CU), in whole workgroups: a workgroup's waves are resident together or not at all, spread over the SIMDs."""
        regs = self.notes["vgpr_count"] + self.notes["agpr_count"]
        by_regs = 8 if regs == 0 else min(8, 512 // (math.ceil(regs / 8) * 8))  # per SIMD
        lds = self.notes["group_segment_fixed_size"]
        waves_per_group = math.ceil(self.notes["max_flat_workgroup_size"] / 64)
        by_lds = manifest.load().machine(self.arch).lds_per_cu // lds if lds else 32  # workgroups per CU
        return min(by_lds, 4 * by_regs // waves_per_group) * waves_per_group

    @property
    def waves_per_simd(self) -> int:
        """Waves per SIMD (waves_per_cu over the 4 SIMDs, rounded down: one-wave workgroups whose LDS lets a CU hold 6
        run 2, 2, 1 and 1 on its SIMDs)."""
        return self.waves_per_cu // 4


def _tool(name: str, arch: str = "gfx942") -> str:
    major = LLVM_MAJOR[arch]
    for cand in (f"{name}-{major}", name):
        path = shutil.which(cand)
        if path:
            return path
    raise FileNotFoundError(f"{name}-{major} (or {name}) is not on PATH; tried {name}-{major}, {name}; install "
                            f"llvm-{major} (it reads {arch} code objects)")


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
    loops = _outer_loops(insts, bodies)
    most = max((sum(1 for x in b if x[1].startswith("v_mfma")) for b in loops), default=0)
    return sorted((b for b in loops if most and sum(1 for x in b if x[1].startswith("v_mfma")) == most),
                  key=lambda b: b[0][0])


def _outer_loops(insts: list, bodies: dict) -> list:
    """The loop bodies (instruction lists) not inside another one. A body inside another one is the same loop seen
    from a second latch's target one instruction earlier or later (kv_loop above): clang-22 gives gfx950's decode
    loop such a latch. It is dropped, so that it is neither counted as a loop of its own nor taken for the steady loop
    of a window variant. A loop nested in another one drops out too: iteration_path finds its iterations."""
    sets = [set(addrs) for addrs in bodies.values()]
    return [[x for x in insts if x[0] in addrs] for addrs in sets if not any(addrs < o for o in sets)]


def mfma_loops(insts: list, bodies: dict = None) -> list:
    """Every loop holding MFMAs (of _outer_loops: nested loops and second latches merged into one body), each once,
    in address order: a kernel of several stages has a hot loop a stage (the backward's dK / dV and dQ loops), told
    apart by their MFMAs."""
    out = []
    for body in _outer_loops(insts, _loop_bodies(insts) if bodies is None else bodies):
        if any(x[1].startswith("v_mfma") for x in body) and body not in out:
            out.append(body)
    return sorted(out, key=lambda b: b[0][0])


def iteration_path(insts: list, body: list) -> list:
    """The instructions of a loop body that every iteration runs: the basic blocks without which no cycle through
    the body's first MFMA is left. Blocks an iteration may go around drop out: an enclosing loop's own code (the
    backward's step to the next query head), a branch's block that some waves skip (the LSE rows the first 16
    threads stage), a window's skipped tiles. The counts are then those of an iteration, not of the loop's code."""
    addrs = {x[0] for x in body}
    heads, blocks = _block_heads(insts), []
    for i, x in enumerate(insts):
        if x[0] not in addrs:
            continue
        if not blocks or x[0] in heads or insts[i - 1][0] not in addrs:
            blocks.append([])
        blocks[-1].append(x)
    index = {b[0][0]: n for n, b in enumerate(blocks)}
    succ = _successors(insts)
    edges = {n: {index[a] for a in succ[b[-1][0]] if a in index} for n, b in enumerate(blocks)}
    anchor = next(n for n, b in enumerate(blocks) if any(x[1].startswith("v_mfma") for x in b))

    def cycle(without: int) -> bool:  # a cycle through the anchor that avoids block `without`
        return anchor in set().union(*(edges[n] for n in _walk(anchor, edges, stop=without)))

    return [x for n, b in enumerate(blocks) if n == anchor or not cycle(n) for x in b]


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


def _block_heads(insts: list) -> set:
    """Addresses where a basic block starts: a branch target, or the instruction after a branch."""
    heads = {0}
    for i, (addr, op, args) in enumerate(insts):
        target = _branch_target(addr, op, args)
        if target is not None:
            heads.add(target)
        if (op.startswith("s_cbranch") or op == "s_branch") and i + 1 < len(insts):
            heads.add(insts[i + 1][0])
    return heads


def rare_blocks(insts: list) -> set:
    """Addresses of the basic blocks that hold a rare-block mark (isa_gfx9.h's rare_block: two s_nop 0 in a row,
    which clang's own hazard waits never give): data-dependent fix-ups skipped on every ordinary step. A block runs
    from a branch target or the instruction after a branch to the next such boundary."""
    heads = _block_heads(insts)
    out, block, marked = set(), [], False
    for i, (addr, op, args) in enumerate(insts + [(None, "", "")]):
        if addr is None or addr in heads:
            if marked:
                out.update(block)
            block, marked = [], False
        if addr is None:
            break
        block.append(addr)
        marked = marked or (op == "s_nop" and args.strip() == "0" and i > 0 and insts[i - 1][1] == "s_nop"
                            and insts[i - 1][2].strip() == "0")
    return out


def count(body: list) -> dict:
    c = {"mfma": 0, "valu": 0, "trans": 0, "cndmask": 0, "lds": 0, "lds_bytes": 0, "vmem": 0, "lds_dma": 0,
         "vmem16": 0, "s_waitcnt": 0, "s_barrier": 0, "cvt_fp8": 0, "load_bytes": 0, "mfma_scale": 0,
         "total": len(body)}
    for _, op, args in body:
        if op.startswith("v_mfma"):
            c["mfma"] += 1
            c["mfma_scale"] += op.startswith("v_mfma_scale")  # gfx950's scaled f8f6f4 MFMA (the native FP4 path)
        elif op.startswith("v_"):
            c["valu"] += 1
            c["trans"] += bool(TRANSCENDENTAL.match(op))
            c["cndmask"] += op.startswith("v_cndmask")
            c["cvt_fp8"] += op.startswith(("v_cvt_f32_fp8", "v_cvt_pk_f32_fp8"))  # FP8 to fp32 by the hardware
        elif op.startswith("ds_"):
            c["lds"] += 1
            c["lds_bytes"] += LDS_BYTES.get(op, 256)
        elif op.startswith(("buffer_", "global_", "flat_", "scratch_")):
            c["vmem"] += 1
            c["vmem16"] += op.endswith("_dwordx4") and "load" in op  # 16 bytes a lane: the V^T fragments
            if "_load_" in op:
                c["load_bytes"] += LOAD_BYTES.get(op.split("_load_")[1], 0)
            if args.rstrip().endswith(" lds"):
                c["lds_dma"] += 1
                c["lds_bytes"] += 256
        elif op.startswith("s_waitcnt"):
            c["s_waitcnt"] += 1
        elif op == "s_barrier":
            c["s_barrier"] += 1
    return c


def _hot_count(body: list, rare: set) -> dict:
    """count() of a loop body without its rare blocks (rare_blocks), whose instructions are counted as "rare"."""
    c = count([x for x in body if x[0] not in rare])
    c["rare"] = sum(1 for x in body if x[0] in rare)
    return c


def analyse(code: bytes, kernel: str = KERNEL, arch: str = "gfx942", op: str = OP) -> tuple:
    """(notes, instructions with addresses relative to the kernel symbol) of one code object of arch."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.co"
        path.write_bytes(code)
        notes = subprocess.run([_tool("llvm-readelf", arch), "--notes", str(path)], capture_output=True, text=True,
                               check=True).stdout
        dis = subprocess.run([_tool("llvm-objdump", arch), "-d", str(path)], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"^([0-9a-f]+) <" + _spec(op).kernel(kernel).symbol + ">:", dis, re.M)
    start = int(m.group(1), 16) if m else 0
    return parse_notes(notes), [(a - start, mn, args) for a, mn, args in _instructions(dis)]


def _spec(op: str = OP):
    from ..runtime import manifest
    return manifest.load().op(op)


def axis_values(axis: str) -> list:
    return _spec().axis_values(axis)


def build(arch: str, mode: str, mask: str = "none", kv: str = "dense", head_dim: int = 128, dtype: str = "bf16",
          kernel: str = KERNEL, kv_dtype: str = "same", op: str = OP):
    """The product's build of one variant (manifest request, runtime cache, compiler order): the very
    code object a call would load. An op without a kv_dtype axis (attention_bwd) ignores kv_dtype."""
    from ..runtime import dispatch, manifest
    v = manifest.load().variant_for(op, kernel, arch, {"round_mode": mode, "mask": mask, "kv": kv,
                                                       "head_dim": head_dim, "dtype": dtype, "kv_dtype": kv_dtype,
         "score_mod": "plain", "dropout": "nodrop"})
    return dispatch.build(v)


def report(arch: str, mode: str, mask: str = "none", kv: str = "dense", head_dim: int = 128,
           dtype: str = "bf16", kernel: str = KERNEL, kv_dtype: str = "same", op: str = OP) -> Report:
    res = build(arch, mode, mask, kv, head_dim, dtype, kernel, kv_dtype, op)
    notes, insts = analyse(res.code(), kernel, arch, op)
    r = Report(arch, mode, res.compiler_id, notes, mask=mask, kv=kv, head_dim=head_dim, dtype=dtype, kernel=kernel,
               kv_dtype=kv_dtype, op=op)
    rare = rare_blocks(insts)
    if op != OP:  # a kernel of stages (the backward): every MFMA loop, counted per iteration
        r.loops = [_hot_count(iteration_path(insts, b), rare) for b in mfma_loops(insts)]
        r.loop = dict(max(r.loops, key=lambda c: c["mfma"]))
        r.loop["mfma_total"] = sum(1 for x in insts if x[1].startswith("v_mfma"))
        return r
    bodies = kv_loops(insts)
    loops = [_hot_count(b, rare) for b in bodies]
    if mask != "none":
        steady = min(range(len(loops)), key=lambda i: (loops[i]["cndmask"], -loops[i]["total"]))
        r.loop, body = loops[steady], bodies[steady]
    else:
        body = kv_loop(insts)
        r.loop = _hot_count(body, rare)
    r.loop_body = [x for x in body if x[0] not in rare]
    if mask != "none":
        r.masked_loop = max(loops, key=lambda c: (c["cndmask"], c["total"]))
    r.loop["mfma_total"] = sum(1 for x in insts if x[1].startswith("v_mfma"))
    r.loop["has_mfma16_bf16"] = any(x[1] in ("v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x16bf16_1k") for x in insts)
    r.loop["has_mfma16_f16"] = any(x[1] in ("v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16f16") for x in insts)
    return r


# ---- the command -----------------------------------------------------------------------------------
def print_reports(reports: list) -> None:
    cols = ("variant", "compiler", "vgpr", "agpr", "sgpr", "lds", "scratch", "wg", "waves/simd",
            "mfma", "valu", "trans", "cndmask", "lds_ops", "vmem", "waitcnt", "barrier")
    rows = [(r.name, r.compiler, r.notes["vgpr_count"], r.notes["agpr_count"],
             r.notes["sgpr_count"], r.notes["group_segment_fixed_size"], r.notes["private_segment_fixed_size"],
             r.notes["max_flat_workgroup_size"], r.waves_per_simd, r.loop["mfma"], r.loop["valu"], r.loop["trans"],
             r.loop["cndmask"], r.loop["lds"], r.loop["vmem"], r.loop["s_waitcnt"], r.loop["s_barrier"])
            for r in reports]
    rows += [(f"{r.name}: cut blocks", r.compiler, "", "", "", "", "", "", "",
              m["mfma"], m["valu"], m["trans"], m["cndmask"], m["lds"], m["vmem"], m["s_waitcnt"], m["s_barrier"])
             for r in reports for m in ([r.masked_loop] if r.masked_loop else [])]
    table(rows, cols)
    print("per KV iteration = static counts of the KV loop body of one wave (each wave runs it once per 64-row "
          "block);\nthe loop is the steady state: MFMA step 0 (QK only) before it, the last block's softmax "
          "(with the kv\nmask) and PV after it are peeled and not counted")


def table(rows, cols) -> None:
    w = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    for r in (cols, ["-" * n for n in w], *rows):
        print("  ".join(str(x).ljust(n) for x, n in zip(r, w)))


def add_parser(sub) -> None:
    p = sub.add_parser("isa", help="code-object report of the gfx942 fast kernels (registers, LDS, loop "
                                   "instruction counts)")
    p.add_argument("--arch", default="gfx942", choices=ARCHS,
                   help="gfx942 (clang), gfx90a (hipRTC/clang) or gfx950 (clang22)")
    p.add_argument("--kernel", default=KERNEL, choices=KERNELS, help=f"which kernel (default {KERNEL}: prefill)")
    p.add_argument("--decode-model", action="store_true",
                   help="the static bandwidth model of the gfx942_decode kernel on the issue's decode cases, against "
                        "the arch's part's HBM bandwidth (gfx942: MI300X, gfx950: MI355X)")
    p.add_argument("--prefill-model", action="store_true",
                   help="the static model of the gfx942 prefill kernel over FP8 and FP4 paged caches beside bf16")
    p.add_argument("--backward-model", action="store_true",
                   help="the static model of the gfx942 backward kernel (attention_bwd) on MI300X against AITER v3's "
                        "published backward figures")
    add_variant_arguments(p)
    p.set_defaults(func=cmd_isa)


def add_variant_arguments(p) -> None:
    """The variant filters of the report (shared with the lab's static model)."""
    p.add_argument("--kv", default="dense", choices=("dense", "varlen", "paged", "all"),
                   help="which kv variants to report")
    p.add_argument("--head-dim", default="all", help="head-dim buckets to report, comma-separated (default: all "
                                                    f"of the kernel's: {', '.join(map(str, buckets()))})")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "all"), help="which dtype's variants")


def buckets(kernel: str = KERNEL) -> list:
    """The kernel's head-dim buckets, from the manifest."""
    return list(_spec().kernel(kernel).axes["head_dim"].buckets)


def parse_head_dims(text: str, kernel: str = KERNEL) -> list:
    if text == "all":
        return buckets(kernel)
    dims = [int(x) for x in text.split(",")]
    bad = [d for d in dims if d not in buckets(kernel)]
    if bad:
        raise SystemExit(f"--head-dim {text}: {bad} not a bucket of the {kernel} kernel; accepted: "
                         f"{', '.join(map(str, buckets(kernel)))} or all")
    return dims


def variants(kv: str = "dense", head_dims=None, dtype: str = "bf16", kernel: str = KERNEL) -> list:
    """(mode, mask, kv, head_dim, dtype) of every variant the manifest has for these filters, in report order."""
    from ..runtime import manifest
    spec = manifest.load().op(OP)
    kvs = axis_values("kv") if kv == "all" else [kv]
    dtypes = list(spec.kernel(kernel).axes["dtype"]) if dtype == "all" else [dtype]
    out = []
    for d in head_dims or buckets(kernel):
        for t in dtypes:
            for k in kvs:
                for mask in axis_values("mask"):
                    for mode in axis_values("round_mode"):
                        combo = {"round_mode": mode, "mask": mask, "kv": k, "dtype": t, "kv_dtype": "same",
                                 "score_mod": "plain", "dropout": "nodrop"}
                        if spec.exclusion(combo) is None:
                            out.append((mode, mask, k, d, t))
    return out


def variant_reports(arch: str, kv: str = "dense", head_dims=None, dtype: str = "bf16", kernel: str = KERNEL) -> list:
    """The report of every variant of the kernel for arch (every kv variant for kv="all"), per bucket and dtype."""
    return [report(arch, *v, kernel=kernel) for v in variants(kv, head_dims, dtype, kernel)]


def cmd_isa(args) -> int:
    if getattr(args, "decode_model", False):
        from . import decode_model
        from .prefill_model import MACHINES
        machine = MACHINES[args.arch]
        decode_model.print_models({t: decode_model.case_models(
            lambda d, kv_dtype: report(args.arch, "rtne", "window", "paged", d, "bf16", kernel=decode_model.KERNEL,
                                       kv_dtype=kv_dtype), t, machine) for t in ("same", "fp8_e4m3", "fp4_e2m1")},
            table, machine)
        return 0
    if getattr(args, "prefill_model", False):
        from . import prefill_model
        machine = prefill_model.MACHINES[args.arch]
        print(f"machine: {machine.name}")
        prefill_model.print_models(prefill_model.models(
            lambda mask, kv_dtype: report(args.arch, "rtne", mask, "paged", 128, "bf16", kv_dtype=kv_dtype),
            machine), table)
        return 0
    if getattr(args, "backward_model", False):
        from . import backward_model as bm
        bm.print_models(bm.models(lambda mask: report(args.arch, "rtne", mask, "dense", bm.HEAD_DIM, "bf16",
                                                      kernel=bm.KERNEL, op=bm.OP)), table)
        return 0
    kernel = getattr(args, "kernel", KERNEL)
    print_reports(variant_reports(args.arch, args.kv, parse_head_dims(args.head_dim, kernel), args.dtype, kernel))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rtcattn")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
