"""Autograd through every public function and torch op on the CPU emulator: the calls without out= take gradients
(dq, dk, dv by torch.ops.rtcattn.bwd / bwd_varlen, within FlashAttention's accuracy rule of the fp64 reference), eagerly
and under torch.compile (fullgraph) with the eager bits; a paged call's backward raises naming block_table; out= calls
and the KV-cache calls refuse inputs that require grad at the call; inference calls trace as before."""
import re
import sys
import types

import pytest
import torch

import rtcattn
from rtcattn.ops.attention_bwd import reference as bref

BF = torch.bfloat16
I32 = torch.int32
OUT_REFUSED = "an out= call refuses inputs that require grad"


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


# name -> (inputs, the call returning the tensors a loss would use, its form and window for the references)
TRAINING = {
    "rtcattn.forward": (dense, lambda q, k, v: rtcattn.forward(q, k, v, causal=True, return_lse=True), "dense",
                        (-1, 0)),
    "rtcattn.flash_attn_func": (dense, lambda q, k, v: rtcattn.flash_attn_func(q, k, v, causal=True), "dense",
                                (-1, 0)),
    "aiter.rtcattn_fwd": (dense, lambda q, k, v: _aiter().rtcattn_fwd(q, k, v, causal=True), "dense", (-1, 0)),
    "torch.ops.rtcattn.fwd": (dense, lambda q, k, v: torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, True),
                              "dense", (-1, -1)),
    "rtcattn.forward_varlen": (packed, lambda q, k, v: rtcattn.forward_varlen(q, k, v, *_varlen_args(), causal=True),
                               "varlen", (-1, 0)),
    "rtcattn.flash_attn_varlen_func": (packed, lambda q, k, v: rtcattn.flash_attn_varlen_func(
        q, k, v, *_varlen_args(), window_size=(6, 2), return_lse=True, how_v3_bf16_cvt=0), "varlen", (6, 2)),
    "aiter.rtcattn_varlen_fwd": (packed, lambda q, k, v: _aiter().rtcattn_varlen_fwd(q, k, v, *_varlen_args()),
                                 "varlen", (-1, -1)),
    "torch.ops.rtcattn.fwd_varlen": (packed, lambda q, k, v: torch.ops.rtcattn.fwd_varlen(
        q, k, v, *_varlen_args(), "rtne", None, False, -1, 0), "varlen", (-1, 0)),
}

# The bf16 rounding each call runs with: AITER's entries default to how_v3_bf16_cvt=1 (RTNA).
MODES = {name: "rtna" if "aiter" in name or name == "rtcattn.flash_attn_func" else "rtne" for name in TRAINING}

# Paged calls: the forward runs, the backward raises naming the block table.
PAGED = {
    "rtcattn.flash_attn_varlen_func": lambda q, k, v: rtcattn.flash_attn_varlen_func(
        q, k, v, *_paged_args(), causal=True, block_table=_cu(TABLE), return_lse=True),
    "torch.ops.rtcattn.fwd_varlen": lambda q, k, v: torch.ops.rtcattn.fwd_varlen(
        q, k, v, *_paged_args(), "rtne", None, False, -1, 0, _cu(TABLE)),
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


def _references(q, k, v, out, lse, dout, form, window, mode="rtne", dlse=None):
    """(fp64, R) gradients of a dense or packed call (packed: per sequence of CU_Q, as dense [1, S, H, D] calls)."""
    if form == "dense":
        return (bref.grads_fp64(q, k, v, dout, "bshd", None, window, dlse),
                bref.grads_r(q, k, v, out, lse, dout, "bshd", mode, None, window, dlse))
    g64, gr = ([torch.zeros(t.shape, dtype=dt) for t in (q, k, v)] for dt in (torch.float64, q.dtype))
    for b in range(len(CU_Q) - 1):
        rows = slice(CU_Q[b], CU_Q[b + 1])
        one = [t[rows][None] for t in (q, k, v, out, dout)]
        sl, dsl = lse[:, rows][None], None if dlse is None else dlse[:, rows][None]
        for acc, part in ((g64, bref.grads_fp64(*one[:3], one[4], "bshd", None, window, dsl)),
                          (gr, bref.grads_r(*one[:4], sl, one[4], "bshd", mode, None, window, dsl))):
            for a, t in zip(acc, part):
                a[rows] = t[0]
    return g64, gr


@pytest.mark.parametrize("name", TRAINING)
def test_eager_backward_within_the_rule(name):
    make, call, form, window = TRAINING[name]
    q, k, v = make()
    res = call(q, k, v)
    res = res if isinstance(res, tuple) else (res,)
    out = res[0]
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(BF)
    out.backward(dout)
    with torch.no_grad():
        _, lse = (rtcattn.forward(q, k, v, window_size=window, return_lse=True) if form == "dense" else
                  rtcattn.forward_varlen(q, k, v, *_varlen_args(), window_size=window, return_lse=True))
    g64, gr = _references(q.detach(), k.detach(), v.detach(), out.detach(), lse, dout, form, window, MODES[name])
    for t, x64, xr, n in zip((q, k, v), g64, gr, "qkv"):
        ok, err, err_r = bref.within_rule(t.grad, xr, x64)
        assert ok, f"d{n}: max err {err} against R's {err_r}"


@pytest.mark.parametrize("which", [1, 2])
def test_only_k_or_v_requires_grad(which):
    q, k, v = dense(grad=False)
    inputs = [q, k, v]
    inputs[which].requires_grad_()
    _loss(rtcattn.forward(*inputs)).backward()
    assert inputs[which].grad is not None and inputs[which].grad.abs().sum() > 0
    assert all(t.grad is None for i, t in enumerate(inputs) if i != which)


def test_backward_through_lse_alone():
    """d LSE_i / d s_ij = P_ij: a loss on the LSE alone reaches q and k (and not v)."""
    q, k, v = packed()
    _, lse = rtcattn.forward_varlen(q, k, v, *_varlen_args(), causal=True, return_lse=True)
    dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(4))
    (lse * dlse).sum().backward()
    with torch.no_grad():
        out = rtcattn.forward_varlen(q, k, v, *_varlen_args(), causal=True)
    g64, gr = _references(q.detach(), k.detach(), v.detach(), out, lse.detach(), torch.zeros_like(out), "varlen",
                          (-1, 0), dlse=dlse)
    for t, x64, xr in zip((q, k, v), g64, gr):
        assert bref.within_rule(t.grad, xr, x64)[0]
    assert not v.grad.any()


