"""configs/ops.json: schema errors, variant enumeration, build requests, kernel selection, package paths and the
head-dim bounds against each kernel's own text."""
import copy
import json
import re
from pathlib import Path

import pytest

from rtcattn.runtime import dispatch, manifest, paths

ROOT = Path(__file__).resolve().parents[2]
REAL = json.loads((ROOT / "configs" / "ops.json").read_text())


def write(tmp_path, data, text=None):
    (tmp_path / "configs").mkdir(exist_ok=True)
    p = tmp_path / "configs" / "ops.json"
    p.write_text(text if text is not None else json.dumps(data))
    return p


def edited(edit):
    data = copy.deepcopy(REAL)
    edit(data)
    return data


def op(data):
    return data["ops"]["attention_fwd"]


def kern(data):
    """The baseline's entry (fast kernels come before it in the manifest's order of preference)."""
    return next(k for k in op(data)["kernels"] if k["name"] == "baseline")


def axis(data, name):
    return next(a for a in op(data)["axes"] if a["name"] == name)


BASE = [k["name"] for k in op(REAL)["kernels"]].index("baseline")
NKERN = len(op(REAL)["kernels"])
HD = f"kernels[{BASE}].axes.head_dim"


BAD = [
    ("schema", lambda d: d.update(schema=1), "schema", "1", "2"),
    ("no kernels", lambda d: op(d).pop("kernels"), "ops.attention_fwd.kernels", "null", "present"),
    ("unknown arch", lambda d: kern(d)["archs"].append("gfx1100"), f"kernels[{BASE}].archs[6]", '"gfx1100"', "gfx942"),
    ("bad compiler", lambda d: d["archs"]["gfx942"].update(compiler=["gcc"]), "archs.gfx942.compiler[0]", '"gcc"',
     "hiprtc"),
    ("value not int", lambda d: axis(d, "round_mode")["values"].update(rtz="2"), "axes[0].values.rtz", '"2"',
     "mapped to integers"),
    ("axis define", lambda d: axis(d, "mask").update(define="RTC MASK"), "axes[1].define", '"RTC MASK"',
     "C identifier"),
    ("duplicate axis", lambda d: op(d)["axes"].append(copy.deepcopy(axis(d, "round_mode"))),
     f"axes[{len(op(REAL)['axes'])}].name", '"round_mode"', "not used by another axis"),
    ("head dims", lambda d: kern(d)["axes"]["head_dim"].update(min=300), HD, "300", "min <= max"),
    ("bucket too small", lambda d: kern(d)["axes"]["head_dim"].update(buckets=[64, 128]), f"{HD}.buckets",
     "[64, 128]", ">= max"),
    ("bucket spec missing", lambda d: kern(d)["axes"].pop("head_dim"), HD, "null", "required for a bucketed axis"),
    ("unknown axis", lambda d: kern(d)["axes"].update(seqlen=[1]), f"kernels[{BASE}].axes.seqlen", "[1]",
     "an axis of the op"),
    ("axis value", lambda d: kern(d)["axes"].update(round_mode=["rne"]), f"kernels[{BASE}].axes.round_mode[0]",
     '"rne"', "rtne"),
    ("symbol", lambda d: kern(d).update(symbol="not a symbol"), f"kernels[{BASE}].symbol", '"not a symbol"',
     "C identifier"),
    ("source path", lambda d: kern(d).update(source="../evil.hip"), f"kernels[{BASE}].source", "../evil.hip",
     "inside op_sources"),
    ("source missing", lambda d: kern(d).update(source="nope.hip"), f"kernels[{BASE}].source", "nope.hip",
     "a file that exists"),
    ("duplicate", lambda d: op(d)["kernels"].append(copy.deepcopy(kern(d))), f"kernels[{NKERN}].name", "baseline",
     "not used by another"),
    ("type", lambda d: kern(d)["axes"]["head_dim"].update(buckets="64"), f"{HD}.buckets", '"64"', "list of integers"),
    ("exclude type", lambda d: op(d).update(exclude={"dtype": ["fp16"]}), "ops.attention_fwd.exclude",
     '{"dtype": ["fp16"]}', "a list of objects"),
    ("exclude one axis", lambda d: op(d).update(exclude=[{"dtype": ["fp16"]}]), "ops.attention_fwd.exclude[0]",
     '{"dtype": ["fp16"]}', "two or more enumerated axes"),
    ("exclude not an object", lambda d: op(d).update(exclude=[["dtype", "fp16"]]), "ops.attention_fwd.exclude[0]",
     '["dtype", "fp16"]', "two or more enumerated axes"),
    ("exclude unknown axis", lambda d: op(d)["exclude"][0].update(flavor=["x"]), "exclude[0].flavor", '["x"]',
     "an enumerated axis of the op (round_mode, mask, kv, dtype, kv_dtype, score_mod, dropout)"),
    ("exclude bucketed axis", lambda d: op(d)["exclude"][0].update(head_dim=[64]), "exclude[0].head_dim", "[64]",
     "an enumerated axis of the op"),
    ("exclude value", lambda d: op(d)["exclude"][0].update(round_mode=["rtn"]), "exclude[0].round_mode[0]",
     '"rtn"', "one of rtne, rtna, rtz"),
    ("exclude no values", lambda d: op(d)["exclude"][0].update(round_mode=[]), "exclude[0].round_mode", "[]",
     "a non-empty list"),
    ("exclude values not a list", lambda d: op(d)["exclude"][0].update(dtype="fp16"), "exclude[0].dtype",
     '"fp16"', "a list of strings"),
    ("warm_default type", lambda d: op(d).update(warm_default=["rtne"]), "ops.attention_fwd.warm_default",
     '["rtne"]', "an object with keys axes, exclude, first_choice_only, why"),
    ("warm_default key", lambda d: op(d)["warm_default"].update(round_mode=["rtne"]), "warm_default.round_mode",
     '["rtne"]', "one of the keys axes, exclude, first_choice_only, why"),
    ("warm_default axes type", lambda d: op(d)["warm_default"].update(axes=["round_mode"]), "warm_default.axes",
     '["round_mode"]', "an object {enumerated axis name"),
    ("warm_default unknown axis", lambda d: op(d)["warm_default"]["axes"].update(flavor=["x"]),
     "warm_default.axes.flavor", '["x"]', "an enumerated axis of the op (round_mode, mask, kv, dtype"),
    ("warm_default bucketed axis", lambda d: op(d)["warm_default"]["axes"].update(head_dim=[128]),
     "warm_default.axes.head_dim", "[128]", "every bucket of a bucketed axis is in the default set"),
    ("warm_default value", lambda d: op(d)["warm_default"]["axes"].update(round_mode=["rne"]),
     "warm_default.axes.round_mode[0]", '"rne"', "one of rtne, rtna, rtz"),
    ("warm_default no values", lambda d: op(d)["warm_default"]["axes"].update(mask=[]), "warm_default.axes.mask",
     "[]", "a non-empty list"),
    ("warm_default flag", lambda d: op(d)["warm_default"].update(first_choice_only="yes"),
     "warm_default.first_choice_only", '"yes"', "true or false"),
    ("warm_default why", lambda d: op(d)["warm_default"].update(why=3), "warm_default.why", "3", "a string"),
    ("warm_default exclude one axis", lambda d: op(d)["warm_default"].update(exclude=[{"mask": ["none"]}]),
     "warm_default.exclude[0]", '{"mask": ["none"]}', "two or more enumerated axes"),
    ("warm_default exclude value", lambda d: op(d)["warm_default"]["exclude"][0].update(kv=["packed"]),
     "warm_default.exclude[0].kv[0]", '"packed"', "one of dense, varlen, paged"),
    ("machine type", lambda d: d["archs"]["gfx942"].update(machine="MI300X"), "archs.gfx942.machine", '"MI300X"',
     "an object with keys part, cus, hbm_gbps, lds_per_cu, clock_mhz"),
    ("machine missing key", lambda d: d["archs"]["gfx942"]["machine"].pop("hbm_gbps"), "archs.gfx942.machine.hbm_gbps",
     "null", "a positive number (peak HBM bandwidth, GB/s)"),
    ("machine bad value", lambda d: d["archs"]["gfx950"]["machine"].update(lds_per_cu=0),
     "archs.gfx950.machine.lds_per_cu", "0", "a positive integer (LDS bytes per CU)"),
    ("machine unknown key", lambda d: d["archs"]["gfx950"]["machine"].update(vram_gb=288),
     "archs.gfx950.machine.vram_gb", "288", "one of the keys part, cus, hbm_gbps"),
    ("machine on an emulated arch", lambda d: d["archs"]["gfx942-emu"].update(machine=d["archs"]["gfx942"]["machine"]),
     "archs.gfx942-emu.machine", "MI300X", "no machine: an emulated arch takes its arch's"),
]


