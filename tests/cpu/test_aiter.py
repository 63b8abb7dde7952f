"""rtcattn.aiter.register() against a stand-in `aiter` module (amd-aiter needs ROCm to import)."""
import sys
import types

import pytest
import torch

import rtcattn
from rtcattn.ops.attention_fwd import stub

BF = torch.bfloat16
_standin_lib = None


def make_standin():
    """A module with AITER's registry shape: ops defined through torch.library.Library("aiter", "FRAGMENT")."""
    global _standin_lib
    mod = types.ModuleType("aiter")
    if _standin_lib is None:
        _standin_lib = torch.library.Library("aiter", "FRAGMENT")
        _standin_lib.define("standin_scale(Tensor x, float s) -> Tensor")
        _standin_lib.impl("standin_scale", lambda x, s: x * s, "CompositeExplicitAutograd")
    mod.aiter_lib = _standin_lib
    return mod


@pytest.fixture
def standin(monkeypatch):
    mod = make_standin()
    monkeypatch.setitem(sys.modules, "aiter", mod)
    return mod


@pytest.fixture
def fake_launch(monkeypatch):
    calls = []

    def run(q, k, v, out, return_lse, layout, round_mode, problem):
        calls.append((layout, round_mode, problem.scale, problem.window))
        out = torch.empty_like(q) if out is None else out
        out.copy_(v)
        lse = torch.full((problem.batch, problem.heads, problem.seq_q) if return_lse else (0,), 3.0)
        return out, lse
    monkeypatch.setattr(stub, "launch", run)
    return calls


def test_register_defines_op_and_attribute(standin):
    fn = rtcattn.aiter.register()
    assert hasattr(torch.ops.aiter, "rtcattn_fwd") and callable(standin.rtcattn_fwd) and fn is standin.rtcattn_fwd
    assert "how_v3_bf16_cvt=1" in str(torch.ops.aiter.rtcattn_fwd.default._schema)
    # AITER's own ops in the same fragment namespace are untouched.
    assert torch.equal(torch.ops.aiter.standin_scale(torch.ones(2), 3.0), torch.full((2,), 3.0))


def test_register_twice_is_harmless(standin):
    first = rtcattn.aiter.register()
    second = rtcattn.aiter.register()
    assert first is second is standin.rtcattn_fwd


def test_registered_op_runs_with_aiter_semantics(standin, fake_launch):
    rtcattn.aiter.register()
    q = torch.randn(1, 4, 2, 64, dtype=BF)
    v = torch.randn(1, 4, 2, 64, dtype=BF)
    out = standin.rtcattn_fwd(q, q, v, how_v3_bf16_cvt=2)
    assert torch.equal(out, v) and fake_launch[-1][:2] == ("bshd", "rtz")
    out, lse = standin.rtcattn_fwd(q, q, v, softmax_scale=0.5, return_lse=True)
    assert lse.shape == (1, 2, 4) and bool((lse == 3.0).all()) and fake_launch[-1] == ("bshd", "rtna", 0.5, (-1, -1))
    out = standin.rtcattn_fwd(q, q, v, 0.0, None, True, (5, -1))  # AITER's positional order: causal, window_size
    assert fake_launch[-1][:2] == ("bshd", "rtna") and fake_launch[-1][3] == (5, 0)
    with pytest.raises(ValueError, match=r"dropout_p=1.5 is not supported; accepted: a float in \[0, 1\)"):
        standin.rtcattn_fwd(q, q, v, 1.5)


def test_registered_op_traces(standin, fake_launch):
    rtcattn.aiter.register()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = torch.compile(lambda q: torch.ops.aiter.rtcattn_fwd(q, q, q)[0] + 1, fullgraph=True, backend=backend)
    q = torch.randn(1, 4, 2, 64, dtype=BF)
    assert torch.equal(f(q), q + 1) and len(graphs) == 1


def test_register_without_aiter_raises_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", None)   # makes `import aiter` fail
    with pytest.raises(ImportError, match="needs AITER"):
        rtcattn.aiter.register()


def test_registered_varlen_op_runs_the_varlen_path(standin, monkeypatch, tmp_path):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(tmp_path))
    rtcattn.aiter.register()
    assert hasattr(torch.ops.aiter, "rtcattn_varlen_fwd") and callable(standin.rtcattn_varlen_fwd)
    assert "how_v3_bf16_cvt=1" in str(torch.ops.aiter.rtcattn_varlen_fwd.default._schema)
    q, k, v = (torch.randn(9, 2, 64, dtype=BF) for _ in range(3))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    want = rtcattn.forward_varlen(q, k, v, cu, cu, 5, 5, causal=True, round_mode="rtz")
    got, lse = standin.rtcattn_varlen_fwd(q, k, v, cu, cu, 5, 5, causal=True, how_v3_bf16_cvt=2, return_lse=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and lse.shape == (2, 9)
    out = torch.zeros_like(q)
    assert standin.rtcattn_varlen_fwd(q, k, v, cu, cu, 5, 5, causal=True, how_v3_bf16_cvt=2, out=out) is out
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    capped = rtcattn.forward_varlen(q, k, v, cu, cu, 5, 5, causal=True, softcap=3.0)  # AITER's name of the soft cap
    got = standin.rtcattn_varlen_fwd(q, k, v, cu, cu, 5, 5, causal=True, logits_soft_cap=3.0, how_v3_bf16_cvt=0)
    assert torch.equal(got.view(torch.int16), capped.view(torch.int16))
    with pytest.raises(ValueError, match="logits_soft_cap=-1.0 is not supported"):
        standin.rtcattn_varlen_fwd(q, k, v, cu, cu, 5, 5, logits_soft_cap=-1.0)
