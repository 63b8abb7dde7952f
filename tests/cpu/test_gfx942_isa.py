"""Code-object checks of the gfx942 fast kernel, per head-dim bucket, on gfx942 (clang 19), gfx90a (hipRTC 5.2, or
clang) and gfx950 (clang 22): no scratch and no VGPR spills, the bucket's LDS (at most 64 KiB), 512 threads at 2 waves
per SIMD, and the KV loop's MFMAs, barriers and selects, for every round mode (gfx950: rtne) and both dtypes (dense),
and for the packed variants; a sample of the score modifications' variants (the soft cap, ALiBi) against the same
budgets and their plain variants' loops, and a sample of the dropout variants against the same budgets."""
import functools
import itertools
import shutil
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import pytest

from rtcattn.runtime import manifest
from rtcattn.tools import coreport

ARCHS = [a for a, tool in (("gfx942", "clang++-19"), ("gfx90a", "clang++-19"), ("gfx950", "clang++-22"))
         if shutil.which(tool)]
BUCKETS = coreport.buckets()
# (round mode, dtype) of every variant: the bf16 modes, and fp16 (nearest even only).
MODES = [(m, "bf16") for m in coreport.axis_values("round_mode")] + [("rtne", "fp16")]
# gfx90a and gfx950 on the warm default's round mode only (bf16 and fp16): rtna / rtz change a few VALU ops of the
# conversion in the same source, which gfx942 checks in every variant; every bucket, dtype, mask and kv form stays on
# every arch (CI's time: docs/NOTES.md).
ARCH_MODES = [(a, m, t) for a in ARCHS for m, t in MODES if a == "gfx942" or m == "rtne"]
# The packed forms (varlen, paged) on rtne bf16 on every arch, and fp16 on gfx942: rtna / rtz and fp16 change the
# conversion ops (fp16 the MFMA too) the same way in every form, which the dense variants check at every bucket and
# mask on their archs, and packing changes addressing alone, which these check (CI's time).
PACKED_ARCH_MODES = [(a, m, t) for a, m, t in ARCH_MODES if m == "rtne" and (t == "bf16" or a == "gfx942")]


PACKED_OTHER_ARCH_BUCKETS = (128,)
OTHER_MODE_BUCKETS = (BUCKETS[0], BUCKETS[-1])


def _checked(arch, mode, kv, dtype, d=None) -> bool:
    """Whether this module checks (and so prebuilds) the variants of (arch, mode, kv form, dtype) at bucket d (None:
    at some bucket). gfx90a's and gfx950's packed forms at bucket 128 only (PACKED_OTHER_ARCH_BUCKETS): what packing
    changes (addressing) gfx942's packed variants check at every bucket, what the arch changes (its instructions) the
    dense variants at every bucket. gfx942's rtna / rtz at the smallest and largest bucket (OTHER_MODE_BUCKETS): the
    conversion ops they change are the same code at every bucket, which rtne checks; so are gfx90a's and gfx950's fp16
    ones and gfx942's packed fp16 ones, which gfx942's dense fp16 checks at every bucket (CI's time)."""
    if d is not None and (mode != "rtne" or (dtype == "fp16" and (arch != "gfx942" or kv != "dense"))) and (
            d not in OTHER_MODE_BUCKETS):
        return False
    if d is not None and kv != "dense" and arch != "gfx942" and d not in PACKED_OTHER_ARCH_BUCKETS:
        return False
    return (arch, mode, dtype) in (ARCH_MODES if kv == "dense" else PACKED_ARCH_MODES)
# What the design puts where (docs/NOTES.md, "gfx942 per head-dim bucket"): q tiles of 16 rows per wave, Q tiles in
# LDS, and the K rows' pitch in LDS (elements).
DESIGN = {64: (3, 0, 64), 96: (3, 0, 128), 128: (3, 1, 128), 192: (2, 0, 256), 256: (1, 0, 256)}


