"""configs/ops.json: schema errors, variant enumeration, build requests, kernel selection and package paths."""
import copy
import json
from pathlib import Path

import pytest

from rtcattn import dispatch, manifest, paths

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


def kern(data):
    """The baseline's entry (fast kernels come before it in the manifest's order of preference)."""
    return next(k for k in data["ops"]["attention_fwd"]["kernels"] if k["name"] == "baseline")


BASE = [k["name"] for k in REAL["ops"]["attention_fwd"]["kernels"]].index("baseline")
NKERN = len(REAL["ops"]["attention_fwd"]["kernels"])


BAD = [
    ("schema", lambda d: d.update(schema=2), "schema", "2", "1"),
    ("no kernels", lambda d: d["ops"]["attention_fwd"].pop("kernels"), "ops.attention_fwd.kernels", "null",
     "present"),
    ("unknown arch", lambda d: kern(d)["archs"].append("gfx1100"), f"kernels[{BASE}].archs[6]", '"gfx1100"', "gfx942"),
    ("bad compiler", lambda d: d["ops"]["attention_fwd"]["arch_options"]["gfx942"].update(compiler=["gcc"]),
     "arch_options.gfx942.compiler[0]", '"gcc"', "hiprtc"),
    ("map hole", lambda d: d["ops"]["attention_fwd"]["axes"]["round_mode"]["map"].pop("rtz"),
     "axes.round_mode.map.rtz", "null", "an integer"),
    ("head dims", lambda d: kern(d)["head_dims"].update(min=300), f"kernels[{BASE}].head_dims", "300", "min <= max"),
    ("bucket too small", lambda d: kern(d).update(head_dim_buckets=[64, 128]), "head_dim_buckets", "[64, 128]",
     ">= head_dims.max"),
    ("when key", lambda d: kern(d).update(when={"seqlen": [1]}), f"kernels[{BASE}].when.seqlen", "[1]", "head_dim"),
    ("symbol", lambda d: kern(d).update(symbol="not a symbol"), f"kernels[{BASE}].symbol", '"not a symbol"',
     "C identifier"),
    ("source path", lambda d: kern(d).update(source="../evil.hip"), f"kernels[{BASE}].source", "../evil.hip",
     "inside op_sources"),
    ("duplicate", lambda d: d["ops"]["attention_fwd"]["kernels"].append(copy.deepcopy(kern(d))),
     f"kernels[{NKERN}].name", "baseline", "not used by another"),
    ("type", lambda d: kern(d).update(head_dim_buckets="64"), "head_dim_buckets", '"64"', "list of integers"),
]


@pytest.mark.parametrize("name,edit,key,value,accepted", BAD, ids=[b[0] for b in BAD])
def test_schema_errors_name_file_key_value_and_accepted(tmp_path, name, edit, key, value, accepted):
    p = write(tmp_path, edited(edit))
    with pytest.raises(manifest.ManifestError) as info:
        manifest.load(p)
    msg = str(info.value)
    assert str(p) in msg and key in msg and value in msg and accepted in msg, msg


def test_not_json_and_not_evaluated(tmp_path):
    p = write(tmp_path, None, text='{"schema": 1, "ops": __import__("os")}')
    with pytest.raises(manifest.ManifestError, match="valid JSON"):
        manifest.load(p)
    p = write(tmp_path, None, text='["schema", 1]')
    with pytest.raises(manifest.ManifestError, match="a JSON object"):
        manifest.load(p)