@pytest.mark.parametrize("name,edit,key,value,accepted", BAD, ids=[b[0] for b in BAD])
def test_schema_errors_name_file_key_value_and_accepted(tmp_path, name, edit, key, value, accepted):
    p = write(tmp_path, edited(edit))
    with pytest.raises(manifest.ManifestError) as info:
        manifest.load(p, root=ROOT)
    msg = str(info.value)
    assert str(p) in msg and key in msg and value in msg and accepted in msg, msg


def test_not_json_and_not_evaluated(tmp_path):
    p = write(tmp_path, None, text='{"schema": 2, "ops": __import__("os")}')
    with pytest.raises(manifest.ManifestError, match="valid JSON"):
        manifest.load(p)
    p = write(tmp_path, None, text='["schema", 2]')
    with pytest.raises(manifest.ManifestError, match="a JSON object"):
        manifest.load(p)


def _variant(m, kernel, arch, mode, head_dim):
    return m.variant_for("attention_fwd", kernel, arch, {"round_mode": mode, "mask": "none", "kv": "dense",
                                                         "head_dim": head_dim, "dtype": "bf16", "kv_dtype": "same",
                                                         "score_mod": "plain", "dropout": "nodrop"})


def test_variants_and_request():
    m = manifest.load()
    buckets = kern(REAL)["axes"]["head_dim"]["buckets"]
    variants = list(m.variants("attention_fwd", archs=["gfx942"], kernels=["baseline"], dtype=["bf16"]))
    # modes x masks x (3 kv forms with the cache in q's dtype + 2 packed forms x 3 quantized caches) x buckets x
    # score modifications (plain, softcap, alibi, both) x dropout (off, on)
    assert len(variants) == 3 * 2 * (3 + 2 * 3) * len(buckets) * 4 * 2
    assert not [v for v in variants if v["kv"] == "dense" and v["kv_dtype"] != "same"]  # exclude[1]
    v = _variant(m, "baseline", "gfx942", "rtna", 128)
    assert v.name == "baseline-rtna-none-dense-d128-bf16-same-plain-nodrop"
    assert v["round_mode"] == "rtna" and v["head_dim"] == 128
    req = m.request(v, "9.9")
    assert req.variant == "baseline-rtna-none-dense-d128-bf16-same-plain-nodrop"
    assert req.arch == "gfx942" and req.package_version == "9.9"
    assert req.options[:5] == ("-DRTC_ROUND=1", "-DRTC_MASK=0", "-DRTC_KV=0", "-DRTC_HEAD_DIM_MAX=128",
                               "-DRTC_DTYPE=0")
    assert "-O3" in req.options and req.compilers == ("hiprtc", "clang")
    names = [n for n, _ in req.headers]
    assert {"platform.h", "attn_params.h", "bf16_round.h"} <= set(names)
    assert not any(n.startswith("emu/") for n in names)
    assert req.main[0] == "baseline.hip" and "attention_fwd_baseline" in req.main[1]
    emu = m.request(_variant(m, "baseline", "gfx942-emu", "rtz", 64), "9.9")
    assert emu.options[:4] == ("-DRTC_ROUND=2", "-DRTC_MASK=0", "-DRTC_KV=0", "-DRTC_HEAD_DIM_MAX=64")
    emu_names = [n for n, _ in emu.headers]
    assert any(n.startswith("emu/") for n in emu_names) and emu.compilers == ("host",)
    assert m.request(v, "9.9", ("-DLAB=1",)).options[-1] == "-DLAB=1"