# The (arch, round mode, dtype, bucket) of the dense variants checked, and of the packed ones with their kv form.
DENSE_CASES = [(a, m, t, d) for a, m, t in ARCH_MODES for d in BUCKETS if _checked(a, m, "dense", t, d)]
PACKED_CASES = [(a, m, t, kv, d) for a, m, t in PACKED_ARCH_MODES for kv in ("varlen", "paged") for d in BUCKETS
                if _checked(a, m, kv, t, d)]


@pytest.fixture(scope="module", autouse=True)
def prebuilt():
    """Every variant this module reports, compiled up front two at a time (the archs interleaved: hipRTC compiles
    one at a time per process, clang does not block it) into the user cache, where the reports (and
    tests/cpu/test_hip_launch.py, through its read-only cache) find them."""
    from rtcattn.runtime import dispatch, manifest
    m = manifest.load()
    by_arch = [[m.variant_for(coreport.OP, coreport.KERNEL, a, {"round_mode": mode, "mask": mask, "kv": kv,
                                                                 "head_dim": d, "dtype": dtype, "kv_dtype": "same",
                                                                 "score_mod": "plain", "dropout": "nodrop"})
                for mode, mask, kv, d, dtype in coreport.variants("all", None, "all")
                if _checked(a, mode, kv, dtype, d)] for a in ARCHS]
    order = [v for group in itertools.zip_longest(*by_arch) for v in group if v is not None]
    with ThreadPoolExecutor(max_workers=2) as pool:  # ctypes drops the GIL in rtc_build
        list(pool.map(dispatch.build, order))


@functools.cache
def report(arch, mode, mask, kv, d, dtype):
    """A variant's report, read once per module (the window and packed checks compare with the plain variant's)."""
    return coreport.report(arch, mode, mask, kv, d, dtype)


def design_lds(d: int) -> int:
    """The K double buffer (2 x 64 rows x pitch x 2 bytes) and each wave's Q tiles in LDS (16 rows x d x 2 bytes)."""
    _, q_lds, pitch = DESIGN[d]
    return 2 * 64 * pitch * 2 + 8 * q_lds * 16 * d * 2


