"""What the context-parallel tests share (tests/emu/test_context_parallel_emu.py over gloo on the emulator,
tests/gpu/test_context_parallel_gpu.py over NCCL on GPUs): the cases, the ranks' work (spawned processes, each
computing its shard forward twice and backward, rank 0 saving the unsharded results) and the checks against the
whole sequence (docs/numerics.md §14)."""
import os

import torch

import numerics_suite as suite
from rtcattn.ops.attention_bwd import reference as bref
from rtcattn.ops.attention_fwd import reference as ref

LABEL = "{}-w{},{}-{}-{}-{}-hk{}"


def label(case) -> str:
    causal, window, sharding, layout, dtype, hk = case
    return LABEL.format("causal" if causal else "full", *window, sharding, layout, str(dtype)[6:], hk)


def inputs(layout, dtype, hk, seed, shape, device="cpu"):
    """q, k, v of the whole sequence: shape = (B, S, Hq, D), k / v with hk heads."""
    b, s, h, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g).to(dtype)
    k, v = (torch.randn(b, s, hk, d, generator=g).to(dtype) for _ in range(2))
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return tuple(t.to(device) for t in (q, k, v))


def dout_of(q, n):
    return torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + n)).to(q.dtype).to(q.device)


def _rank(rank, world, path, out_dir, backend, cases, shape, env):
    import torch.distributed as dist
    os.environ.update(env)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world)
    from rtcattn import distributed as cp
    try:
        for n, (causal, window, sharding, layout, dtype, hk) in enumerate(cases):
            seq_dim = 1 if layout == "bshd" else 2
            q, k, v = inputs(layout, dtype, hk, n, shape, device)
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
                torch.save([t.cpu() for t in (*runs[0], *runs[1], *grads)], os.path.join(out_dir, f"case{n}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(world, backend, cases, shape, where, env):
    """{case index: (out, lse, out again, lse again, dq, dk, dv)} of the whole sequence, from `world` processes."""
    import torch.multiprocessing as mp
    mp.start_processes(_rank, args=(world, str(where / "rendezvous"), str(where), backend, cases, shape, env),
                       nprocs=world, start_method="spawn")
    return {n: torch.load(where / f"case{n}.pt") for n in range(len(cases))}


def check_case(world, case, n, shape, got, device="cpu"):
    """The whole sequence's result from `world` ranks against fp64 and the single call, forward and backward."""
    import rtcattn
    causal, window, sharding, layout, dtype, hk = case
    q, k, v = inputs(layout, dtype, hk, n, shape, device)
    out, lse, out2, lse2, *grads = (t.to(device) for t in got[n])
    w = (window[0], 0) if causal else window
    o64, lse64 = ref.reference_fp64(q, k, v, layout, None, w)
    r = ref.reference_r(q, k, v, layout, "rtne", None, w)
    err, nrm = ref.errors(out, o64)
    err_r, _ = ref.errors(r, o64)
    tag = f"{world} ranks, case {label(case)}"
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2 err(R) {err_r:.3g} + 1e-5: {tag}"
    assert nrm < suite.NORMWISE_BOUND[dtype], tag
    assert bool(ref.lse_close(lse, lse64).all()), tag
    empty = lse64 == -float("inf")
    o_bhsd = out if layout == "bhsd" else out.transpose(1, 2)
    assert bool((o_bhsd[empty] == 0).all()), tag
    single, s_lse = rtcattn.forward(q, k, v, layout=layout, causal=causal, window_size=window, return_lse=True)
    bound = 2 * torch.finfo(dtype).eps * v.float().abs().max()   # the merge's bound (docs/numerics.md §14)
    assert float((out.float() - single.float()).abs().max()) <= bound, tag
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)) and torch.equal(lse, lse2), tag
    # the backward: the ring again, against the fp64 gradients by the backward's rule (docs/numerics.md §11, §14)
    dout = dout_of(q, n)
    g64 = bref.grads_fp64(q, k, v, dout, layout, None, w)
    gr = bref.grads_r(q, k, v, single, s_lse, dout, layout, "rtne", None, w)
    pairs = 2 * world if sharding == "zigzag" else world   # rounded partials summed into one gradient element
    for name, x, xr, x64 in zip("qkv", grads, gr, g64):
        _, e, e_r = bref.within_rule(x, xr, x64)
        extra = pairs * 0.5 * torch.finfo(dtype).eps * float(x64.abs().max())
        assert e <= 2 * e_r + 1e-5 + extra and x.dtype == dtype, (
            f"d{name}: max |d{name} - fp64| {e} > 2 x {e_r} + 1e-5 (R's) + {extra:.3g} (partials' roundings): {tag}")