def test_buckets():
    spec = manifest.load().op("attention_fwd").kernel("baseline").axes["head_dim"]
    assert [spec.bucket_for(d) for d in (8, 32, 40, 64, 72, 96, 128, 136, 200, 256)] == [32, 32, 64, 64, 96, 96, 128,
                                                                                        192, 256, 256]
    assert spec.accepts(72) and spec.accepts(8) and not spec.accepts(68) and not spec.accepts(264)
    assert not spec.accepts(0) and not spec.accepts(4)
    m = manifest.load()
    assert _variant(m, "baseline", "gfx942", "rtne", 72)["head_dim"] == 96


def _call(mode, head_dim, mask="none"):
    return {"round_mode": mode, "mask": mask, "kv": "dense", "head_dim": head_dim, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}


def test_select_prefers_listed_fast_kernel_and_falls_back(tmp_path):
    fast = dict(copy.deepcopy(kern(REAL)), name="fast", archs=["gfx942"],
                axes={"head_dim": {"min": 128, "max": 128, "step": 8, "buckets": [128]}, "round_mode": ["rtne"]})

    def only_fast_and_baseline(d):  # the mechanism under test, without the real fast kernels
        ks = op(d)["kernels"]
        ks[:] = [fast] + [k for k in ks if k["name"] == "baseline"]
    m = manifest.load(write(tmp_path, edited(only_fast_and_baseline)), root=ROOT)
    sel = dispatch.select("attention_fwd", "gfx942", _call("rtne", 128), m=m)
    assert sel.kernel.name == "fast" and sel.why == "first match"
    assert sel.variant.name == "fast-rtne-none-dense-d128-bf16-same-plain-nodrop"
    sel = dispatch.select("attention_fwd", "gfx942", _call("rtne", 64), m=m)
    assert sel.kernel.name == "baseline" and "fast" in sel.why and "head_dim 64" in sel.why
    sel = dispatch.select("attention_fwd", "gfx942", _call("rtz", 128), m=m)
    assert sel.kernel.name == "baseline" and "round_mode 'rtz' not in ['rtne']" in sel.why
    sel = dispatch.select("attention_fwd", "gfx90a", _call("rtz", 128), m=m)
    assert sel.kernel.name == "baseline" and "arch gfx90a" in sel.why
    # rtne only; kv_dtype, score_mod and dropout not listed: every value (the quantized ones with the packed kv forms
    # only)
    assert len(list(m.variants("attention_fwd", kernels=["fast"], dtype=["bf16"]))) == 1 * 2 * (3 + 2 * 4) * 1 * 4 * 2
    with pytest.raises(ValueError, match="no kernel"):
        dispatch.select("attention_fwd", "gfx1100", _call("rtne", 128), m=m)
    with pytest.raises(ValueError, match="RTCATTN_KERNEL='nope' is not accepted.*fast, baseline"):
        dispatch.select("attention_fwd", "gfx942", _call("rtne", 128), kernel="nope", m=m)


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a", "sm_90a", "gfx942-emu"])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e4m3fnuz", "fp4_e2m1"])
def test_quantized_caches_go_to_the_kernels_that_list_them_by_name(arch, kv_dtype):
    """A quantized cache goes to the first kernel whose entry lists its kv_dtype: on the AMD archs the gfx942 decode
    kernel (its why_not sends calls of more than 16 query rows on, to the gfx942 prefill kernel, which lists every
    kv_dtype too: tests/emu/test_gfx942_kvquant_emu.py), on sm_90a the sm90 decode kernel for FP8 E4M3 and FP4 (the
    same, the rest to the baseline), elsewhere the baseline; every faster kernel passed over says why (its kv_dtype
    list), never a silent pick."""
    if arch in ("gfx942", "gfx90a", "gfx942-emu"):
        want = "gfx942_decode"
    else:
        want = "sm90_decode" if arch == "sm_90a" and kv_dtype != "fp8_e4m3fnuz" else "baseline"
    kernels = [k for k in manifest.load().op("attention_fwd").kernels if arch in k.archs]
    before = kernels[:[k.name for k in kernels].index(want)]  # sm_90a: sm90_decode and sm90
    assert want != "baseline" or len(before) == 2
    for kv in ("varlen", "paged"):
        call = dict(_call("rtne", 128), kv=kv, kv_dtype=kv_dtype)
        sel = dispatch.select("attention_fwd", arch, call)
        assert sel.kernel.name == want and sel.variant["kv_dtype"] == kv_dtype, sel
        assert want == "baseline" or kv_dtype in sel.kernel.axes["kv_dtype"]
        assert all(f"{k.name}: kv_dtype {kv_dtype!r} not in {list(k.axes['kv_dtype'])}" in sel.why
                   for k in before), sel.why
    with pytest.raises(ValueError, match=r"kv='dense', kv_dtype=.* is no variant.*exclude\[1\]"):
        dispatch.select("attention_fwd", arch, dict(_call("rtne", 128), kv_dtype=kv_dtype))


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a", "gfx950", "gfx942-emu"])
def test_the_prefill_kernel_takes_quantized_packed_caches(arch):
    """Pinned past the decode kernel, a quantized varlen or paged cache has a variant of the gfx942 prefill kernel on
    every arch it builds for, in every format; a dense quantized call is still no variant."""
    for kv_dtype in ("fp8_e4m3", "fp8_e4m3fnuz", "fp4_e2m1"):
        for kv in ("varlen", "paged"):
            call = dict(_call("rtne", 128), kv=kv, kv_dtype=kv_dtype)
            sel = dispatch.select("attention_fwd", arch, call, kernel="gfx942")
            assert sel.kernel.name == "gfx942" and sel.variant["kv_dtype"] == kv_dtype, sel
        with pytest.raises(ValueError, match=r"kv='dense', kv_dtype=.* is no variant.*exclude\[1\]"):
            dispatch.select("attention_fwd", arch, dict(_call("rtne", 128), kv_dtype=kv_dtype), kernel="gfx942")


