"""The backward on the GPU (the CUDA dispatch keys; the sm90 kernel on sm_90a, the baseline elsewhere): the numerics of
tests/backward_suite.py on CUDA tensors, autograd eagerly and through torch.compile's default backend (inductor) with
the eager bits, a paged call's backward refused naming the block table, an out= call with grad refused at the call."""
import pytest

torch = pytest.importorskip("torch")

import backward_suite as suite  # noqa: E402
import rtcattn  # noqa: E402

pytestmark = pytest.mark.gpu

BF = torch.bfloat16


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (33, 5)])
def test_dense_windows_and_layouts(layout, window):
    suite.check_dense("cuda", layout, 2, 8, 2, 300, 257, 128, window=window, what=f"{layout} {window}")


@pytest.mark.parametrize("d", [8, 40, 64, 59, 96, 160, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_head_dims_and_dtypes(d, dtype):
    suite.check_dense("cuda", "bshd", 1, 4, 1, 130, 97, d, window=(-1, 0), dtype=dtype, what=f"D {d}")


@pytest.mark.parametrize("d,window,dtype", [(128, (-1, 0), torch.bfloat16), (192, (100, 30), torch.bfloat16),
                                             (64, (-1, -1), torch.float16), (256, (-1, 0), torch.float16)])
def test_longer_sequences(d, window, dtype):
    """Many key blocks and row steps a CTA (the sm_90a kernel's rings, its window's cut and skipped blocks)."""
    suite.check_dense("cuda", "bshd", 1, 4, 2, 700, 900, d, window=window, dtype=dtype, what=f"D {d} {window}")


def test_dispatch_picks_the_sm90_kernel_on_hopper():
    from rtcattn.ops.attention_bwd import selection
    hopper = torch.cuda.get_device_capability()[0] == 9
    for d in (40, 128, 200, 256):
        q, k, v = (torch.randn(1, 70, 2, d, device="cuda").to(BF) for _ in range(3))
        out, lse = rtcattn.forward(q, k, v, return_lse=True)
        name = selection(out, q, k, v, out, lse).variant.name
        assert name.startswith("sm90-" if hopper else "baseline-"), (d, name)


@pytest.mark.parametrize("mode", ["rtna", "rtz"])
def test_modes(mode):
    suite.check_dense("cuda", "bshd", 1, 2, 2, 64, 80, 64, mode=mode, window=(-1, 0), what=mode)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_packed(window):
    suite.check_packed("cuda", [17, 0, 1, 300, 129], [40, 3, 1, 300, 0], 4, 2, 64, window=window)


def test_empty_rows_unseen_keys_and_determinism():
    suite.check_empty_rows_and_unseen_keys("cuda")
    for d in (64, 128, 256):
        suite.check_determinism("cuda", d=d, sk=900)


@pytest.mark.parametrize("d", [40, 96, 128, 192])
def test_deterministic_path(d):
    """deterministic=True: the sm90 kernel's DQ stage instead of the fused dQ (up to head dim 128; past it both take
    the DQ stage), dense with a window and packed."""
    suite.check_dense("cuda", "bshd", 1, 4, 2, 300, 700, d, window=(-1, 0), what=f"D {d} deterministic",
                      deterministic=True)
    suite.check_packed("cuda", [17, 0, 1, 300, 129], [40, 3, 1, 300, 0], 4, 2, d, deterministic=True)


def test_fused_dq_is_within_the_rule_and_close_to_the_deterministic_path():
    """The fused dQ (deterministic=False, the default) against the DQ stage's: within the rule each (check_dense), and
    dq within a few fp32 sums' order of each other (dk, dv: the same kernel code, the same bits)."""
    q, k, v, dout = suite.dense_inputs("bshd", 2, 4, 2, 500, 1100, 128, "cuda", seed=3)
    a = suite.dense_grads(q, k, v, dout, window=(-1, 0), deterministic=False)
    b = suite.dense_grads(q, k, v, dout, window=(-1, 0), deterministic=True)
    assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])
    assert torch.allclose(a[2].float(), b[2].float(), rtol=2e-2, atol=1e-3), (a[2] - b[2]).abs().max()


def test_training_step_loss_goes_down_as_with_sdpa():
    suite.check_training("cuda")


def _dense(grad=True):
    gen = torch.Generator(device="cuda").manual_seed(1)
    return tuple(torch.randn(2, 300, 4, 128, device="cuda", generator=gen).to(BF).requires_grad_(grad)
                 for _ in range(3))


def _flash(q, k, v):
    return rtcattn.flash_attn_func(q, k, v, causal=True)


def _grads(fn):
    q, k, v = _dense()
    fn(q, k, v).float().square().sum().backward()
    return q.grad, k.grad, v.grad


def test_compiled_training_step_gives_the_eager_gradients():
    compiled = torch.compile(_flash, fullgraph=True)
    for a, b in zip(_grads(compiled), _grads(_flash)):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_paged_backward_raises_naming_the_block_table():
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(40, 2, 64, device="cuda", generator=gen).to(BF).requires_grad_()
    k, v = (torch.randn(4, 16, 2, 64, device="cuda", generator=gen).to(BF).requires_grad_() for _ in range(2))
    cu_q = torch.tensor([0, 15, 40], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 20, 32], dtype=torch.int32, device="cuda")
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32, device="cuda")
    out = rtcattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 25, 20, causal=True, block_table=table)
    with pytest.raises(NotImplementedError, match="block_table"):
        out.float().sum().backward()


def test_out_call_with_grad_is_refused_at_the_call():
    q, k, v = _dense()
    out = torch.zeros_like(q, requires_grad=False)
    with pytest.raises(NotImplementedError, match=r"rtcattn\.forward\(out=\.\.\.\)"):
        rtcattn.forward(q, k, v, out=out)
    with torch.no_grad():
        assert rtcattn.forward(q, k, v, out=out) is out


def test_compiled_inference_equals_eager():
    compiled = torch.compile(_flash, fullgraph=True)
    for grad in (True, False):
        args = _dense(grad)
        with torch.no_grad() if grad else torch.enable_grad():
            got, want = compiled(*args), _flash(*args)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
