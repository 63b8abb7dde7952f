"""configs/ops.json: schema errors, variant enumeration, build requests, kernel selection and package paths."""
import copy
import json
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
    ("value not int", lambda d: axis(d, "round_mode")["values"].update(rtz="2"), "axes[1].values.rtz", '"2"',
     "mapped to integers"),
    ("axis define", lambda d: axis(d, "layout").update(define="RTC LAYOUT"), "axes[0].define", '"RTC LAYOUT"',
     "C identifier"),
    ("duplicate axis", lambda d: op(d)["axes"].append(copy.deepcopy(axis(d, "layout"))), "axes[5].name", '"layout"',
     "not used by another axis"),
    ("head dims", lambda d: kern(d)["axes"]["head_dim"].update(min=300), HD, "300", "min <= max"),
    ("bucket too small", lambda d: kern(d)["axes"]["head_dim"].update(buckets=[64, 128]), f"{HD}.buckets",
     "[64, 128]", ">= max"),
    ("bucket spec missing", lambda d: kern(d)["axes"].pop("head_dim"), HD, "null", "required for a bucketed axis"),
    ("unknown axis", lambda d: kern(d)["axes"].update(seqlen=[1]), f"kernels[{BASE}].axes.seqlen", "[1]",
     "an axis of the op"),
    ("axis value", lambda d: kern(d)["axes"].update(layout=["bsdh"]), f"kernels[{BASE}].axes.layout[0]", '"bsdh"',
     "bshd"),
    ("symbol", lambda d: kern(d).update(symbol="not a symbol"), f"kernels[{BASE}].symbol", '"not a symbol"',
     "C identifier"),
    ("source path", lambda d: kern(d).update(source="../evil.hip"), f"kernels[{BASE}].source", "../evil.hip",
     "inside op_sources"),
    ("source missing", lambda d: kern(d).update(source="nope.hip"), f"kernels[{BASE}].source", "nope.hip",
     "a file that exists"),
    ("duplicate", lambda d: op(d)["kernels"].append(copy.deepcopy(kern(d))), f"kernels[{NKERN}].name", "baseline",
     "not used by another"),
    ("type", lambda d: kern(d)["axes"]["head_dim"].update(buckets="64"), f"{HD}.buckets", '"64"', "list of integers"),
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


def _variant(m, kernel, arch, layout, mode, head_dim):
    return m.variant_for("attention_fwd", kernel, arch, {"layout": layout, "round_mode": mode, "mask": "none",
                                                         "kv": "dense", "head_dim": head_dim})


def test_variants_and_request():
    m = manifest.load()
    buckets = kern(REAL)["axes"]["head_dim"]["buckets"]
    variants = list(m.variants("attention_fwd", archs=["gfx942"], kernels=["baseline"]))
    assert len(variants) == 2 * 3 * 2 * 3 * len(buckets)
    v = _variant(m, "baseline", "gfx942", "bshd", "rtna", 128)
    assert v.name == "baseline-bshd-rtna-none-dense-d128" and v["round_mode"] == "rtna" and v["head_dim"] == 128
    req = m.request(v, "9.9")
    assert req.variant == "baseline-bshd-rtna-none-dense-d128" and req.arch == "gfx942" and req.package_version == "9.9"
    assert req.options[:5] == ("-DRTC_LAYOUT=0", "-DRTC_ROUND=1", "-DRTC_MASK=0", "-DRTC_KV=0",
                               "-DRTC_HEAD_DIM_MAX=128")
    assert "-O3" in req.options and req.compilers == ("hiprtc", "clang")
    names = [n for n, _ in req.headers]
    assert {"platform.h", "attn_params.h", "bf16_round.h"} <= set(names)
    assert not any(n.startswith("emu/") for n in names)
    assert req.main[0] == "baseline.hip" and "attention_fwd_baseline" in req.main[1]
    emu = m.request(_variant(m, "baseline", "gfx942-emu", "bhsd", "rtz", 64), "9.9")
    assert emu.options[:5] == ("-DRTC_LAYOUT=1", "-DRTC_ROUND=2", "-DRTC_MASK=0", "-DRTC_KV=0", "-DRTC_HEAD_DIM_MAX=64")
    emu_names = [n for n, _ in emu.headers]
    assert any(n.startswith("emu/") for n in emu_names) and emu.compilers == ("host",)
    assert m.request(v, "9.9", ("-DLAB=1",)).options[-1] == "-DLAB=1"


def test_buckets():
    spec = manifest.load().op("attention_fwd").kernel("baseline").axes["head_dim"]
    assert [spec.bucket_for(d) for d in (64, 72, 96, 128, 136, 200, 256)] == [64, 96, 96, 128, 192, 256, 256]
    assert spec.accepts(72) and not spec.accepts(68) and not spec.accepts(264)
    m = manifest.load()
    assert _variant(m, "baseline", "gfx942", "bshd", "rtne", 72)["head_dim"] == 96


def _call(layout, mode, head_dim, mask="none"):
    return {"layout": layout, "round_mode": mode, "mask": mask, "kv": "dense", "head_dim": head_dim}


def test_select_prefers_listed_fast_kernel_and_falls_back(tmp_path):
    fast = dict(copy.deepcopy(kern(REAL)), name="fast", archs=["gfx942"],
                axes={"head_dim": {"min": 128, "max": 128, "step": 8, "buckets": [128]}, "layout": ["bshd"]})

    def only_fast_and_baseline(d):  # the mechanism under test, without the real fast kernels
        ks = op(d)["kernels"]
        ks[:] = [fast] + [k for k in ks if k["name"] == "baseline"]
    m = manifest.load(write(tmp_path, edited(only_fast_and_baseline)), root=ROOT)
    sel = dispatch.select("attention_fwd", "gfx942", _call("bshd", "rtne", 128), m=m)
    assert sel.kernel.name == "fast" and sel.why == "first match"
    assert sel.variant.name == "fast-bshd-rtne-none-dense-d128"
    sel = dispatch.select("attention_fwd", "gfx942", _call("bshd", "rtne", 64), m=m)
    assert sel.kernel.name == "baseline" and "fast" in sel.why and "head_dim 64" in sel.why
    sel = dispatch.select("attention_fwd", "gfx942", _call("bhsd", "rtne", 128), m=m)
    assert sel.kernel.name == "baseline" and "layout 'bhsd' not in ['bshd']" in sel.why
    sel = dispatch.select("attention_fwd", "gfx90a", _call("bhsd", "rtz", 128), m=m)
    assert sel.kernel.name == "baseline" and "arch gfx90a" in sel.why
    assert len(list(m.variants("attention_fwd", kernels=["fast"]))) == 1 * 3 * 2 * 3 * 1  # bshd only
    with pytest.raises(ValueError, match="no kernel"):
        dispatch.select("attention_fwd", "gfx1100", _call("bshd", "rtne", 128), m=m)
    with pytest.raises(ValueError, match="RTCATTN_KERNEL='nope' is not accepted.*fast, baseline"):
        dispatch.select("attention_fwd", "gfx942", _call("bshd", "rtne", 128), kernel="nope", m=m)


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
    assert names == ["attn_params.h", "bf16_round.h", "platform.h"]
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