# ---- the op's exclude list: fp16 has one rounding, so fp16 x rtna / rtz is no variant ----------------------------

def test_no_fp16_variant_rounds_other_than_rtne():
    """Nothing enumerates (so nothing compiles: warm, dispatch) an fp16 variant in rtna or rtz; fp16 rtne is there
    for every arch, bucket, mask and kv mode of each kernel that takes fp16, and bf16 keeps its three modes."""
    m = manifest.load()
    fp16 = [v for v in m.variants("attention_fwd") if v["dtype"] == "fp16"]
    assert fp16 and {v["round_mode"] for v in fp16} == {"rtne"}
    expected = 0
    for k in op(REAL)["kernels"]:
        axes = k.get("axes", {})
        if "fp16" in axes.get("dtype", ["bf16", "fp16"]):
            # (kv form, cache dtype) pairs: a dense call's cache is q's dtype (exclude[1])
            pairs = sum(1 for kv in axes.get("kv", ["dense", "varlen", "paged"])
                        for t in axes.get("kv_dtype", axis(REAL, "kv_dtype")["values"]) if kv != "dense" or t == "same")
            expected += (len(k["archs"]) * len(axes.get("mask", ["none", "window"])) * pairs
                         * len(axes["head_dim"]["buckets"]) * len(axes.get("score_mod", range(4)))
                         * len(axes.get("dropout", range(2))))
    assert len(fp16) == expected and "baseline" in {v.kernel for v in fp16}
    bf16 = [v for v in m.variants("attention_fwd", kernels=["baseline"]) if v["dtype"] == "bf16"]
    assert {v["round_mode"] for v in bf16} == {"rtne", "rtna", "rtz"}
    assert not list(m.variants("attention_fwd", dtype=["fp16"], round_mode=["rtna", "rtz"]))


