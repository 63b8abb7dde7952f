"""Code-object checks of the gfx942 decode kernel, per head-dim bucket, on gfx942 (clang 19), gfx90a (hipRTC 5.2, or
clang) and gfx950 (clang 22), every variant (the three bf16 modes and fp16, both masks, every kv form; gfx950: rtne):
no scratch and no VGPR spills, the design's LDS (one 16-key V^T tile per wave), one wave per workgroup, the element
type's MFMA, and the KV loop's MFMAs, loads and (no) barriers; a sample of the score modifications' variants (the soft
cap, ALiBi; the native FP4 path's too) against the same budgets and their plain variants' loops. The VGPR, AGPR and
LDS figures are in docs/NOTES.md ("gfx942 decode kernel")."""
import functools
import itertools
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_gfx942_isa import _build_score_mod, score_mod_report

from rtcattn.runtime import manifest
from rtcattn.tools import coreport

KERNEL = "gfx942_decode"
ARCHS = [a for a, tool in (("gfx942", "clang++-19"), ("gfx90a", "clang++-19"), ("gfx950", "clang++-22"))
         if shutil.which(tool)]
BUCKETS = coreport.buckets(KERNEL)
MODES = [(m, "bf16") for m in coreport.axis_values("round_mode")] + [("rtne", "fp16")]
# gfx90a and gfx950 on the warm default's round mode only (bf16 and fp16): rtna / rtz change a few VALU ops of the
# conversion in the same source, which gfx942 checks in every variant; every bucket, dtype, mask and kv form stays on
# every arch (CI's time: docs/NOTES.md).
ARCH_MODES = [(a, m, t) for a in ARCHS for m, t in MODES if a == "gfx942" or m == "rtne"]
# gfx942's rtna / rtz and the other archs' fp16 on the dense form: they change the conversion ops (fp16 the MFMA too)
# the same way in every kv form, which the dense variants check at every bucket and mask; the packed forms (addressing
# alone) on rtne bf16 on every arch and fp16 on gfx942 (CI's time).
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
    return (arch, mode, dtype) in ARCH_MODES and (kv == "dense" or (mode == "rtne" and (dtype == "bf16" or
                                                                                        arch == "gfx942")))


CHECKED = [(a, m, t, kv, d) for a, m, t in ARCH_MODES for kv in coreport.axis_values("kv") for d in BUCKETS
           if _checked(a, m, kv, t, d)]
# The design (op_sources/attention_fwd/gfx942_decode/params.h, mainloop.h): 16-key sub-tiles per KV step, and the V^T
# tile's row pitch (16 keys + 4) in elements.
SUBS = {64: 4, 96: 2, 128: 2, 192: 2, 256: 1}
VT_PITCH = 20
# Steps in flight per arch, cache format and bucket (params.h decode_ahead): the KV loop holds that many steps.
def ahead(kv_dtype: str, d: int, arch: str) -> int:
    return (3 if d <= 192 or arch != "gfx90a" else 2) if kv_dtype.startswith("fp4") else 1


def waits_for_every_load(r):
    """The KV loop's s_waitcnt vmcnt(0): a wait for every load in flight (params.h decode_no_row says what keeps clang
    from them). hipRTC 5.2's older waitcnt pass (gfx90a) still puts one in most loops; the clang builds have none."""
    return [a for a, op, args in r.loop_body if op == "s_waitcnt" and "vmcnt(0)" in args] if r.arch != "gfx90a" else []


@pytest.fixture(scope="module", autouse=True)
def prebuilt():
    """Every variant, compiled up front two at a time (the archs interleaved) into the user cache."""
    from rtcattn.runtime import dispatch, manifest
    m = manifest.load()
    by_arch = [[m.variant_for(coreport.OP, KERNEL, a, {"round_mode": mode, "mask": mask, "kv": kv, "head_dim": d,
                                                       "dtype": dtype, "kv_dtype": "same", "score_mod": "plain",
                                                       "dropout": "nodrop"})
                for mode, mask, kv, d, dtype in coreport.variants("all", None, "all", KERNEL)
                if _checked(a, mode, kv, dtype, d)] for a in ARCHS]
    order = [v for group in itertools.zip_longest(*by_arch) for v in group if v is not None]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(dispatch.build, order))


def built_waves(arch, d, kv_dtype):
    """Waves per SIMD the kernel asks for (params.h decode_min_waves), restated: 2 up to 128 (3 on gfx950), above it 2
    for FP4 and 1 otherwise."""
    return (3 if arch == "gfx950" else 2) if d <= 128 else 2 if kv_dtype.startswith("fp4") else 1


