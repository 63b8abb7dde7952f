"""The refused backward on the GPU (the CUDA dispatch keys): eagerly and through torch.compile's default
backend (inductor), a backward raises naming the function, an out= call with grad is refused at the
call, and compiled inference equals eager bit for bit."""
import pytest

torch = pytest.importorskip("torch")

import rtcattn  # noqa: E402

pytestmark = pytest.mark.gpu

BF = torch.bfloat16
NOT_AVAILABLE = "the backward pass is not available yet"


def _dense(grad=True):
    gen = torch.Generator(device="cuda").manual_seed(1)
    return tuple(torch.randn(2, 300, 4, 128, device="cuda", generator=gen).to(BF).requires_grad_(grad)
                 for _ in range(3))


def _packed(grad=True):
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(300, 4, 128, device="cuda", generator=gen).to(BF).requires_grad_(grad) for _ in range(3))
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
    return q, k, v, cu


def _flash(q, k, v):
    return rtcattn.flash_attn_func(q, k, v, causal=True)


def _varlen(q, k, v, cu):
    return rtcattn.flash_attn_varlen_func(q, k, v, cu, cu, 200, 200, causal=True)


@pytest.mark.parametrize("name,make,call", [("rtcattn.flash_attn_func", _dense, _flash),
                                            ("rtcattn.flash_attn_varlen_func", _packed, _varlen)])
def test_eager_and_compiled_backward_raise_naming_the_function(name, make, call):
    args = make()
    for fn in (call, torch.compile(call, fullgraph=True)):
        out = fn(*args)
        with pytest.raises(NotImplementedError, match=NOT_AVAILABLE) as e:
            out.float().square().sum().backward()
        assert name in str(e.value)
    assert all(t.grad is None for t in args if isinstance(t, torch.Tensor) and t.is_floating_point())


def test_out_call_with_grad_is_refused_at_the_call():
    q, k, v = _dense()
    out = torch.zeros_like(q, requires_grad=False)
    with pytest.raises(NotImplementedError, match=r"rtcattn\.forward\(out=\.\.\.\)"):
        rtcattn.forward(q, k, v, out=out)
    with torch.no_grad():
        assert rtcattn.forward(q, k, v, out=out) is out


@pytest.mark.parametrize("make,call", [(_dense, _flash), (_packed, _varlen)])
def test_compiled_inference_equals_eager(make, call):
    compiled = torch.compile(call, fullgraph=True)
    for grad in (True, False):
        args = make(grad)
        with torch.no_grad() if grad else torch.enable_grad():
            got, want = compiled(*args), call(*args)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