def test_warm_enumerates_no_excluded_variant():
    from rtcattn.tools import cli
    args = cli.parser().parse_args(["warm", "--op", "attention_fwd", "--all", "--arch", "gfx942-emu",
                                    "--head-dim", "64", "--mask", "none", "--kv", "dense", "--score-mod", "plain",
                                    "--dropout", "nodrop"])
    names = sorted(v.name for v in cli._warm_variants(args))
    assert names == ["baseline-rtna-none-dense-d64-bf16-same-plain-nodrop",
                     "baseline-rtne-none-dense-d64-bf16-same-plain-nodrop",
                     "baseline-rtne-none-dense-d64-fp16-same-plain-nodrop",
                     "baseline-rtz-none-dense-d64-bf16-same-plain-nodrop",
                     "gfx942-rtna-none-dense-d64-bf16-same-plain-nodrop",
                     "gfx942-rtne-none-dense-d64-bf16-same-plain-nodrop",
                     "gfx942-rtne-none-dense-d64-fp16-same-plain-nodrop",
                     "gfx942-rtz-none-dense-d64-bf16-same-plain-nodrop",
                     "gfx942_decode-rtna-none-dense-d64-bf16-same-plain-nodrop",
                     "gfx942_decode-rtne-none-dense-d64-bf16-same-plain-nodrop",
                     "gfx942_decode-rtne-none-dense-d64-fp16-same-plain-nodrop",
                     "gfx942_decode-rtz-none-dense-d64-bf16-same-plain-nodrop"]
    only = cli.parser().parse_args(["warm", "--all", "--arch", "gfx942-emu", "--dtype", "fp16", "--round-mode",
                                    "rtna,rtz"])
    assert cli._warm_variants(only) == []


# ---- warm_default: what `warm` compiles without --all ---------------------------------------------------------------

def _defaults(m, arch) -> set:
    return {v.name for v in m.variants("attention_fwd", archs=[arch], default=True)}


def _every_call(m):
    """Every call's axis values the default set is for: each enumerated value warm_default keeps (and no exclude
    entry, the op's or warm_default's, leaves out), every head dim a kernel takes."""
    import itertools
    spec = m.op("attention_fwd")
    kept = dict(spec.warm_default.values)
    enumerated = [a for a in spec.axes if not a.buckets]
    dims = sorted({n for k in spec.kernels for a in spec.axes if a.buckets
                   for n in range(k.axes[a.name].lo, k.axes[a.name].hi + 1, k.axes[a.name].step)})
    for combo in itertools.product(*[[v for v in a.value_names() if v in kept.get(a.name, a.value_names())]
                                     for a in enumerated]):
        call = dict(zip((a.name for a in enumerated), combo))
        if spec.exclusion(call) is None and spec.warm_default.keeps(call):
            yield from (dict(call, head_dim=d) for d in dims)


def _fast_everywhere(d):
    """A manifest edit: the sm90 kernel takes every head dim (buckets 64..256) and both dtypes, as it is meant to."""
    sm90 = next(k for k in op(d)["kernels"] if k["name"] == "sm90")
    sm90["axes"].update(head_dim={"min": 8, "max": 256, "step": 8, "buckets": [64, 128, 192, 256]},
                        dtype=["bf16", "fp16"])


@pytest.mark.parametrize("edit", [None, _fast_everywhere], ids=["real", "sm90-every-head-dim"])
def test_default_set_is_what_dispatch_picks_first(tmp_path, edit):
    """On every arch: each call the default set is for runs on a variant of the default set (dispatch's pick,
    ignoring run-time declines on alignment or strides, and the pick when each kernel that declines whole classes of
    calls at run time, `declines_at_run_time`, declines), and each variant of the set is the pick of some call:
    nothing it holds is only a fallback."""
    m = manifest.load(write(tmp_path, edited(edit)), root=ROOT) if edit else manifest.load()
    declines = lambda k: k.declines_at_run_time or None  # noqa: E731
    for arch in m.archs("attention_fwd"):
        default = _defaults(m, arch)
        picked = {dispatch.select("attention_fwd", arch, call, m=m, supports=s).variant.name
                  for call in _every_call(m) for s in (None, declines)}
        assert picked == default, (arch, sorted(picked ^ default))


