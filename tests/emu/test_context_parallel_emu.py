"""Context parallelism (rtcattn.distributed) on CPU processes over gloo, each on the emulated gfx942: 2 and 4 ranks,
zigzag and contiguous sharding, causal and not, windows (one-sided with causal, two-sided without), GQA, both layouts,
bf16 and fp16. The unsharded result meets the numerics contract's accuracy rule against the fp64 reference of the
whole sequence (numerics_suite.check_accuracy's: err <= 2 err(R) + 1e-5, the normwise bound, the LSE within 1e-4, rows
that see no key 0 with LSE -Inf), stays within the merge's bound of the single call (docs/numerics.md, "Context
parallel": 2 eps max|V| of q's dtype), and a second run gives the same bits; the backward (the ring in reverse, dK / dV
travelling home) meets the backward's rule against the fp64 gradients widened by the partials' roundings: each
(query chunk, key chunk) pair's gradient comes out of the kernel rounded to q's dtype before the fp32 sum, at most
2W of them a key element under zigzag, W under contiguous: + pairs x eps / 2 x max|g64| (docs/numerics.md)."""
import os

import pytest
import torch

import numerics_suite as suite
from rtcattn.ops.attention_bwd import reference as bref
from rtcattn.ops.attention_fwd import reference as ref

pytestmark = pytest.mark.emu

# (causal, window, sharding, layout, dtype, hk)
CASES = [
    (True, (-1, -1), "zigzag", "bshd", torch.bfloat16, 1),
    (False, (-1, -1), "contiguous", "bshd", torch.bfloat16, 2),
    (True, (-1, -1), "contiguous", "bhsd", torch.float16, 1),
    (True, (5, -1), "zigzag", "bhsd", torch.bfloat16, 2),
    (False, (3, 9), "zigzag", "bshd", torch.bfloat16, 1),
    (True, (20, -1), "contiguous", "bshd", torch.bfloat16, 2),
]
B, S, H, D = 1, 64, 2, 64


@pytest.fixture(autouse=True)
def emulate(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def inputs(layout, dtype, hk, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g).to(dtype)
    k, v = (torch.randn(B, S, hk, D, generator=g).to(dtype) for _ in range(2))
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q, k, v


def dout_of(q, n):
    return torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + n)).to(q.dtype)


def _rank(rank, world, path, out_dir):
    import torch.distributed as dist
    os.environ["RTCATTN_EMULATE"] = "gfx942"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    from rtcattn import distributed as cp
    try:
        for n, (causal, window, sharding, layout, dtype, hk) in enumerate(CASES):
            seq_dim = 1 if layout == "bshd" else 2
            q, k, v = inputs(layout, dtype, hk, seed=n)
            dout = dout_of(q, n)
            mine = [cp.shard(t, rank, world, sharding, seq_dim=seq_dim).requires_grad_() for t in (q, k, v)]
            runs = []
            for _ in range(2):
                out, lse = cp.context_parallel_attention(*mine, causal=causal, window_size=window, layout=layout,
                                                         sharding=sharding, return_lse=True)
                runs.append([cp.unshard(t.detach(), sharding=sharding, seq_dim=dim)
                             for t, dim in ((out, seq_dim), (lse, 2))])
            out.backward(cp.shard(dout, rank, world, sharding, seq_dim=seq_dim))
            grads = [cp.unshard(t.grad, sharding=sharding, seq_dim=seq_dim) for t in mine]
            if rank == 0:
                torch.save((*runs[0], *runs[1], *grads), os.path.join(out_dir, f"case{n}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def ranked(request, tmp_path_factory):
    """{case index: (out, lse, out again, lse again)} of the whole sequence, from `world` gloo processes."""
    import torch.multiprocessing as mp
    world = request.param
    where = tmp_path_factory.mktemp(f"cp{world}")
    mp.start_processes(_rank, args=(world, str(where / "rendezvous"), str(where)), nprocs=world,
                       start_method="spawn")
    got = {n: torch.load(where / f"case{n}.pt") for n in range(len(CASES))}
    return world, got


@pytest.mark.parametrize("n", range(len(CASES)), ids=[f"{'causal' if c[0] else 'full'}-w{c[1][0]},{c[1][1]}-{c[2]}-"
                                                      f"{c[3]}-{str(c[4])[6:]}-hk{c[5]}" for c in CASES])
def test_whole_sequence_against_fp64_and_the_single_call(ranked, n):
    world, got = ranked
    causal, window, sharding, layout, dtype, hk = CASES[n]
    q, k, v = inputs(layout, dtype, hk, seed=n)
    out, lse, out2, lse2, *grads = got[n]
    w = (window[0], 0) if causal else window
    o64, lse64 = ref.reference_fp64(q, k, v, layout, None, w)
    r = ref.reference_r(q, k, v, layout, "rtne", None, w)
    err, nrm = ref.errors(out, o64)
    err_r, _ = ref.errors(r, o64)
    tag = f"{world} ranks, case {CASES[n]}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2 err(R) {err_r:.3g} + 1e-5: {tag}"
    assert nrm < suite.NORMWISE_BOUND[dtype], tag
    assert bool(ref.lse_close(lse, lse64).all()), tag
    empty = lse64 == -float("inf")
    o_bhsd = out if layout == "bhsd" else out.transpose(1, 2)
    assert bool((o_bhsd[empty] == 0).all()), tag
    import rtcattn
    single = rtcattn.forward(q, k, v, layout=layout, causal=causal, window_size=window)
    bound = 2 * torch.finfo(dtype).eps * v.float().abs().max()   # the merge's bound (docs/numerics.md)
    assert float((out.float() - single.float()).abs().max()) <= bound, tag
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)) and torch.equal(lse, lse2), tag
    # the backward: the ring in reverse, against the fp64 gradients by the backward's rule (docs/numerics.md)
    dout = dout_of(q, n)
    s_out, s_lse = rtcattn.forward(q, k, v, layout=layout, causal=causal, window_size=window, return_lse=True)
    g64 = bref.grads_fp64(q, k, v, dout, layout, None, w)
    gr = bref.grads_r(q, k, v, s_out, s_lse, dout, layout, "rtne", None, w)
    pairs = 2 * world if sharding == "zigzag" else world   # rounded partials summed into one gradient element
    for name, x, xr, x64 in zip("qkv", grads, gr, g64):
        _, e, e_r = bref.within_rule(x, xr, x64)
        extra = pairs * 0.5 * torch.finfo(dtype).eps * float(x64.abs().max())
        assert e <= 2 * e_r + 1e-5 + extra and x.dtype == dtype, (
            f"d{name}: max |d{name} - fp64| {e} > 2 x {e_r} + 1e-5 (R's) + {extra:.3g} (partials' roundings): {tag}")


def test_bad_arguments_are_named():
    """Checks that need no process group run before it is asked for."""
    from rtcattn import distributed as cp
    with pytest.raises(ValueError, match="sharding='ring'"):
        cp.shard(torch.zeros(1, 8, 1, 8), 0, 2, "ring")
    with pytest.raises(ValueError, match=r"x.shape\[1\]=6 is not supported .* a multiple of 4"):
        cp.shard(torch.zeros(1, 6, 1, 8), 0, 2, "zigzag")
