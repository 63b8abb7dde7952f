"""A new compile-time axis is a JSON edit plus the kernel text that reads its define: no Python or C++ change.

The throwaway axis `flavor` below goes through variants and their names, build defines, the cache key,
dispatch's conditions and warm's CLI filter, and reaches the kernel text, on a copy of the source tree.
"""
import json
import shutil
from pathlib import Path

import pytest

from rtcattn.runtime import _lib, dispatch, manifest, paths
from rtcattn.tools import cli

ROOT = Path(__file__).resolve().parents[2]
FLAVOR = {"name": "flavor", "define": "RTC_TEST_FLAVOR", "values": {"plain": 0, "loud": 1}}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    for d in ("op_sources", "csrc_common", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    ops = tmp_path / "configs" / "ops.json"
    data = json.loads(ops.read_text())
    data["ops"]["attention_fwd"]["axes"].append(FLAVOR)
    ops.write_text(json.dumps(data))
    src = tmp_path / "op_sources" / "attention_fwd" / "baseline.hip"
    src.write_text('#if RTC_TEST_FLAVOR == 1\n#error "the loud flavor reached the kernel text"\n#endif\n'
                   + src.read_text())
    monkeypatch.setattr(paths, "data_root", lambda: tmp_path)
    return tmp_path


# A prefill call: each kernel that declines whole classes of calls at run time (the decode kernels) declines it.
PREFILL = lambda k: k.declines_at_run_time or None  # noqa: E731


def test_axis_reaches_variants_names_defines_and_selection(tree):
    m = manifest.load()
    assert m.path == tree / "configs" / "ops.json"
    real = manifest.load(ROOT / "configs" / "ops.json", root=ROOT)
    n_real = len(list(real.variants("attention_fwd")))
    assert len(list(m.variants("attention_fwd"))) == 2 * n_real
    names = {v.name for v in m.variants("attention_fwd", archs=["gfx942"], kernels=["baseline"], head_dim=[64])}
    assert "baseline-rtne-none-dense-d64-bf16-same-plain-nodrop-loud" in names
    assert "baseline-rtz-window-dense-d64-bf16-same-plain-nodrop-plain" in names
    call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop", "flavor": "loud"}
    sel = dispatch.select("attention_fwd", "gfx942", call, m=m, supports=PREFILL)
    assert (sel.variant.name == "gfx942-rtne-none-dense-d128-bf16-same-plain-nodrop-loud" and sel.variant["flavor"]
            == "loud")
    req = m.request(sel.variant, "0")
    assert "-DRTC_TEST_FLAVOR=1" in req.options


def test_axis_value_reaches_the_kernel_and_the_cache_key(tree, tmp_path_factory):
    m = manifest.load()
    cache = str(tmp_path_factory.mktemp("cache"))
    call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 64, "dtype": "bf16", "kv_dtype": "same",
            "score_mod": "plain", "dropout": "nodrop"}
    plain = m.request(m.variant_for("attention_fwd", "baseline", "gfx942-emu", dict(call, flavor="plain")), "0")
    loud = m.request(m.variant_for("attention_fwd", "baseline", "gfx942-emu", dict(call, flavor="loud")), "0")
    built = _lib.build(plain.op, plain.variant, plain.arch, plain.kernel_symbol, plain.main, plain.headers,
                       plain.options, compiler="host", cache_dir=cache)
    assert "-plain-gfx942-emu-" in built.cache_name and built.origin == "compile"
    with pytest.raises(_lib.CompileError, match="the loud flavor reached the kernel text"):
        _lib.build(loud.op, loud.variant, loud.arch, loud.kernel_symbol, loud.main, loud.headers, loud.options,
                   compiler="host", cache_dir=cache)


def test_a_kernel_may_restrict_the_axis(tree):
    ops = tree / "configs" / "ops.json"
    data = json.loads(ops.read_text())
    gfx942 = next(k for k in data["ops"]["attention_fwd"]["kernels"] if k["name"] == "gfx942")
    gfx942["axes"]["flavor"] = ["plain"]
    ops.write_text(json.dumps(data))
    m = manifest.load()
    call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop", "flavor": "loud"}
    sel = dispatch.select("attention_fwd", "gfx942", call, m=m, supports=PREFILL)
    assert sel.kernel.name == "baseline" and "flavor 'loud' not in ['plain']" in sel.why
    assert {v["flavor"] for v in m.variants("attention_fwd", kernels=["gfx942"])} == {"plain"}


def test_warm_gets_a_filter_for_the_axis(tree):
    args = cli.parser().parse_args(["warm", "--op", "attention_fwd", "--all", "--arch", "gfx942-emu",
                                    "--kernels", "baseline", "--flavor", "loud", "--head-dim", "64", "--mask", "none",
                                    "--kv", "dense", "--dtype", "bf16", "--score-mod", "plain", "--dropout", "nodrop"])
    names = sorted(v.name for v in cli._warm_variants(args))
    assert names == [f"baseline-{mode}-none-dense-d64-bf16-same-plain-nodrop-loud" for mode in ("rtna", "rtne", "rtz")]
    bad = cli.parser().parse_args(["warm", "--arch", "gfx942-emu", "--flavor", "quiet"])
    with pytest.raises(SystemExit, match="--flavor=quiet is not supported; accepted: plain, loud"):
        cli._warm_variants(bad)


def test_exclusions_of_the_axis_come_from_the_json_alone(tree):
    """An `exclude` entry naming the new axis: those combinations are no variant (enumeration, warm, dispatch),
    and a call that asks for one is refused naming the entry; the rest is untouched."""
    ops = tree / "configs" / "ops.json"
    data = json.loads(ops.read_text())
    data["ops"]["attention_fwd"]["exclude"].append({"flavor": ["loud"], "mask": ["window"]})
    ops.write_text(json.dumps(data))
    m = manifest.load()
    real = manifest.load(ROOT / "configs" / "ops.json", root=ROOT)
    n_real, n_window = len(list(real.variants("attention_fwd"))), len(list(real.variants("attention_fwd",
                                                                                           mask=["window"])))
    variants = list(m.variants("attention_fwd"))
    assert len(variants) == 2 * n_real - n_window
    assert not [v for v in variants if v["flavor"] == "loud" and v["mask"] == "window"]
    args = cli.parser().parse_args(["warm", "--op", "attention_fwd", "--all", "--arch", "gfx942-emu",
                                    "--kernels", "baseline", "--flavor", "loud", "--head-dim", "64", "--kv", "dense",
                                    "--dtype", "bf16", "--score-mod", "plain", "--dropout", "nodrop"])
    names = sorted(v.name for v in cli._warm_variants(args))
    assert names == [f"baseline-{mode}-none-dense-d64-bf16-same-plain-nodrop-loud" for mode in ("rtna", "rtne", "rtz")]
    call = {"round_mode": "rtne", "mask": "window", "kv": "dense", "head_dim": 128, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop", "flavor": "loud"}
    n = len(data["ops"]["attention_fwd"]["exclude"]) - 1
    with pytest.raises(ValueError, match=rf"flavor='loud', mask='window' is no variant .*exclude\[{n}\]"):
        dispatch.select("attention_fwd", "gfx942", call, m=m)
    sel = dispatch.select("attention_fwd", "gfx942", dict(call, flavor="plain"), m=m, supports=PREFILL)
    assert sel.variant.name == "gfx942-rtne-window-dense-d128-bf16-same-plain-nodrop-plain"