@functools.cache
def report(arch, mode, mask, kv, d, dtype):
    return coreport.report(arch, mode, mask, kv, d, dtype, kernel=KERNEL)


def test_the_design_table_covers_the_buckets():
    assert sorted(SUBS) == BUCKETS


@pytest.mark.parametrize("arch,mode,dtype,kv,d", CHECKED, ids=[f"{a}-{m}-{t}-{kv}-{d}" for a, m, t, kv, d in CHECKED])
@pytest.mark.parametrize("mask", coreport.axis_values("mask"))
def test_code_object(arch, d, kv, mode, dtype, mask):
    r = report(arch, mode, mask, kv, d, dtype)
    n, tag = r.notes, f"{r.name}: {r.notes} {r.loop}"
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    assert n["group_segment_fixed_size"] == d * VT_PITCH * 2 <= manifest.load().machine(arch).lds_per_cu, tag
    assert n["max_flat_workgroup_size"] == 64, tag
    # Occupancy: at least the waves the kernel asks for (the planner's picture): 2 per SIMD up to 128 (8 one-wave
    # workgroups per CU; 3 on gfx950), 1 above.
    assert r.waves_per_simd >= built_waves(arch, d, "same"), tag
    mine, other = ("has_mfma16_bf16", "has_mfma16_f16")[::1 if dtype == "bf16" else -1]
    assert r.loop[mine] and not r.loop[other], tag
    # One KV step of one wave: S^T (sub-tiles x d/16 k-steps) and as many PV MFMAs; K and V of each sub-tile in
    # d/32 buffer_load_dwordx4 per lane each; no barrier (the LDS tile is the wave's own).
    assert r.loop["mfma"] == 2 * SUBS[d] * d // 16 and r.loop["s_barrier"] == 0, tag
    assert r.loop["vmem16"] == 2 * SUBS[d] * d // 32, tag
    # Paged: one block-table read per sub-tile for K and V together, by s_load (its wait is not the data loads').
    assert r.loop["vmem"] == r.loop["vmem16"], tag
    assert sum(op.startswith("s_load") for _, op, _ in r.loop_body) == (SUBS[d] if kv == "paged" else 0), tag
    assert not waits_for_every_load(r), tag


# Quantized caches (kv_dtype): a few variants per arch spread over the formats, dtypes, buckets, masks and kv forms.
# FP4 at 256 both ways: where a broadcast factor's register pair once held a scale byte's load (a wait for every load,
# softmax.h / kv_cache.h).
QUANT = [("fp8_e4m3", "bf16", 128, "paged", "window"), ("fp8_e4m3fnuz", "fp16", 256, "varlen", "none"),
         ("fp4_e2m1", "bf16", 64, "paged", "none"), ("fp4_e2m1", "fp16", 192, "paged", "window"),
         ("fp4_e2m1", "bf16", 256, "paged", "none"), ("fp4_e2m1", "fp16", 256, "paged", "window")]


@functools.cache
def quant_report(arch, kv_dtype, dtype, d, kv, mask):
    return coreport.report(arch, "rtne", mask, kv, d, dtype, kernel=KERNEL, kv_dtype=kv_dtype)