def test_default_set_keeps_rtne_and_drops_what_a_faster_kernel_serves(tmp_path):
    m = manifest.load()
    assert {v["round_mode"] for v in m.variants("attention_fwd", default=True)} == {"rtne"}
    sm90 = _defaults(m, "sm_90a")
    # sm90 and sm90_decode take every head dim and both dtypes: on sm_90a the default set is their rtne variants (the
    # decode kernel leaves longer calls to sm90 at run time, so both are first choices), no baseline; packed calls
    # masked only (warm_default's exclude).
    forms = (("none", "dense"), ("window", "dense"), ("window", "varlen"), ("window", "paged"))
    assert sm90 == {f"{k}-rtne-{mask}-{kv}-d{b}-{dt}-same-plain-nodrop" for k in ("sm90", "sm90_decode") for mask,
                    kv in forms
                    for b in m.op("attention_fwd").kernel(k).axes["head_dim"].buckets for dt in ("bf16", "fp16")}
    assert not [v for v in m.variants("attention_fwd", default=True) if v["mask"] == "none" and v["kv"] != "dense"]
    assert {v.name for v in m.variants("attention_fwd", archs=["sm_90a"], kernels=["sm90"], mask=["none"],
                                       kv=["varlen"], round_mode=["rtne"], kv_dtype=["same"])}  # still variants
    # Where the fast kernel does not take fp16 (gfx942 today), the baseline's fp16 variants stay in the set.
    gfx = _defaults(m, "gfx90a")
    assert "gfx942-rtne-none-dense-d128-bf16-same-plain-nodrop" in gfx
    if "fp16" not in m.op("attention_fwd").kernel("gfx942").axes["dtype"]:
        assert "baseline-rtne-none-dense-d128-fp16-same-plain-nodrop" in gfx
    fast = manifest.load(write(tmp_path, edited(_fast_everywhere)), root=ROOT)
    assert not [n for n in _defaults(fast, "sm_90a") if n.startswith("baseline-")]
    decode = len(m.op("attention_fwd").kernel("sm90_decode").axes["head_dim"].buckets) * 2 * len(forms)
    assert len(_defaults(fast, "sm_90a")) == 4 * 2 * len(forms) + decode  # buckets x dtypes x (mask, kv) forms
    assert _defaults(fast, "sm_80") == _defaults(m, "sm_80")   # no faster kernel there: every rtne variant of a cache
    rtne_same = m.variants("attention_fwd", archs=["sm_80"], round_mode=["rtne"], kv_dtype=["same"],
                           score_mod=["plain"], dropout=["nodrop"])  # warm_default
    assert len(_defaults(m, "sm_80")) == len([v for v in rtne_same if v["mask"] == "window" or v["kv"] == "dense"])


def test_no_warm_default_means_every_variant(tmp_path):
    m = manifest.load(write(tmp_path, edited(lambda d: op(d).pop("warm_default"))), root=ROOT)
    assert list(m.variants("attention_fwd", default=True)) == list(m.variants("attention_fwd"))
    assert m.op("attention_fwd").warm_default.describe() == "every variant"


# A prefill call: each kernel that declines whole classes of calls at run time (the decode kernels) declines it.
PREFILL = lambda k: k.declines_at_run_time or None  # noqa: E731


def test_an_excluded_combination_is_refused_by_name():
    m = manifest.load()
    call = dict(_call("rtz", 64), dtype="fp16")
    with pytest.raises(ValueError, match=r"dtype='fp16', round_mode='rtz' is no variant of op 'attention_fwd': "
                                         r"the manifest's ops.attention_fwd.exclude\[0\]"):
        m.variant_for("attention_fwd", "baseline", "gfx942", call)
    with pytest.raises(ValueError, match=r"asks for no variant: dtype='fp16', round_mode='rtz' is no variant"):
        dispatch.select("attention_fwd", "gfx942", call, m=m)
    sel = dispatch.select("attention_fwd", "gfx942", dict(call, round_mode="rtne"), m=m, supports=PREFILL)
    assert sel.variant.name == "gfx942-rtne-none-dense-d64-fp16-same-plain-nodrop"


def test_fp16_goes_to_a_kernel_that_takes_it_or_falls_back_saying_why():
    """An fp16 (prefill) call goes to the fast kernel when its dtype axis takes fp16, else to the baseline, saying
    why."""
    m = manifest.load()
    for arch, fast in (("sm_90a", "sm90"), ("gfx942", "gfx942"), ("gfx90a", "gfx942"), ("gfx942-emu", "gfx942")):
        assert dispatch.select("attention_fwd", arch, _call("rtne", 128), m=m, supports=PREFILL).kernel.name == fast
        sel = dispatch.select("attention_fwd", arch, dict(_call("rtne", 128), dtype="fp16"), m=m, supports=PREFILL)
        dtypes = m.op("attention_fwd").kernel(fast).axes["dtype"]
        if "fp16" in dtypes:
            assert sel.kernel.name == fast, sel
            assert sel.variant.name == f"{fast}-rtne-none-dense-d128-fp16-same-plain-nodrop", sel
        else:
            assert (sel.kernel.name == "baseline" and sel.variant.name
                    == "baseline-rtne-none-dense-d128-fp16-same-plain-nodrop")
            assert f"{fast}: dtype 'fp16' not in {list(dtypes)}" in sel.why, sel.why
    assert "fp16" in m.op("attention_fwd").kernel("gfx942").axes["dtype"]


