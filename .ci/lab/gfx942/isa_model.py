"""Lab: the static issue model of the gfx942 fast kernel, from the code-object report's loop counts
(rtcattn.tools.coreport) and the runtime's launch plan, beside MoonMath's published MI300X times.

A lower bound from instruction counts, not a measurement: per KV iteration, the busy cycles of the matrix
pipe, the VALU and the LDS; per problem, the rounds of work items the runtime plans on the CUs.

  python3 .ci/lab/gfx942/isa_model.py [--arch gfx942|gfx90a] [--kv dense|varlen|paged|all] [--head-dim D,...|all]
                                      [--dtype bf16|fp16|all] [--varlen]
      the code-object report and the model per head-dim bucket (--varlen: also the serving varlen mix against the
      padded dense call, at D = 128)

Per bucket the bound is set beside MoonMath's published MI300X times scaled by D / 128: they were measured at D = 128,
and attention's work (4 B H S^2 D flops) and its K, V and O traffic grow linearly with D at a given (B, H, S), so a
kernel of MoonMath's class, MFMA-bound at every D, would take time x D / 128. The scaling flatters small D: there the
softmax's work, which does not shrink with D, bounds every kernel of this design (the VALU bound below).
"""
from __future__ import annotations

import argparse
import heapq
import math
import sys
from pathlib import Path

if __name__ == "__main__":  # run from a checkout: this tree's package (the tests put it on sys.path themselves)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))

# The serving varlen mix and its heads, as the product's bench defines them.
from rtcattn.ops.attention_fwd.bench import HK, HQ, VARLEN_MIX
from rtcattn.runtime.dispatch import emulated_cus
from rtcattn.tools.coreport import (
    ARCHS,
    KERNEL,
    OP,
    add_variant_arguments,
    parse_head_dims,
    print_reports,
    report,
    table,
    variant_reports,
)

CUS = emulated_cus("gfx942-emu")  # MI300X's compute units, as the runtime plans the emulated part
VARLEN_HEADS = (HQ, HK)
# The model's machine: clock, issue cycles per MFMA (16x16x16 bf16 or f16), per VALU and per transcendental
# instruction of a wave64, LDS bytes per clock and CU, and (an assumption, not a documented figure) vector L1 bytes
# per clock and CU, which every wave's V^T fragment loads go through.
CLOCK_HZ = 2.1e9
MFMA_CYCLES, VALU_CYCLES, TRANS_CYCLES, LDS_BYTES_PER_CLK, L1_BYTES_PER_CLK = 16, 4, 16, 128, 64
# MoonMath's published MI300X times (ms) for the seed shapes (B, H, S): RTNE, RTZ.
MOONMATH_MS = {(2, 24, 8192): (3.083, 2.983), (2, 24, 16384): (11.670, 11.385), (1, 32, 16384): (8.013, 7.731),
               (4, 16, 16384): (15.591, 15.055), (1, 64, 16384): (15.528, 15.040), (2, 24, 32768): (46.002, 44.075),
               (2, 16, 65536): (117.612, 114.665), (2, 8, 86016): (101.071, 99.397),
               (1, 16, 131072): (232.517, 226.152)}


def _lib():
    from rtcattn.runtime import dispatch
    return dispatch.lib()


def iteration_cycles(loop: dict) -> dict:
    """Busy cycles per KV iteration: per SIMD (two waves, one of each group) for the matrix pipe and the
    VALU, per CU (eight waves) for the LDS and for the V^T fragments through L1 (16-byte loads of 64 lanes).
    The largest bounds the iteration."""
    mfma = 2 * loop["mfma"] * MFMA_CYCLES
    valu = 2 * ((loop["valu"] - loop["trans"]) * VALU_CYCLES + loop["trans"] * TRANS_CYCLES)
    lds = 8 * loop["lds_bytes"] / LDS_BYTES_PER_CLK
    l1 = 8 * loop.get("vmem16", 0) * 64 * 16 / L1_BYTES_PER_CLK
    return {"mfma": mfma, "valu": valu, "lds": lds, "l1": l1, "bound": max(mfma, valu, lds, l1)}


def plan(shape: tuple, cus: int = CUS, split: bool = True, causal: bool = False, head_dim: int = 128) -> dict:
    """The runtime's launch plan of the gfx942 kernel for a (B, H, S) problem: the planner of a real call."""
    b, h, s = shape
    strides = (s * h * head_dim, h * head_dim, head_dim)
    args = _lib().op_args(OP, q=1, k=1, v=1, o=1, q_strides=strides, k_strides=strides, v_strides=strides,
                          o_strides=strides, batch=b, heads=h, seq_q=s, seq_k=s, head_dim=head_dim, heads_k=h,
                          window_left=-1, window_right=0 if causal else -1,
                          softmax_scale=1.0, tail_split=-1 if split else 0, num_cus=cus)
    return _lib().op_plan(OP, KERNEL, args)


def causal_lower_bound_ms(shape: tuple, cycles: float, masked_cycles: float, cus: int = CUS,
                          head_dim: int = 128) -> float:
    """Causal: the items' kv blocks (as the kernel visits them, from the runtime's plan), the unmasked at
    `cycles` and the masked at `masked_cycles` per iteration, spread evenly over the CUs (the items go
    longest first), but never below the longest item alone."""
    p = plan(shape, cus, split=False, causal=True, head_dim=head_dim)
    per_item = p["blocks_total"] and ((p["blocks_total"] - p["blocks_masked"]) * cycles
                                      + p["blocks_masked"] * masked_cycles)
    return max(per_item / cus, p["blocks_max_item"] * masked_cycles) / CLOCK_HZ * 1e3