@pytest.mark.parametrize("kv_dtype,dtype,d,kv,mask", QUANT, ids=[f"{q[0]}-{q[1]}-d{q[2]}-{q[3]}" for q in QUANT])
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_cache_code_object(arch, kv_dtype, dtype, d, kv, mask):
    """The prefill budgets the bf16 variants meet (no scratch or spills, the one V^T tile of LDS, one wave a
    workgroup, the same occupancy), the element type's MFMAs as many as bf16's; the loads carry the cache's bytes:
    per sub-tile of K and of V a lane loads its share of a row in the cache's bytes (d/4 columns: d/4 bytes FP8, d/8
    FP4, where bf16 loads d/2) in d/32 loads of 8 bytes (FP8) or 4 bytes (FP4: unpredicated, clang merges them into
    wider ones, so at most d/32), and FP4's scale byte per sub-tile of each; paged, one block-table read per sub-tile
    for K and V together, by s_load (its wait is not the data loads'). The loop holds ahead() steps."""
    r = quant_report(arch, kv_dtype, dtype, d, kv, mask)
    n, tag = r.notes, f"{r.name}: {r.notes} {r.loop}"
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    assert n["group_segment_fixed_size"] == d * VT_PITCH * 2 <= manifest.load().machine(arch).lds_per_cu, tag
    assert n["max_flat_workgroup_size"] == 64, tag
    # 2 waves per SIMD up to 128 (3 on gfx950) and FP4 at every bucket (params.h decode_min_waves), 1 above 128 for
    # FP8; as many as the V^T tile's LDS lets a CU hold (gfx942 / gfx90a at 256: 6 workgroups a CU, 1.5 a SIMD)
    lds_waves = manifest.load().machine(arch).lds_per_cu // (d * VT_PITCH * 2) // 4
    assert r.waves_per_simd >= min(built_waves(arch, d, kv_dtype), lds_waves), tag
    mine, other = ("has_mfma16_bf16", "has_mfma16_f16")[::1 if dtype == "bf16" else -1]
    assert r.loop[mine] and not r.loop[other], tag
    subs = SUBS[d] * ahead(kv_dtype, d, arch)  # sub-tiles of the loop's steps
    assert r.loop["mfma"] == 2 * subs * d // 16 and r.loop["s_barrier"] == 0, tag
    fp4, paged = kv_dtype == "fp4_e2m1", kv == "paged"
    row_share = d // 4 // (2 if fp4 else 1)
    assert r.loop["load_bytes"] == 2 * subs * (row_share + fp4), tag
    per_sub = d // 32 + fp4
    assert r.loop["vmem"] == 2 * subs * per_sub if not fp4 else r.loop["vmem"] <= 2 * subs * per_sub, tag
    assert sum(op.startswith("s_load") for _, op, _ in r.loop_body) == (subs if paged else 0), tag
    assert not waits_for_every_load(r), tag
    assert r.loop["vmem16"] == 0 or fp4, tag
    # FP8's NaN fix-ups are rare blocks (coreport.rare_blocks), out of the counts above; FP4 has none, nor the FP8
    # format an arch converts itself (FNUZ on gfx942, E4M3 on gfx950: v_cvt_pk_f32_fp8 makes the NaN codes NaNs, no
    # test, no fix-up), which the other archs place.
    converted = (kv_dtype, arch) in (("fp8_e4m3fnuz", "gfx942"), ("fp8_e4m3", "gfx950"))
    assert (r.loop["rare"] > 0) == (kv_dtype.startswith("fp8") and not converted), tag
    assert (r.loop["cvt_fp8"] > 0) == converted, tag
    # gfx950 expands FP4 by its scaled converts, one a byte: d / 8 per lane per sub-tile of K and of V; the others
    # by tables (kv_cache.h).
    cvt = sum(op == f"v_cvt_scalef32_pk_{dtype.replace('fp16', 'f16')}_fp4" for _, op, _ in r.loop_body)
    assert cvt == (2 * subs * d // 8 if fp4 and arch == "gfx950" else 0), (cvt, tag)


# The native FP4 path (kv_dtype fp4_e2m1_native: the manifest's gfx950_decode entry, this kernel's source), gfx950 only.
# Every bucket once, the dtypes and masks alternating (one clang-22 build each: CI time).
NATIVE = [(d, *(("bf16", "paged", "window"), ("fp16", "paged", "none"))[i % 2]) for i, d in enumerate(BUCKETS)]


@pytest.mark.skipif("gfx950" not in ARCHS, reason="clang++-22 (gfx950) is not installed")
@pytest.mark.parametrize("d,dtype,kv,mask", NATIVE, ids=[f"d{n[0]}-{n[1]}-{n[3]}" for n in NATIVE])
def test_native_fp4_code_object(d, dtype, kv, mask):
    """gfx950's native FP4 path: the budgets of the other variants (no scratch or spills, the V^T tile's LDS, one wave
    a workgroup, the waves a SIMD the kernel asks for), and in the KV loop S^T by the scaled MFMA (one per
    sub-tile and 128 of the bucket's columns: a lane's 32 columns of its row an MFMA, kernel's kScaledMfmas) where
    the LUT path takes d / 16 element MFMAs per sub-tile; P V unchanged (the element type's MFMAs).
    The loop holds ahead() steps (FP4 read natively too)."""
    r = coreport.report("gfx950", "rtne", mask, kv, d, dtype, kernel="gfx950_decode", kv_dtype="fp4_e2m1_native")
    n, tag = r.notes, f"{r.name}: {r.notes} {r.loop}"
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    assert n["group_segment_fixed_size"] == d * VT_PITCH * 2 and n["max_flat_workgroup_size"] == 64, tag
    assert r.waves_per_simd >= built_waves("gfx950", d, "fp4_e2m1_native"), tag
    subs = SUBS[d] * ahead("fp4_e2m1_native", d, "gfx950")  # sub-tiles of the loop's steps
    scaled = subs * -(-d // 128)
    assert r.loop["mfma_scale"] == scaled and r.loop["mfma"] == scaled + subs * d // 16, tag
    mine, other = ("has_mfma16_bf16", "has_mfma16_f16")[::1 if dtype == "bf16" else -1]
    assert r.loop[mine] and not r.loop[other], tag


# Score modifications (the soft cap and ALiBi: the score_mod axis): (score_mod, mask, kv, head dim, dtype, kv_dtype),
# both at once at 64, 128 and 256, each alone, a quantized cache of each kind; rtne, every arch; and gfx950's native
# FP4 path (the gfx950_decode entry) at 128 and 256.
SCORE_MODS = [("softcap_alibi", "window", "paged", 128, "bf16", "same"),
              ("softcap_alibi", "none", "dense", 64, "fp16", "same"),
              ("softcap_alibi", "window", "varlen", 256, "bf16", "same"),
              ("alibi", "window", "paged", 192, "fp16", "fp4_e2m1"),
              ("softcap", "window", "varlen", 256, "bf16", "fp8_e4m3")]
NATIVE_SCORE_MODS = [("softcap_alibi", "window", "paged", 128, "bf16", "fp4_e2m1_native"),
                     ("softcap_alibi", "none", "varlen", 256, "fp16", "fp4_e2m1_native")]
SCORE_MOD_BUILDS = ([(KERNEL, a, s) for s in SCORE_MODS for a in ARCHS]
                    + [("gfx950_decode", "gfx950", s) for s in NATIVE_SCORE_MODS if "gfx950" in ARCHS])


@pytest.fixture(scope="module")
def score_mod_builds():
    """The sample's variants, compiled two at a time into the cache the reports read."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda v: _build_score_mod(v[2][0], v[1], "rtne", *v[2][1:5], kernel=v[0], kv_dtype=v[2][5]),
                      SCORE_MOD_BUILDS))


@pytest.mark.parametrize("kernel,arch,score_mod,mask,kv,d,dtype,kv_dtype", [(k, a, *s) for k, a, s in SCORE_MOD_BUILDS],
                         ids=[f"{a}-{'-'.join(map(str, s))}" for _, a, s in SCORE_MOD_BUILDS])
def test_score_mod_code_object(kernel, arch, score_mod, mask, kv, d, dtype, kv_dtype, score_mod_builds):
    """The plain variants' budgets (no scratch or VGPR spills, the V^T tile's LDS, one wave a workgroup, the same
    occupancy, no wait for every load in the loop), and the plain variant's loop but for the modifications' arithmetic:
    its MFMAs, loads, LDS traffic and barriers; the soft cap's exp2 and reciprocal on the transcendental unit, 2 a
    score (8 per 16-key sub-tile), and at most 6 more VALU ops a score per modification (ALiBi's distance in 32
    bits)."""
    r = score_mod_report(score_mod, arch, "rtne", mask, kv, d, dtype, kernel=kernel, kv_dtype=kv_dtype)
    n, tag = r.notes, f"{r.name} {score_mod}: {r.notes} {r.loop}"
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    assert n["group_segment_fixed_size"] == d * VT_PITCH * 2 and n["max_flat_workgroup_size"] == 64, tag
    assert r.waves_per_simd >= built_waves(arch, d, kv_dtype), tag
    assert not waits_for_every_load(r), tag
    plain = coreport.report(arch, "rtne", mask, kv, d, dtype, kernel=kernel, kv_dtype=kv_dtype).loop
    for k in ("mfma", "mfma_scale", "vmem", "load_bytes", "lds", "s_barrier"):
        assert r.loop[k] == plain[k], (k, tag, plain)
    steps = ahead(kv_dtype, d, arch)
    scores = 4 * SUBS[d] * steps  # a lane's scores a loop iteration
    cap, alibi = "softcap" in score_mod, "alibi" in score_mod
    assert r.loop["trans"] == plain["trans"] + 2 * scores * cap, (tag, plain)
    assert r.loop["valu"] <= plain["valu"] + 6 * scores * (cap + alibi) + 16 + 4 * (steps - 1), (tag, plain)
