"""Dropout on the GPU: the sm_90a kernels (forward and backward, every head-dim bucket, dense and packed, windows, GQA,
bf16 and fp16, the backward's fused dQ and its deterministic DQ stage) and the baseline, each pinned: the kernel's mask
bit for bit against the host Philox, output and gradients against the fp64 references with that mask, and CUDA-graph
capture: two replays draw two masks, a reset generator replays the same ones (docs/numerics.md, "Dropout")."""
import pytest

torch = pytest.importorskip("torch")

import rtcattn  # noqa: E402
import score_mod_suite as sms  # noqa: E402
from rtcattn.ops.attention_bwd import reference as bref  # noqa: E402
from rtcattn.ops.attention_fwd import dropout, reference as ref  # noqa: E402
from rtcattn.runtime import dispatch  # noqa: E402

pytestmark = pytest.mark.gpu

BF = torch.bfloat16
KERNELS = ["sm90", "baseline"]


def _rand(shape, seed, scale=1.0, dtype=BF):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * scale).to(dtype)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_mask_is_the_host_philox(kernel, d, causal):
    """Read through V = identity (D = Sk): O_ij = P_ij Z_ij / l_i, nonzero exactly where element (i, j) is kept (the
    scores are small: every P_ij > 0); causal rows see only their keys, the rest is 0 in both."""
    b, hq, hk, sq, sk, p = 2, 4, 2, 200, d, 0.35
    q, k = _rand((b, sq, hq, sk), 1, 0.3), _rand((b, sk, hk, sk), 2, 0.3)
    v = torch.eye(sk, dtype=BF, device="cuda")[None, :, None, :].expand(b, sk, hk, sk).contiguous()
    rng = dropout.draw_rng_state(p, q.device)
    with dispatch.pinned(kernel=kernel):
        out = torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, False, -1, 0 if causal else -1, False,
                                    dropout_p=p, rng_state=rng)[0]
    got = (out.float().permute(0, 2, 1, 3) != 0).cpu()
    want = dropout.dense_keep_mask(rng, p, b, hq, sq, sk)
    if causal:
        want &= torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_kernel_mask_is_the_host_philox_by_sequence(kernel):
    """Packed sequences: b of the mask is the sequence; each sequence's V the identity of its keys (D = 64)."""
    lens_q, lens_k, hq, d, p = (70, 5, 130), (64, 17, 40), 4, 64, 0.4
    q = _rand((sum(lens_q), hq, d), 3, 0.3)
    k = _rand((sum(lens_k), 2, d), 4, 0.3)
    v = torch.cat([torch.eye(d, dtype=BF, device="cuda")[:n] for n in lens_k])[:, None, :].expand(-1, 2, d).contiguous()
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for lens in (lens_q, lens_k))
    rng = dropout.draw_rng_state(p, q.device)
    with dispatch.pinned(kernel=kernel):
        out = torch.ops.rtcattn.fwd_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), "rtne", None, False,
                                           dropout_p=p, rng_state=rng)[0]
    oq = 0
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        got = (out[oq:oq + lq, :, :lk].float().permute(1, 0, 2) != 0).cpu()
        assert torch.equal(got, dropout.keep_mask(rng, p, s, hq, lq, lk)), f"sequence {s}"
        oq += lq


def _check_dense(kernel, dtype, window, d, deterministic, b=2, sq=150, sk=190, hq=4, hk=2, p=0.25, score=None):
    q, k, v, dout = (_rand(s, i, 1.5 if i < 2 else 1.0, dtype) for i, s in
                     enumerate([(b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, hq, d)]))
    score = score or {}
    rng = dropout.draw_rng_state(p, q.device)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with dispatch.pinned(kernel=kernel):
        out, lse = torch.ops.rtcattn.fwd(qg, kg, vg, "bshd", "rtne", None, True, *window, deterministic, **score,
                                         dropout_p=p, rng_state=rng)
        out.backward(dout)
    cpu = [t.detach().cpu() for t in (q, k, v, out, lse, dout)]
    cscore = {n: (x.cpu() if torch.is_tensor(x) else x) for n, x in score.items()}
    drop = dict(dropout_p=p, rng_state=rng)
    o64, l64 = ref.reference_fp64(*cpu[:3], "bshd", None, window, **cscore, **drop)
    r = ref.reference_r(*cpu[:3], "bshd", "rtne", None, window, **cscore, **drop)
    err, err_r = ref.errors(cpu[3], o64)[0], ref.errors(r, o64)[0]
    assert err <= 2 * err_r + 1e-5, (err, err_r)
    assert bool(ref.lse_close(cpu[4], l64).all())
    g64 = bref.grads_fp64(*cpu[:3], cpu[5], "bshd", None, window, None, **cscore, **drop)
    gr = bref.grads_r(*cpu, "bshd", "rtne", None, window, None, **cscore, **drop)
    for n, g, xr, x64 in zip("qkv", (qg.grad, kg.grad, vg.grad), gr, g64):
        ok, e, e_r = bref.within_rule(g.cpu(), xr, x64)
        assert ok, f"d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (40, 7)])