@pytest.mark.parametrize("name", PAGED)
def test_paged_backward_raises_naming_the_block_table(name):
    q, k, v = paged()
    res = PAGED[name](q, k, v)  # the forward runs: inference code often has inputs that require grad
    with pytest.raises(NotImplementedError, match="block_table") as e:
        _loss(res).backward()
    assert "paged cache takes no gradients" in str(e.value)


@pytest.mark.parametrize("name", WRITING)
def test_out_call_refuses_grad_at_the_call_naming_the_function(name):
    make, call = WRITING[name]
    q, k, v = make()
    out = torch.zeros(q.shape, dtype=BF)
    with pytest.raises(NotImplementedError, match=OUT_REFUSED) as e:
        call(q, k, v, out)
    assert _names(str(e.value), name) and "out=" in str(e.value), str(e.value)
    assert not out.any()  # refused before the launch
    with torch.no_grad():
        call(q, k, v, out)
    assert out.any()


def test_kvcache_call_refuses_grad_at_the_call():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 2, 64, generator=gen).to(BF).requires_grad_()
    kc, vc = (torch.randn(1, 32, 2, 64, generator=gen).to(BF) for _ in range(2))
    with pytest.raises(NotImplementedError, match="KV cache") as e:
        rtcattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20)
    assert _names(str(e.value), "rtcattn.flash_attn_with_kvcache")


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


def test_aiter_varlen_out_takes_the_functional_calls_gradients():
    """aiter.rtcattn_varlen_fwd(out=...) runs the functional op, then copies into out: out carries its history."""
    q, k, v = packed()
    out = torch.zeros(q.shape, dtype=BF)
    res = _aiter().rtcattn_varlen_fwd(q, k, v, *_varlen_args(), out=out)
    assert res is out
    _loss(out).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _loss(_aiter().rtcattn_varlen_fwd(q, k, v, *_varlen_args())).backward()
    assert all(_same(a, t.grad) for a, t in zip(got, (q, k, v)))


def _grads(call, make):
    q, k, v = make()
    _loss(call(q, k, v)).backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("name", TRAINING)
def test_compiled_training_step_gives_the_eager_gradients(name):
    """AOTAutograd (what inductor uses) traces the forward and the backward ops with no graph break; the
    gradients are the eager ones, bit for bit."""
    make, call, _, _ = TRAINING[name]
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    assert all(_same(a, b) for a, b in zip(_grads(compiled, make), _grads(call, make)))


@pytest.mark.parametrize("name", WRITING)
def test_compiled_out_call_with_grad_is_refused_at_compile(name):
    make, call = WRITING[name]
    q, k, v = make()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=OUT_REFUSED) as e:  # torch._dynamo's Unsupported, quoting ours
        compiled(q, k, v, torch.zeros(q.shape, dtype=BF))
    assert _names(str(e.value), name)


def _outputs(fn, name, q, k, v):
    """What a call gives: its results, or for an out= call the out buffer it wrote (fresh zeros before)."""
    if name in TRAINING:
        res = fn(q, k, v)
        return res if isinstance(res, tuple) else (res,)
    out = torch.zeros(q.shape, dtype=BF)
    fn(q, k, v, out)
    return (out,)


@pytest.mark.parametrize("mode", ["no_grad", "inputs_without_grad"])
@pytest.mark.parametrize("name", list(TRAINING) + list(WRITING))
def test_compiled_inference_call_matches_eager(name, mode):
    make, call = (TRAINING[name][:2]) if name in TRAINING else WRITING[name]
    q, k, v = make(grad=mode == "no_grad")
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
        assert _same(_outputs(compiled, name, q, k, v), _outputs(call, name, q, k, v))


@pytest.mark.slow
def test_inductor_training_step_gives_the_eager_gradients_and_inference_matches():
    def call(q, k, v):
        return rtcattn.flash_attn_func(q, k, v, causal=True)
    compiled = torch.compile(call, fullgraph=True)
    assert all(_same(a, b) for a, b in zip(_grads(compiled, dense), _grads(call, dense)))
    q, k, v = dense()
    with torch.no_grad():
        assert _same(compiled(q, k, v), call(q, k, v))