def test_cuda_arch_names():
    known = manifest.load().archs()
    assert dispatch._cuda_arch(9, 0, known) == "sm_90a"
    assert dispatch._cuda_arch(8, 0, known) == "sm_80"
    assert dispatch._cuda_arch(8, 9, known) == "sm_80"    # sm_80 code runs on every sm_8x
    assert dispatch._cuda_arch(12, 0, known) == "sm_120"  # no kernel: select() reports it


def test_paths_find_the_data():
    root = paths.data_root()
    assert (root / "configs" / "ops.json").is_file() and paths.manifest_path() == root / "configs" / "ops.json"
    assert (paths.csrc_common_dir() / "platform.h").is_file()
    assert paths.package_cache_dir().name == "_cache" and paths.package_cache_dir().parent == paths.PACKAGE_DIR


def _tree_copy(tmp_path):
    import shutil
    for d in ("op_sources", "csrc_common", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    return manifest.load(tmp_path / "configs" / "ops.json", root=tmp_path)


def test_request_headers_are_the_include_closure(tmp_path):
    """Only headers the kernel can reach go into the request (and the cache key)."""
    m = _tree_copy(tmp_path)
    v = next(iter(m.variants("attention_fwd", archs=["gfx942"], kernels=["baseline"])))
    names = [n for n, _ in m.request(v, "0").headers]
    assert names == ["attn_params.h", "bf16_round.h", "dropout.h", "fp16_round.h", "fp8_fp4.h", "kv_quant.h",
                     "platform.h", "score_mod.h"]
    emu = next(iter(m.variants("attention_fwd", archs=["gfx942-emu"], kernels=["baseline"])))
    emu_names = [n for n, _ in m.request(emu, "0").headers]
    assert "emu/prelude_host.h" in emu_names and "emu/workgroup.h" in emu_names

    before = m.request(v, "0").headers
    (tmp_path / "csrc_common" / "unrelated.h").write_text("// not included by anything\n")
    (tmp_path / "csrc_common" / "emu" / "fiber.h").write_text("// edited emulator header\n")
    assert m.request(v, "0").headers == before        # gfx942 sees neither file
    edited = dict(m.request(emu, "0").headers)["emu/fiber.h"]
    assert edited == "// edited emulator header\n"     # the emulated arch does see its edit
    (tmp_path / "op_sources" / "attention_fwd" / "sm90" / "softmax.h").write_text("// other kernel's header\n")
    assert m.request(v, "0").headers == before        # another kernel's private header is not in the closure
    (tmp_path / "csrc_common" / "bf16_round.h").write_text("// edited\n")
    assert dict(m.request(v, "0").headers)["bf16_round.h"] == "// edited\n"


# ---- head-dim bounds: the manifest against each kernel's own text ---------------------------------------------------
# Each kernel states the head dims it is written for in its own text; the manifest's head_dim entry (what dispatch
# and validation accept) must say the same, so changing one side alone fails here. Read with one regex per statement,
# each of which must match exactly once:
#   sm90      sm90/params.h's plan table kSm90Plans, one row
#             `{<bucket>, <block_n>, <stages>, <q_stages>, <consumers>, <open_block_n>, <open_consumers>,
#             <rescale_first>, <open_overlap>},` per bucket: its buckets are the manifest's, which takes every multiple
#             of 8 from 8 to the last.
#   sm90_decode  sm90_decode/params.h's plan table kSm90DecodePlans, one row
#             `{<bucket>, <stages>, <keys>, <col_split>},` per bucket, the same way.
#   gfx942    gfx942/params.h `#define GFX942_BUCKETS <b>, <b>, ...` (gfx942.hip static_asserts its bucket is one of
#             them, the host's refusal names them), step 8 from 8 (each bucket serves every multiple of 8 up to it).
#   baseline  baseline.hip's guard `#if RTC_HEAD_DIM_MAX % <step> != 0 || RTC_HEAD_DIM_MAX < <lo> || ... > <hi>`
#             (step, min and max) and the buckets its #error names ("head-dim bucket: 32, 64, ... or 256").
OP_TEXT = ROOT / "op_sources" / "attention_fwd"
SM90_PLANS = (r"^constexpr Sm90Plan kSm90Plans\[\] = \{\n"
              r"((?:    \{\d+, \d+, \d+, \d+, \d+, \d+, [23], [01], [01]\},\n)+)\};$")
SM90_DECODE_PLANS = r"^constexpr Sm90DecodePlan kSm90DecodePlans\[\] = \{\n((?:    \{\d+, \d+, \d+, \d+\},\n)+)\};$"
GFX942_BUCKETS = (OP_TEXT / "gfx942" / "params.h", r"^#define GFX942_BUCKETS ([\d, ]+)$")
GFX942_REFUSAL = (ROOT / "jit" / "ops" / "attention_fwd" / "gfx942.cpp",
                  r'" is not accepted by the gfx942 kernel; accepted: a multiple of (\d+) from (\d+) to (\d+) '
                  r'\(buckets "')
BASELINE_GUARD = r"^#if RTC_HEAD_DIM_MAX % (\d+) != 0 \|\| RTC_HEAD_DIM_MAX < (\d+) \|\| RTC_HEAD_DIM_MAX > (\d+)$"
BASELINE_BUCKETS = r'^#error "RTC_HEAD_DIM_MAX \(head-dim bucket: ([\d, ]+ or \d+)\) must be defined"$'


def _stated(path: Path, pattern: str):
    """The groups of pattern's one match in path's text (a second match would leave it unclear which one holds)."""
    hits = re.findall(pattern, path.read_text(encoding="utf-8"), re.MULTILINE)
    assert len(hits) == 1, f"{path.relative_to(ROOT)}: {len(hits)} matches of {pattern!r}, expected one"
    return hits[0]


def _head_dim(kernel: str) -> manifest.BucketSpec:
    return manifest.load(ROOT / "configs" / "ops.json").op("attention_fwd").kernel(kernel).axes["head_dim"]


def test_every_kernel_has_its_head_dims_checked():
    kernels = [k.name for k in manifest.load(ROOT / "configs" / "ops.json").op("attention_fwd").kernels]
    assert sorted(kernels) == ["baseline", "gfx942", "gfx942_decode", "gfx950_decode", "sm90", "sm90_decode"]


def test_sm90_buckets_match_its_plans():
    rows = _stated(OP_TEXT / "sm90" / "params.h", SM90_PLANS)
    buckets = tuple(int(b) for b in re.findall(r"\{(\d+),", rows))
    spec = _head_dim("sm90")
    assert (spec.lo, spec.hi, spec.step, spec.buckets) == (8, buckets[-1], 8, buckets), (spec, buckets)


def test_sm90_decode_buckets_match_its_plans():
    rows = _stated(OP_TEXT / "sm90_decode" / "params.h", SM90_DECODE_PLANS)
    buckets = tuple(int(b) for b in re.findall(r"\{(\d+),", rows))
    spec = _head_dim("sm90_decode")
    assert (spec.lo, spec.hi, spec.step, spec.buckets) == (8, buckets[-1], 8, buckets), (spec, buckets)


def test_gfx942_head_dims_match_manifest():
    buckets = tuple(int(b) for b in _stated(*GFX942_BUCKETS).split(", "))
    step, lo, hi = (int(n) for n in _stated(*GFX942_REFUSAL))
    spec = _head_dim("gfx942")
    assert (spec.lo, spec.hi, spec.step, spec.buckets) == (lo, hi, step, buckets)
    assert list(buckets) == sorted(buckets) and buckets[-1] == hi and all(b % step == 0 for b in buckets)


GFX942_DECODE_BUCKET = (OP_TEXT / "gfx942_decode.hip",
                        r"^static_assert\(gfx942_bucket\(RTC_HEAD_DIM_MAX\) == RTC_HEAD_DIM_MAX,$")
GFX942_DECODE_REFUSAL = (ROOT / "jit" / "ops" / "attention_fwd" / "gfx942_decode.cpp",
                         r'" is not accepted by the gfx942_decode kernel; accepted: a multiple of (\d+) from (\d+) to '
                         r'(\d+)"')


def test_gfx942_decode_head_dims_match_manifest():
    """The decode kernel is built in gfx942/params.h's buckets (its static_assert) and its host refuses what they
    do not hold: the manifest's entry is the gfx942 kernel's."""
    _stated(*GFX942_DECODE_BUCKET)
    buckets = tuple(int(b) for b in _stated(*GFX942_BUCKETS).split(", "))
    step, lo, hi = (int(n) for n in _stated(*GFX942_DECODE_REFUSAL))
    spec = _head_dim("gfx942_decode")
    assert (spec.lo, spec.hi, spec.step, spec.buckets) == (lo, hi, step, buckets) == tuple(
        getattr(_head_dim("gfx942"), f) for f in ("lo", "hi", "step", "buckets"))
    # gfx950_decode is the same source (its native FP4 path) and host: the same head dims
    native = _head_dim("gfx950_decode")
    assert (native.lo, native.hi, native.step, native.buckets) == (spec.lo, spec.hi, spec.step, spec.buckets)


def test_baseline_head_dims_match_manifest():
    hip = OP_TEXT / "baseline.hip"
    step, lo, hi = (int(n) for n in _stated(hip, BASELINE_GUARD))
    buckets = tuple(int(b) for b in re.split(r", | or ", _stated(hip, BASELINE_BUCKETS)))
    spec = _head_dim("baseline")
    assert (spec.step, spec.hi, spec.buckets) == (step, hi, buckets)
    # The guard bounds the bucket define; its lower bound is one chunk of 8 values, which is also the smallest head
    # dim any bucket serves (a bucket serves every multiple of 8 up to it: the loops run head_dim / 8 chunks).
    assert spec.lo == lo
    assert all(lo <= b <= hi and b % step == 0 for b in buckets), (buckets, lo, hi, step)