def test_forward_and_gradients_with_the_mask(kernel, dtype, window):
    _check_dense(kernel, dtype, window, 128, False)


@pytest.mark.parametrize("d", [32, 64, 96, 192, 256, 80])
@pytest.mark.parametrize("deterministic", [False, True])
def test_sm90_every_bucket_with_the_mask(d, deterministic):
    """Every head-dim bucket of the sm_90a kernels (80: a call below its bucket), causal, the backward's fused dQ and
    its deterministic DQ stage."""
    _check_dense("sm90", BF, (-1, 0), d, deterministic, sq=260, sk=300)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d", [128, 192])
def test_dropout_with_the_soft_cap_and_alibi(kernel, d):
    """Both score modifications with dropout; at 192 the sm90 backward's DQ stage takes 32-key steps with them (its
    plan's dq_keys_mods_drop: sm90/plan.h)."""
    _check_dense(kernel, BF, (-1, 0), d, False, score=dict(softcap=2.0, alibi_slopes=sms.slopes("batch", 2, 4,
                                                                                               "cuda")))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_packed_forward_and_gradients_by_sequence(kernel, deterministic):
    lens_q, lens_k, hq, d, p = (70, 0, 133, 12), (200, 5, 133, 1), 4, 128, 0.2
    q, k = _rand((sum(lens_q), hq, d), 7, 1.5), _rand((sum(lens_k), 2, d), 8, 1.5)
    v, dout = _rand((sum(lens_k), 2, d), 9), _rand((sum(lens_q), hq, d), 10)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for lens in (lens_q, lens_k))
    rng = dropout.draw_rng_state(p, q.device)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with dispatch.pinned(kernel=kernel):
        out, lse = torch.ops.rtcattn.fwd_varlen(qg, kg, vg, cu_q, cu_k, max(lens_q), max(lens_k), "rtne", None, True,
                                                -1, 0, deterministic=deterministic, dropout_p=p, rng_state=rng)
        out.backward(dout)
    c = [t.detach().cpu() for t in (q, k, v, out, lse, dout, cu_q, cu_k)]
    o64, _ = ref.reference_varlen(*c[:3], c[6], c[7], None, None, (-1, 0), dropout_p=p, rng_state=rng)
    r = ref.reference_varlen(*c[:3], c[6], c[7], "rtne", None, (-1, 0), dropout_p=p, rng_state=rng)
    assert ref.errors(c[3], o64)[0] <= 2 * ref.errors(r, o64)[0] + 1e-5
    oq = ok = 0
    grads = [t.grad.cpu() for t in (qg, kg, vg)]
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rq, rk = slice(oq, oq + lq), slice(ok, ok + lk)
        if lq and lk:
            one = [t[None] for t in (c[0][rq], c[1][rk], c[2][rk])]
            drop = dict(dropout_p=p, rng_state=rng, first_b=s)
            g64 = bref.grads_fp64(*one, c[5][rq][None], "bshd", None, (-1, 0), None, **drop)
            gr = bref.grads_r(*one, c[3][rq][None], c[4][:, rq][None], c[5][rq][None], "bshd", "rtne", None, (-1, 0),
                              None, **drop)
            for n, g, xr, x64 in zip("qkv", (grads[0][rq], grads[1][rk], grads[2][rk]), gr, g64):
                ok_, e, e_r = bref.within_rule(g[None], xr, x64)
                assert ok_, f"sequence {s} d{n}: {e:.3g} > 2 x {e_r:.3g} + 1e-5"
        oq, ok = oq + lq, ok + lk


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