def lower_bound_ms(shape: tuple, cycles: float, split: bool, cus: int = CUS, head_dim: int = 128) -> float:
    """Rounds of one workgroup per CU, each nkb iterations; the fractional last round either waits for
    its items whole or (split) runs them as parts, as the runtime plans them (merge not counted)."""
    p = plan(shape, cus, split, head_dim=head_dim)
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
    and not, from the code objects' loop bounds. Rows of dicts, for print_varlen_model."""
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
    table([(("causal" if r["causal"] else "non-causal"), r["items"], f"{r['bound_ms']:.3f}", f"{r['greedy_ms']:.3f}",
             f"{r['padded_dense_ms']:.3f}") for r in rows],
          ("mask", "work items", "bound ms", "greedy dispatch ms", "dense padded to the longest ms"))


def moonmath_scaled_ms(shape: tuple, mode: str, head_dim: int) -> float:
    """MoonMath's published time of a seed shape (D = 128) scaled to head dim D: x D / 128 (module docstring)."""
    rtne, rtz = MOONMATH_MS[shape]
    return (rtne if mode == "rtne" else rtz) * head_dim / 128


def bucket_bounds(reports: list) -> list:
    """Per dense unmasked report (a bucket and mode): the model's bound with the planned split on every seed shape,
    beside MoonMath's time scaled to the bucket's D. Rows of dicts."""
    rows = []
    for r in reports:
        if r.mask != "none" or r.kv != "dense" or r.mode not in ("rtne", "rtz"):
            continue
        c = iteration_cycles(r.loop)
        for shape in MOONMATH_MS:
            bound = lower_bound_ms(shape, c["bound"], True, head_dim=r.head_dim)
            scaled = moonmath_scaled_ms(shape, r.mode, r.head_dim)
            rows.append({"head_dim": r.head_dim, "dtype": r.dtype, "mode": r.mode, "shape": shape,
                         "bound_ms": bound, "moonmath_scaled_ms": scaled, "ratio": bound / scaled,
                         "pipe": max(("mfma", "valu", "lds", "l1"), key=lambda k: c[k])})
    return rows


def print_model(reports: list) -> None:
    print("\nSTATIC ISSUE MODEL — a lower bound from instruction counts, not a measurement "
          f"({CUS} CUs, {CLOCK_HZ / 1e9:.1f} GHz, MFMA {MFMA_CYCLES} cyc, VALU x{VALU_CYCLES}, "
          f"transcendental x{TRANS_CYCLES})")
    for r in reports:
        c = iteration_cycles(r.loop)
        print(f"{r.name}: cycles/iteration mfma {c['mfma']:.0f}, valu {c['valu']:.0f}, lds {c['lds']:.0f}, "
              f"l1 {c['l1']:.0f} -> bound {c['bound']:.0f} ({max(c, key=lambda k: c[k] if k != 'bound' else -1)})")
    rows = bucket_bounds(reports)
    print("\nper bucket: the bound (planned split) beside MoonMath's measured D = 128 time scaled by D / 128")
    table([(f"d{x['head_dim']} {x['dtype']} {x['mode']}", str(x["shape"]), f"{x['bound_ms']:.3f}",
            f"{x['moonmath_scaled_ms']:.3f}", f"{x['ratio']:.2f}", x["pipe"]) for x in rows],
          ("variant", "shape (B,H,S)", "model ms", "MoonMath x D/128 ms", "ratio", "bound by"))
    worst = {}
    for x in rows:
        key = (x["head_dim"], x["dtype"], x["mode"])
        worst[key] = max(worst.get(key, 0.0), x["ratio"])
    print("\nworst ratio per bucket: " + ", ".join(f"d{d} {t} {m} {v:.2f}" for (d, t, m), v in worst.items()))
    causal = [r for r in reports if r.mask == "window" and r.kv == "dense"]
    if causal:
        print("\ncausal (window variant: full blocks at the steady loop's bound, cut blocks at the masked loop's)")
        rows = []
        for shape in MOONMATH_MS:
            row = [str(shape)]
            for r in causal:
                full = next(x for x in reports if x.mask == "none" and x.mode == r.mode and x.head_dim == r.head_dim
                            and x.dtype == r.dtype and x.kv == "dense")
                cut, d = iteration_cycles(r.masked_loop)["bound"], r.head_dim
                row.append(f"{causal_lower_bound_ms(shape, iteration_cycles(r.loop)['bound'], cut, head_dim=d):.3f}")
                row.append(f"{lower_bound_ms(shape, iteration_cycles(full.loop)['bound'], True, head_dim=d):.3f}")
            rows.append(row)
        table(rows, ["shape (B,H,S)"]
              + [c for r in causal for c in (f"causal d{r.head_dim} {r.mode}", f"full d{r.head_dim} {r.mode}")])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="gfx942", choices=ARCHS, help="gfx942 (clang) or gfx90a (hipRTC/clang)")
    add_variant_arguments(p)
    p.add_argument("--varlen", action="store_true",
                   help="also the model of the 12-sequence varlen mix (Hq 32, Hk 8) beside the padded dense call")
    args = p.parse_args(argv)
    reports = variant_reports(args.arch, args.kv, parse_head_dims(args.head_dim), args.dtype)
    print_reports(reports)
    print_model([r for r in reports if r.kv == "dense"])
    if args.varlen:
        print_varlen_model(varlen_model(args.arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
