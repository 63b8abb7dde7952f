"""The backward pass does not exist yet: every public function and torch op refuses it with an error naming
the function, eagerly and under torch.compile, while inference calls (no_grad, or inputs that do not
require grad, or inputs that do but no backward) run and trace as before. Runs on the CPU emulator."""
import re
import sys
import types

import pytest
import torch

import rtcattn

BF = torch.bfloat16
I32 = torch.int32
NOT_AVAILABLE = "the backward pass is not available yet"


@pytest.fixture(autouse=True)
def emulated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setitem(sys.modules, "aiter", types.ModuleType("aiter"))  # register() only sets its attributes
    rtcattn.aiter.register()
    torch._dynamo.reset()  # each test compiles its own functions


def _names(text: str, name: str) -> bool:
    """Whether text names the function `name` (rtcattn.forward, not only rtcattn.forward_varlen)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def dense(grad=True):
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.randn(1, 40, 2, 128, generator=gen).to(BF).requires_grad_(grad) for _ in range(3))


CU_Q = (0, 15, 40)


def packed(grad=True):
    gen = torch.Generator().manual_seed(2)
    return tuple(torch.randn(40, 2, 128, generator=gen).to(BF).requires_grad_(grad) for _ in range(3))


def paged(grad=True):
    """q packed by CU_Q; k, v four pages of 16 rows; sequence 0 has 20 keys (pages 2, 0), sequence 1 has 12 (page 3)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(40, 2, 128, generator=gen).to(BF).requires_grad_(grad)
    k, v = (torch.randn(4, 16, 2, 128, generator=gen).to(BF).requires_grad_(grad) for _ in range(2))
    return q, k, v


def _cu(offsets):
    return torch.tensor(offsets, dtype=I32)


def _varlen_args():
    return _cu(CU_Q), _cu(CU_Q), 25, 25


def _paged_args():
    return _cu(CU_Q), _cu((0, 20, 32)), 25, 20


TABLE = ((2, 0), (3, 1))


def _aiter():
    return sys.modules["aiter"]


# name the error must give -> (inputs, the call returning the tensors a loss would use)
FUNCTIONAL = {
    "rtcattn.forward": (dense, lambda q, k, v: rtcattn.forward(q, k, v, causal=True, return_lse=True)),
    "rtcattn.flash_attn_func": (dense, lambda q, k, v: rtcattn.flash_attn_func(q, k, v, causal=True)),
    "aiter.rtcattn_fwd": (dense, lambda q, k, v: _aiter().rtcattn_fwd(q, k, v, causal=True)),
    "torch.ops.rtcattn.fwd": (dense, lambda q, k, v: torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True)),
    "rtcattn.forward_varlen": (packed, lambda q, k, v: rtcattn.forward_varlen(q, k, v, *_varlen_args(), causal=True)),
    "rtcattn.flash_attn_varlen_func": (paged, lambda q, k, v: rtcattn.flash_attn_varlen_func(
        q, k, v, *_paged_args(), causal=True, block_table=_cu(TABLE), return_lse=True)),
    "aiter.rtcattn_varlen_fwd": (packed, lambda q, k, v: _aiter().rtcattn_varlen_fwd(q, k, v, *_varlen_args())),
    "torch.ops.rtcattn.fwd_varlen": (paged, lambda q, k, v: torch.ops.rtcattn.fwd_varlen(
        q, k, v, *_paged_args(), "rtne", None, False, -1, 0, _cu(TABLE))),
}

# The out= calls: name -> (inputs, call(q, k, v, out)); they write out and refuse grad at the call.
WRITING = {
    "rtcattn.forward(out=...)": (dense, lambda q, k, v, out: rtcattn.forward(q, k, v, out=out, causal=True)),
    "torch.ops.rtcattn.fwd_out": (dense, lambda q, k, v, out: torch.ops.rtcattn.fwd_out(
        q, k, v, out, "bshd", "rtne", None, False, -1, 0)),
    "rtcattn.forward_varlen(out=...)": (packed, lambda q, k, v, out: rtcattn.forward_varlen(
        q, k, v, *_varlen_args(), out=out, causal=True)),
    "rtcattn.flash_attn_varlen_func(out=...)": (paged, lambda q, k, v, out: rtcattn.flash_attn_varlen_func(
        q, k, v, *_paged_args(), causal=True, block_table=_cu(TABLE), out=out)),
    "torch.ops.rtcattn.fwd_varlen_out": (packed, lambda q, k, v, out: torch.ops.rtcattn.fwd_varlen_out(
        q, k, v, out, *_varlen_args(), "rtne", None, False, -1, 0)),
}


def _loss(res):
    res = res if isinstance(res, tuple) else (res,)
    return sum(t.float().nan_to_num(0.0, 0.0, 0.0).square().sum() for t in res)