def loop_mfmas(d: int) -> int:
    """One wave's MFMAs per 64-key block: QK (tiles x 4 key sub-tiles x d/16 k-steps) and as many for PV."""
    return 2 * DESIGN[d][0] * 4 * (d // 16)


def test_the_design_table_covers_the_buckets():
    assert sorted(DESIGN) == BUCKETS
    assert all(design_lds(d) <= 64 * 1024 for d in BUCKETS)


def check_common(r, tag, loop_selects=False):
    """loop_selects: the steady loop may select (dropout's keep bits and word of each Philox call)."""
    n = r.notes
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    lds_per_cu = manifest.load().machine(r.arch).lds_per_cu
    assert n["group_segment_fixed_size"] == design_lds(r.head_dim) <= min(64 * 1024, lds_per_cu), tag
    assert n["max_flat_workgroup_size"] == 512, tag
    # Occupancy: one workgroup of 8 waves per CU, 2 waves per SIMD (the two groups share each SIMD): at most 256
    # VGPRs + AGPRs per wave.
    assert n["vgpr_count"] + n["agpr_count"] <= 256 and r.waves_per_simd == 2, f"2 waves/SIMD: {tag}"
    # The element type's MFMA, and not the other one's.
    mine, other = ("has_mfma16_bf16", "has_mfma16_f16")[::1 if r.dtype == "bf16" else -1]
    assert r.loop[mine] and not r.loop[other], tag
    # The steady KV loop holds one wave's QK and PV MFMAs and the two barriers of the schedule; only the last kv
    # block masks scores, and it is peeled: the loop selects nothing (paged: see test_packed_code_object).
    assert r.loop["mfma"] == loop_mfmas(r.head_dim) and r.loop["s_barrier"] == 2, (tag, r.loop)
    assert r.loop["cndmask"] == 0 or r.kv == "paged" or loop_selects, (tag, r.loop)


@pytest.mark.parametrize("arch,mode,dtype,d", DENSE_CASES, ids=[f"{a}-{m}-{t}-{d}" for a, m, t, d in DENSE_CASES])
@pytest.mark.parametrize("mask", coreport.axis_values("mask"))
def test_code_object(arch, d, mode, dtype, mask):
    r = report(arch, mode, mask, "dense", d, dtype)
    tag = f"{r.name}: {r.notes}"
    check_common(r, tag)
    if mask != "none":
        # Blocks fully inside every row's window run the unmasked loop, instruction for instruction as
        # counted in the unmasked variant; the blocks a window cuts have their own loop with the selects
        # (16 per q tile: a lane's 16 scores of the tile).
        plain = report(arch, mode, "none", "dense", d, dtype).loop
        keys = ("mfma", "valu", "trans", "cndmask", "lds", "vmem", "s_barrier")
        assert {k: r.loop[k] for k in keys} == {k: plain[k] for k in keys}, (tag, r.loop, plain)
        m = r.masked_loop
        assert m["mfma"] == loop_mfmas(d) and m["s_barrier"] == 2 and m["cndmask"] >= 16 * DESIGN[d][0], (tag, m)


def _branch(addr, op, target):
    return (addr, op, str(((target - addr - 4) // 4) & 0xFFFF))


def test_kv_loop_is_the_natural_loop_not_a_layout_jump():
    # Entry jumps to a block placed last, which jumps back into straight-line code: a backward branch
    # that is no loop, and whose address range holds more MFMAs (the peeled ones) than the loop.
    insts = [_branch(0x00, "s_branch", 0x24), (0x04, "v_mfma_f32_16x16x16_bf16", "v[0:3]"),
             (0x08, "v_mfma_f32_16x16x16_bf16", "v[4:7]"), (0x0C, "v_exp_f32_e32", "v8, v8"),
             _branch(0x10, "s_cbranch_scc1", 0x08), (0x14, "v_mfma_f32_16x16x16_bf16", "v[0:3]"),
             (0x18, "v_mfma_f32_16x16x16_bf16", "v[0:3]"), (0x1C, "s_endpgm", ""), (0x20, "v_mov_b32_e32", "v1, 0"),
             (0x24, "v_mov_b32_e32", "v2, 0"), _branch(0x28, "s_branch", 0x04)]
    body = coreport.kv_loop(insts)
    assert [a for a, _, _ in body] == [0x08, 0x0C, 0x10]
    c = coreport.count(body)
    assert c["mfma"] == 1 and c["trans"] == 1 and c["cndmask"] == 0


def test_kv_loop_includes_a_second_latch_placed_after_the_loop():
    # The refill block sits past the first latch and jumps back one instruction before its target.
    insts = [(0x00, "s_nop", "0"), (0x04, "v_mfma_f32_16x16x16_bf16", "v[0:3]"), _branch(0x08, "s_cbranch_scc0", 0x14),
             _branch(0x0C, "s_cbranch_scc1", 0x04), (0x10, "s_endpgm", ""),
             (0x14, "buffer_load_dword", "v1, s[0:3], s4 offen lds"), _branch(0x18, "s_branch", 0x00)]
    body = coreport.kv_loop(insts)
    assert [a for a, _, _ in body] == [0x00, 0x04, 0x08, 0x0C, 0x14, 0x18]
    assert coreport.count(body)["lds_dma"] == 1


def test_kv_loops_counts_a_loop_with_two_latches_once():
    # gfx950's decode loop (clang-22): a second latch jumps to one instruction before the first latch's target. The
    # inner body is the same loop, not a second loop whose selects would mark it as the window's cut blocks.
    insts = [(0x00, "s_nop", "0"), (0x04, "v_mfma_f32_16x16x16_bf16", "v[0:3]"),
             (0x08, "v_cndmask_b32_e32", "v1, v2, v3, vcc"), _branch(0x0C, "s_cbranch_scc0", 0x04),
             _branch(0x10, "s_cbranch_scc1", 0x00), (0x14, "s_endpgm", "")]
    loops = coreport.kv_loops(insts)
    assert [[a for a, _, _ in b] for b in loops] == [[0x00, 0x04, 0x08, 0x0C, 0x10]]


# ---- packed sequences (varlen) and paged KV --------------------------------------------------------------

@pytest.mark.parametrize("arch,mode,dtype,kv,d", PACKED_CASES,
                         ids=[f"{a}-{m}-{t}-{kv}-{d}" for a, m, t, kv, d in PACKED_CASES])
@pytest.mark.parametrize("mask", coreport.axis_values("mask"))
def test_packed_code_object(arch, d, kv, mode, dtype, mask):
    """Real compiles of the packed variants: no scratch or VGPR spills, the dense occupancy, and the same MFMA loop.
    Varlen's loop is the dense loop instruction for instruction; paged adds only the page lookup of group B's K
    refill (scalar work, no VALU mask)."""
    r = report(arch, mode, mask, kv, d, dtype)
    tag = f"{r.name}: {r.notes}"
    check_common(r, tag)
    dense = report(arch, mode, mask, "dense", d, dtype).loop
    keys = ("mfma", "trans", "lds", "s_barrier")
    assert {k: r.loop[k] for k in keys} == {k: dense[k] for k in keys}, (tag, r.loop, dense)
    if kv == "varlen":
        assert all(r.loop[k] == dense[k] for k in ("valu", "cndmask", "vmem")), (tag, r.loop, dense)
    else:
        # The page lookup: one block-table load, and the division by page_size, whose reciprocal runs on
        # the VALU (gfx90a's compiler also keeps the resource selects there: 3 v_cndmask, ~25 VALU).
        assert r.loop["vmem"] <= dense["vmem"] + 1 and r.loop["cndmask"] <= 3, (tag, r.loop, dense)
        assert r.loop["valu"] <= dense["valu"] + 32, (tag, r.loop, dense)


# Quantized caches (kv_dtype): one variant per (arch, format), the tight ones (the 128 and 192 window variants sit at
# 256 VGPRs); every format, bucket, dtype, mask and kv form was compiled once on gfx942, gfx90a and gfx950 without a
# spill (docs/NOTES.md, "Quantized KV caches, step 2c").
QUANT = [("fp8_e4m3", "bf16", 128, "paged"), ("fp8_e4m3fnuz", "fp16", 192, "varlen"),
         ("fp4_e2m1", "fp16", 128, "paged")]


@pytest.mark.parametrize("kv_dtype,dtype,d,kv", QUANT, ids=[f"{q[0]}-{q[1]}-d{q[2]}-{q[3]}" for q in QUANT])
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_cache_code_object(arch, kv_dtype, dtype, d, kv):
    """The budgets of the variants in q's dtype (no scratch or spills, the bucket's LDS, 2 waves per SIMD), and the
    loop of a cache in q's dtype read as varlen: the cache's bytes are expanded by the V^T stage (V into V^T, K into
    the K workspace, read by the same DMA, paged or not), so the loop's MFMAs, LDS traffic, barriers and VALU are
    varlen's (the FP8 descale folded into the softmax scale; FP4's key factors replacing it per score) and its loads
    varlen's plus, for FP4, one 16-byte load of key factors per 16-key sub-tile."""
    r = coreport.report(arch, "rtne", "window", kv, d, dtype, kernel=coreport.KERNEL, kv_dtype=kv_dtype)
    tag = f"{r.name}: {r.notes} {r.loop}"
    check_common(r, tag)
    same = report(arch, "rtne", "window", "varlen", d, dtype).loop
    for k in ("mfma", "trans", "lds", "s_barrier", "cndmask"):
        assert r.loop[k] == same[k], (k, tag, same)
    # (gfx90a's hipRTC 5.2 places a few more values in VGPRs: 515 against 511 at FP8 d128)
    assert r.loop["valu"] <= same["valu"] + 8, (tag, same)
    assert r.loop["vmem"] == same["vmem"] + (4 if kv_dtype == "fp4_e2m1" else 0), (tag, same)


# ---- score modifications (the soft cap and ALiBi: the score_mod axis) ----------------------------------------------

def _build_score_mod(score_mod, arch, mode, mask="none", kv="dense", head_dim=128, dtype="bf16", kernel=coreport.KERNEL,
                     kv_dtype="same", op=coreport.OP, dropout=None):
    """coreport.build of the variant with the score_mod axis at score_mod (coreport builds plain ones), and the dropout
    axis at dropout when given; an axis neither names takes its first value (plain, off)."""
    from rtcattn.runtime import dispatch, manifest
    m = manifest.load()
    spec = m.op(op)
    call = {"round_mode": mode, "mask": mask, "kv": kv, "head_dim": head_dim, "dtype": dtype, "kv_dtype": kv_dtype,
            "score_mod": score_mod, **({"dropout": dropout} if dropout else {})}
    full = {a.name: call[a.name] if a.name in call else spec.axis_values(a.name)[0] for a in spec.axes}
    return dispatch.build(m.variant_for(op, kernel, arch, full))


@functools.cache
def score_mod_report(score_mod, arch, mode, mask, kv, d, dtype, kernel=coreport.KERNEL, kv_dtype="same"):
    """coreport.report of a score_mod variant (shared with test_gfx942_decode_isa.py)."""
    with mock.patch.object(coreport, "build", functools.partial(_build_score_mod, score_mod)):
        return coreport.report(arch, mode, mask, kv, d, dtype, kernel=kernel, kv_dtype=kv_dtype)


# (score_mod, mask, kv, head dim, dtype, kv_dtype): both modifications at 64 and at the tight buckets (the 128 and 192
# window variants sit near 256 VGPRs), each alone, and a quantized cache of each kind; rtne, every arch.
SCORE_MODS = [("softcap_alibi", "none", "dense", 64, "bf16", "same"),
              ("softcap_alibi", "window", "paged", 128, "bf16", "same"),
              ("softcap_alibi", "window", "varlen", 192, "fp16", "same"),
              ("softcap", "window", "dense", 128, "bf16", "same"),
              ("alibi", "window", "paged", 192, "bf16", "same"),
              ("softcap_alibi", "window", "paged", 128, "bf16", "fp4_e2m1"),
              ("softcap_alibi", "window", "varlen", 192, "fp16", "fp8_e4m3fnuz")]


@pytest.fixture(scope="module")
def score_mod_builds():
    """The sample's variants, compiled two at a time into the cache the reports read (as prebuilt; the reports
    themselves one at a time: score_mod_report patches a module global)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda v: _build_score_mod(v[1][0], v[0], "rtne", *v[1][1:5], kv_dtype=v[1][5]),
                      [(a, s) for s in SCORE_MODS for a in ARCHS]))


@pytest.mark.parametrize("score_mod,mask,kv,d,dtype,kv_dtype", SCORE_MODS,
                         ids=["-".join(map(str, s)) for s in SCORE_MODS])
@pytest.mark.parametrize("arch", ARCHS)
def test_score_mod_code_object(arch, score_mod, mask, kv, d, dtype, kv_dtype, score_mod_builds):
    """The plain variants' budgets (check_common: no scratch or VGPR spills, the bucket's LDS, 2 waves per SIMD, the
    loop's MFMAs and barriers), and the plain variant's loop but for the modifications' arithmetic: its MFMAs, LDS
    traffic, loads, barriers and selects; the soft cap's exp2 and reciprocal on the transcendental unit, 2 a score (32
    per q tile and block), and at most 6 more VALU ops a score per modification (ALiBi's distance in 32 bits: no 64-bit
    conversion)."""
    r = score_mod_report(score_mod, arch, "rtne", mask, kv, d, dtype, kv_dtype=kv_dtype)
    tag = f"{r.name} {score_mod}: {r.notes} {r.loop}"
    check_common(r, tag)
    plain = (report(arch, "rtne", mask, kv, d, dtype) if kv_dtype == "same" else
             coreport.report(arch, "rtne", mask, kv, d, dtype, kv_dtype=kv_dtype)).loop
    for k in ("mfma", "lds", "vmem", "s_barrier", "cndmask"):
        assert r.loop[k] == plain[k], (k, tag, plain)
    tiles, cap, alibi = DESIGN[d][0], "softcap" in score_mod, "alibi" in score_mod
    assert r.loop["trans"] == plain["trans"] + 32 * tiles * cap, (tag, plain)
    assert r.loop["valu"] <= plain["valu"] + 16 * tiles * 6 * (cap + alibi) + 16, (tag, plain)


# ---- dropout (the dropout axis) --------------------------------------------------------------------------------------

# (mask, kv, head dim, dtype): the tightest ones, rtne, plain scores, every arch: the 128 paged window variant (256
# VGPRs in its plain form) and 192 (two q tiles: the draws inside the softmax, gfx942/mainloop.h's kDrawTileFirst);
# the 64 paged window variant (at the SGPR budget) was checked once (docs/NOTES.md).
DROPOUTS = [("window", "paged", 128, "bf16"), ("window", "varlen", 192, "fp16")]


@functools.cache
def dropout_report(arch, mask, kv, d, dtype):
    with mock.patch.object(coreport, "build", functools.partial(_build_score_mod, "plain", dropout="dropout")):
        return coreport.report(arch, "rtne", mask, kv, d, dtype)


@pytest.fixture(scope="module")
def dropout_builds():
    """The sample's variants, compiled two at a time into the cache the reports read (as score_mod_builds)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda v: _build_score_mod("plain", v[0], "rtne", *v[1], dropout="dropout"),
                      [(a, s) for s in DROPOUTS for a in ARCHS]))


def _inner_loops(body):
    """The loops inside a KV loop body: its back edges (branches to an earlier address) whose span holds no MFMA (the
    KV loop's own latches span its MFMAs, wherever the compiler placed its header)."""
    mfmas = [a for a, op, _ in body if op.startswith("v_mfma")]
    return sum(1 for a, op, args in body if (t := coreport._branch_target(a, op, args)) is not None and t <= a
               and not any(t <= m <= a for m in mfmas))


@pytest.mark.parametrize("mask,kv,d,dtype", DROPOUTS, ids=["-".join(map(str, s)) for s in DROPOUTS])
@pytest.mark.parametrize("arch", ARCHS)
def test_dropout_code_object(arch, mask, kv, d, dtype, dropout_builds):
    """The plain variants' budgets (check_common: no scratch or VGPR spills, the bucket's LDS, 2 waves per SIMD, the
    loop's MFMAs and barriers; the keep bits' selects allowed), and the draws: per 64-key block each lane makes two
    Philox4x32-10 calls per 16-key sub-tile of each q tile (gfx942/softmax.h, TileDropout), and the compilers keep
    each call's ten rounds a loop: the steady loop holds 8 x tiles inner loops, no more calls and none hoisted out."""
    r = dropout_report(arch, mask, kv, d, dtype)
    tag = f"{r.name} dropout: {r.notes} {r.loop}"
    check_common(r, tag, loop_selects=True)
    assert _inner_loops(r.loop_body) == 2 * 4 * DESIGN[d][0], tag
