"""Dropout on the GPU (the kernel dispatch picks; the baseline until a fast kernel lists the dropout axis): the
kernel's mask bit for bit against the host Philox, output and gradients against the fp64 references with that mask,
and CUDA-graph capture: two replays draw two masks, a reset generator replays the same ones (docs/numerics.md,
"Dropout")."""
import pytest

torch = pytest.importorskip("torch")

import rtcattn  # noqa: E402
from rtcattn.ops.attention_bwd import reference as bref  # noqa: E402
from rtcattn.ops.attention_fwd import dropout, reference as ref  # noqa: E402

pytestmark = pytest.mark.gpu

BF = torch.bfloat16


def _rand(shape, seed, scale=1.0, dtype=BF):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * scale).to(dtype)


def test_kernel_mask_is_the_host_philox():
    b, hq, hk, sq, sk = 2, 4, 2, 70, 64
    q, k = _rand((b, sq, hq, sk), 1, 0.3), _rand((b, sk, hk, sk), 2, 0.3)
    v = torch.eye(sk, dtype=BF, device="cuda")[None, :, None, :].expand(b, sk, hk, sk).contiguous()
    rng = dropout.draw_rng_state(0.35, q.device)
    out = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, False, -1, -1, False, dropout_p=0.35,
                                rng_state=rng)[0]
    got = (out.float().permute(0, 2, 1, 3) != 0).cpu()
    assert torch.equal(got, dropout.dense_keep_mask(rng, 0.35, b, hq, sq, sk))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_forward_and_gradients_with_the_mask(dtype, window):
    b, sq, sk, hq, hk, d, p = 2, 150, 190, 4, 2, 128, 0.25
    q, k, v, dout = (_rand(s, i, 1.5 if i < 2 else 1.0, dtype) for i, s in
                     enumerate([(b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, hq, d)]))
    rng = dropout.draw_rng_state(p, q.device)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = torch.ops.rtcattn.fwd(qg, kg, vg, "bshd", "rtne", None, True, *window, False, dropout_p=p,
                                     rng_state=rng)
    out.backward(dout)
    cpu = [t.detach().cpu() for t in (q, k, v, out, lse, dout)]
    drop = dict(dropout_p=p, rng_state=rng)
    o64, l64 = ref.reference_fp64(*cpu[:3], "bshd", None, window, **drop)
    r = ref.reference_r(*cpu[:3], "bshd", "rtne", None, window, **drop)
    assert ref.errors(cpu[3], o64)[0] <= 2 * ref.errors(r, o64)[0] + 1e-5
    assert bool(ref.lse_close(cpu[4], l64).all())
    g64 = bref.grads_fp64(*cpu[:3], cpu[5], "bshd", None, window, None, **drop)
    gr = bref.grads_r(*cpu, "bshd", "rtne", None, window, None, **drop)
    for n, g, xr, x64 in zip("qkv", (qg.grad, kg.grad, vg.grad), gr, g64):
        ok, e, e_r = bref.within_rule(g.cpu(), xr, x64)
        assert ok, f"d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"


def test_cuda_graph_replays_draw_new_masks_and_a_reset_generator_repeats_them():
    q, k, v = (_rand((2, 64, 4, 64), 10 + i) for i in range(3))
    call = lambda: rtcattn.forward(q, k, v, dropout_p=0.5)  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()  # build and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    torch.cuda.manual_seed(1234)
    graph.replay()
    first = out.clone()
    graph.replay()
    second = out.clone()
    torch.cuda.manual_seed(1234)
    graph.replay()
    again = out.clone()
    torch.cuda.synchronize()
    assert not torch.equal(first, second), "two replays drew the same mask"
    assert torch.equal(first, again), "a reset generator did not repeat the first replay's mask"
    eager = rtcattn.forward(q, k, v)
    assert not torch.equal(first, eager)