def test_variants_and_request():
    m = manifest.load()
    assert len(list(m.variants(archs=["gfx942"], kernels=["baseline"]))) == 2 * 3 * len(kern(REAL)["head_dim_buckets"])
    v = manifest.Variant("attention_fwd", "baseline", "gfx942", "bshd", "rtna", 128)
    req = m.request(v, "9.9")
    assert req.variant == "bshd-rtna-d128" and req.arch == "gfx942" and req.package_version == "9.9"
    assert req.options[:3] == ("-DRTC_LAYOUT=0", "-DRTC_ROUND=1", "-DRTC_HEAD_DIM_MAX=128")
    assert "-O3" in req.options and req.compilers == ("hiprtc", "clang")
    names = [n for n, _ in req.headers]
    assert {"platform.h", "attn_params.h", "bf16_round.h"} <= set(names)
    assert not any(n.startswith("emu/") for n in names)
    assert req.main[0] == "attention_fwd_baseline.hip" and "attention_fwd_baseline" in req.main[1]
    emu = m.request(manifest.Variant("attention_fwd", "baseline", "gfx942-emu", "bhsd", "rtz", 64), "9.9")
    assert emu.options[:3] == ("-DRTC_LAYOUT=1", "-DRTC_ROUND=2", "-DRTC_HEAD_DIM_MAX=64")
    emu_names = [n for n, _ in emu.headers]
    assert any(n.startswith("emu/") for n in emu_names) and emu.compilers == ("host",)


def test_buckets():
    k = manifest.load().op().kernel("baseline")
    assert [manifest.bucket_for(k, d) for d in (64, 72, 96, 128, 136, 200, 256)] == [64, 96, 96, 128, 192, 256, 256]
    assert k.supports_head_dim(72) and not k.supports_head_dim(68) and not k.supports_head_dim(264)


def test_select_prefers_listed_fast_kernel_and_falls_back(tmp_path):
    fast = dict(copy.deepcopy(kern(REAL)), name="fast", kind="fast_gfx942", archs=["gfx942"],
                head_dim_buckets=[128], head_dims={"min": 128, "max": 128, "step": 8},
                when={"head_dim": [128]})
    def only_fast_and_baseline(d):  # the mechanism under test, without the real fast kernels
        ks = d["ops"]["attention_fwd"]["kernels"]
        ks[:] = [fast] + [k for k in ks if k["name"] == "baseline"]
    data = edited(only_fast_and_baseline)
    m = manifest.load(write(tmp_path, data), root=ROOT)
    sel = dispatch.select("gfx942", 128, "bshd", "rtne", m=m)
    assert sel.kernel.name == "fast" and sel.why == "first match"
    assert manifest.variant_name(sel.variant) == "fast-bshd-rtne-d128"
    sel = dispatch.select("gfx942", 64, "bshd", "rtne", m=m)
    assert sel.kernel.name == "baseline" and "fast" in sel.why and "head_dim 64" in sel.why
    sel = dispatch.select("gfx90a", 128, "bhsd", "rtz", m=m)
    assert sel.kernel.name == "baseline" and "arch gfx90a" in sel.why
    with pytest.raises(ValueError, match="no kernel"):
        dispatch.select("gfx1100", 128, "bshd", "rtne", m=m)


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
    v = next(iter(m.variants(archs=["gfx942"], kernels=["baseline"])))
    names = [n for n, _ in m.request(v, "0").headers]
    assert names == ["attn_params.h", "bf16_round.h", "platform.h"]
    emu = next(iter(m.variants(archs=["gfx942-emu"], kernels=["baseline"])))
    emu_names = [n for n, _ in m.request(emu, "0").headers]
    assert "emu/prelude_host.h" in emu_names and "emu/workgroup.h" in emu_names

    before = m.request(v, "0").headers
    (tmp_path / "csrc_common" / "unrelated.h").write_text("// not included by anything\n")
    (tmp_path / "csrc_common" / "emu" / "fiber.h").write_text("// edited emulator header\n")
    assert m.request(v, "0").headers == before        # gfx942 sees neither file
    edited = dict(m.request(emu, "0").headers)["emu/fiber.h"]
    assert edited == "// edited emulator header\n"     # the emulated arch does see its edit
    (tmp_path / "csrc_common" / "bf16_round.h").write_text("// edited\n")
    assert dict(m.request(v, "0").headers)["bf16_round.h"] == "// edited\n"