def _same(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x.view(torch.int16) if x.dtype == BF else x,
                                                                        y.view(torch.int16) if y.dtype == BF else y)
                                     for x, y in zip(a, b))


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_eager_backward_raises_naming_the_function(name):
    make, call = FUNCTIONAL[name]
    q, k, v = make()
    res = call(q, k, v)  # the forward runs: inference code often has inputs that require grad
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE) as e:
        _loss(res).backward()
    assert _names(str(e.value), name), str(e.value)
    assert "torch.no_grad()" in str(e.value)
    assert q.grad is None and k.grad is None and v.grad is None


@pytest.mark.parametrize("which", [1, 2])
def test_backward_raises_when_only_k_or_v_requires_grad(which):
    q, k, v = dense(grad=False)
    inputs = [q, k, v]
    inputs[which].requires_grad_()
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE):
        _loss(rtcattn.forward(*inputs)).backward()


def test_backward_through_lse_alone_raises():
    q, k, v = packed()
    _, lse = rtcattn.forward_varlen(q, k, v, *_varlen_args(), return_lse=True)
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE):
        lse.sum().backward()


@pytest.mark.parametrize("name", WRITING)
def test_out_call_refuses_grad_at_the_call_naming_the_function(name):
    make, call = WRITING[name]
    q, k, v = make()
    out = torch.zeros(q.shape, dtype=BF)
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE) as e:
        call(q, k, v, out)
    assert _names(str(e.value), name) and "out=" in str(e.value), str(e.value)
    assert not out.any()  # refused before the launch
    with torch.no_grad():
        call(q, k, v, out)
    assert out.any()


def test_out_call_bumps_the_version_so_a_saved_out_is_not_used_silently():
    """A backward that saved out before the call must notice the write (as after any in-place op)
    rather than compute a gradient from the new values."""
    q, k, v = dense(grad=False)
    out = torch.ones(q.shape, dtype=BF)
    w = torch.ones(q.shape, dtype=BF, requires_grad=True)
    y = (out * w).sum()  # saves out for w's gradient
    rtcattn.forward(q, k, v, out=out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_aiter_varlen_out_backward_raises_naming_it():
    q, k, v = packed()
    out = torch.zeros(q.shape, dtype=BF)
    res = _aiter().rtcattn_varlen_fwd(q, k, v, *_varlen_args(), out=out)  # functional op, then a copy into out
    assert res is out
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE) as e:
        _loss(out).backward()
    assert _names(str(e.value), "aiter.rtcattn_varlen_fwd")


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_compiled_training_call_runs_and_its_backward_raises(name):
    """AOTAutograd (what inductor uses) traces the backward at compile time: the raise is an op in the
    backward graph, so the compile succeeds and the error comes when .backward() runs, as eagerly."""
    make, call = FUNCTIONAL[name]
    q, k, v = make()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    res = compiled(q, k, v)
    with torch.no_grad():
        assert _same(res, call(q, k, v))
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE) as e:
        _loss(res).backward()
    assert _names(str(e.value), name)


@pytest.mark.parametrize("name", WRITING)
def test_compiled_out_call_with_grad_is_refused_at_compile(name):
    make, call = WRITING[name]
    q, k, v = make()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=NOT_AVAILABLE) as e:  # torch._dynamo's Unsupported, quoting ours
        compiled(q, k, v, torch.zeros(q.shape, dtype=BF))
    assert _names(str(e.value), name)


def _outputs(fn, name, q, k, v):
    """What a call gives: its results, or for an out= call the out buffer it wrote (fresh zeros before)."""
    if name in FUNCTIONAL:
        res = fn(q, k, v)
        return res if isinstance(res, tuple) else (res,)
    out = torch.zeros(q.shape, dtype=BF)
    fn(q, k, v, out)
    return (out,)


@pytest.mark.parametrize("mode", ["no_grad", "inputs_without_grad"])
@pytest.mark.parametrize("name", list(FUNCTIONAL) + list(WRITING))
def test_compiled_inference_call_matches_eager(name, mode):
    make, call = FUNCTIONAL[name] if name in FUNCTIONAL else WRITING[name]
    q, k, v = make(grad=mode == "no_grad")
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
        assert _same(_outputs(compiled, name, q, k, v), _outputs(call, name, q, k, v))


@pytest.mark.slow
def test_inductor_training_call_raises_at_backward_and_inference_matches():
    q, k, v = dense()
    compiled = torch.compile(lambda q, k, v: rtcattn.flash_attn_func(q, k, v, causal=True), fullgraph=True)
    res = compiled(q, k, v)
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE):
        _loss(res).backward()
    with torch.no_grad():
        assert _same(compiled(q, k, v), rtcattn.flash_attn_func(q, k, v, causal=True))
