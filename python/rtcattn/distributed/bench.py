"""`python -m rtcattn bench --suite context_parallel`: context_parallel_attention on the GPUs of one host (NCCL,
NCCL_NVLS_ENABLE=0) against one GPU, GQA 32/8, D 128, bf16, one layer's attention forward:

- t1: rtcattn.forward over the whole sequence on one GPU (where it fits);
- t2: the ring over W GPUs (each rank its zigzag / contiguous shard; the slowest rank's time, CUDA events, the ranks
  lined up by a barrier before each round);
- efficiency t1 / (W t2);
- hidden communication: the ring's time with its sends and receives (t2) against the same calls on the rank's own
  shard with no P2P (t_compute) and the P2P alone (t_comm): hidden = 1 - (t2 - t_compute) / t_comm.

The ranks are processes this command spawns (torch.multiprocessing); `--cp-lengths` and `--cp-world` choose the
sizes. `--dry-run` lists the cases (no GPU needed).

`--cp-compute-only` (one GPU): each rank's calls of the ring in turn on the one GPU, without P2P (t_compute of
every rank, as above), and t1: the ring's compute side alone, its bound on the efficiency t1 / (W max t_compute).
No t2 and no hidden share: those need the ranks' GPUs."""
from __future__ import annotations

import os
import statistics

from ..tools import bench as driver

LENGTHS = (131072, 262144, 524288, 1048576)
HQ, HK, D = 32, 8, 128
CASES = (("causal", "zigzag"), ("full", "contiguous"))


def add_arguments(p) -> None:
    p.add_argument("--cp-lengths", default=",".join(map(str, LENGTHS)),
                   help="context_parallel: the sequence lengths, comma-separated")
    p.add_argument("--cp-world", type=int, default=2, help="context_parallel: GPUs of one host to spread over")
    p.add_argument("--cp-compute-only", action="store_true",
                   help="context_parallel on one GPU: every rank's calls of the ring in turn, without P2P (the "
                        "ring's compute side and its bound on the efficiency; no t2, no hidden share)")


def _lengths(args) -> list:
    out = []
    for part in str(args.cp_lengths).split(","):
        n = int(part)
        if n <= 0 or n % (2 * args.cp_world * 128):
            raise ValueError(f"--cp-lengths entry {n} is not supported; accepted: positive multiples of "
                             f"{2 * args.cp_world * 128} (2 x world x 128)")
        out.append(n)
    return out


def plan(args):
    rows = [{"S": s, "mask": mask, "sharding": sharding, "world": args.cp_world, "Hq/Hk": f"{HQ}/{HK}", "D": D,
             "attention TFLOP": round(4 * s * s * HQ * D / (2 if mask == "causal" else 1) / 1e12, 2)}
            for s in _lengths(args) for mask, sharding in CASES]
    for r in rows:
        print("  ".join(f"{k} {v}" for k, v in r.items()))
    return {"rows": rows}


def _time(torch, fn, reps: int) -> float:
    """Median ms of fn over reps rounds (CUDA events; a barrier lines the ranks up first when distributed)."""
    import torch.distributed as dist
    times = []
    for _ in range(reps + 1):
        if dist.is_initialized():
            dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[1:])


def _rank(rank, world, path, lengths, reps, out_path):
    import torch
    import torch.distributed as dist
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        rows = [_measure(torch, dist, s, mask, cut, world, rank, reps) for s in lengths for mask, cut in CASES]
        if rank == 0:
            torch.save(rows, out_path)
    finally:
        dist.destroy_process_group()


def _measure(torch, dist, s, mask, cut, world, rank, reps) -> dict:
    """One case's times on this rank (t2 the slowest rank's; t1 on rank 0 only)."""
    from .. import api
    from . import ring
    causal = mask == "causal"
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = [torch.randn(1, s // world, h, D, device="cuda", generator=g, dtype=torch.bfloat16) for h in (HQ, HK, HK)]
    t2 = _time(torch, lambda: ring.context_parallel_attention(*qkv, causal=causal, sharding=cut), reps)
    t_compute = _time(torch, lambda: _compute_only(torch, ring, *qkv, causal, cut, world, rank), reps)
    t_comm = _time(torch, lambda: _comm_only(torch, dist, *qkv[1:], world, rank), reps)
    every = [torch.zeros(1, device="cuda") for _ in range(world)]
    dist.all_gather(every, torch.tensor([t2], device="cuda"))
    row = {"S": s, "mask": mask, "sharding": cut, "t2 ms": max(float(t) for t in every), "t_compute ms": t_compute,
           "t_comm ms": t_comm, "t1 ms": None}
    qkv.clear()
    torch.cuda.empty_cache()
    if rank == 0:
        try:
            whole = [torch.randn(1, s, h, D, device="cuda", generator=g, dtype=torch.bfloat16) for h in (HQ, HK, HK)]
            row["t1 ms"] = _time_single(torch, api, *whole, causal, reps)
        except torch.cuda.OutOfMemoryError:  # the whole sequence does not fit one GPU: no t1
            pass
        torch.cuda.empty_cache()
    return row


def _time_single(torch, api, q, k, v, causal, reps):
    def one():
        api.forward(q, k, v, causal=causal)
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        one()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[1:])


def _compute_only(torch, ring, q, k, v, causal, cut, world, rank):
    """The ring's calls with every step's K/V the rank's own shard and no P2P: what the ring costs without its
    communication."""
    chunk = q.shape[1] // (2 if cut == "zigzag" else 1)
    plan = ring._Plan(None, world, rank, list(range(world)), cut, 1, "bshd", chunk, -1, 0 if causal else -1,
                      q.shape[-1] ** -0.5, "rtne")
    acc_o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    acc_lse = torch.full(ring._lse_shape(q, "bshd"), -ring.INF, dtype=torch.float32, device=q.device)
    merged = []
    for step in range(world):
        ring.attend_step(plan, q, k, v, acc_o, acc_lse, (rank - step) % world, merged)


def _comm_only(torch, dist, k, v, world, rank):
    """The ring's sends and receives alone: world - 1 shifts of the K/V shard."""
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    kv = (k, v)
    for _ in range(world - 1):
        incoming = tuple(torch.empty_like(t) for t in kv)
        ops = [dist.P2POp(dist.isend, t, nxt) for t in kv] + [dist.P2POp(dist.irecv, t, prev) for t in incoming]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        kv = incoming


def _compute_rows(torch, lengths, world, reps) -> list:
    """--cp-compute-only: on this one GPU, each rank's ring calls (its own shard as every step's K/V, no P2P) and
    the single call over the whole sequence."""
    from .. import api
    from . import ring
    rows = []
    for s in lengths:
        for mask, cut in CASES:
            causal = mask == "causal"
            g = torch.Generator(device="cuda").manual_seed(0)
            qkv = [torch.randn(1, s // world, h, D, device="cuda", generator=g, dtype=torch.bfloat16)
                   for h in (HQ, HK, HK)]
            per_rank = [_time(torch, lambda r=r, qkv=qkv, causal=causal, cut=cut:
                              _compute_only(torch, ring, *qkv, causal, cut, world, r), reps) for r in range(world)]
            qkv.clear()
            torch.cuda.empty_cache()
            row = {"S": s, "mask": mask, "sharding": cut, "t_compute ms": max(per_rank),
                   "t_compute per rank ms": per_rank, "t1 ms": None, "t2 ms": None, "t_comm ms": None}
            try:
                whole = [torch.randn(1, s, h, D, device="cuda", generator=g, dtype=torch.bfloat16)
                         for h in (HQ, HK, HK)]
                row["t1 ms"] = _time_single(torch, api, *whole, causal, reps)
                del whole
            except torch.cuda.OutOfMemoryError:
                pass
            torch.cuda.empty_cache()
            rows.append(row)
    return rows


def _run_compute_only(args, torch, lengths, reps):
    world = args.cp_world
    rows = _compute_rows(torch, lengths, world, reps)
    print(f"{'S':>8} {'mask':6} {'sharding':10} {'t1 ms':>9} {'compute':>9} {'per rank':>20} {'bound':>6}")
    for r in rows:
        t1 = r["t1 ms"]
        r["compute efficiency"] = t1 / (world * r["t_compute ms"]) if t1 else None
        ranks = "/".join(f"{t:.2f}" for t in r["t_compute per rank ms"])
        print(f"{r['S']:>8} {r['mask']:6} {r['sharding']:10} {t1 if t1 else float('nan'):>9.2f} "
              f"{r['t_compute ms']:>9.2f} {ranks:>20} "
              f"{r['compute efficiency'] if r['compute efficiency'] else float('nan'):>6.3f}")
    print(f"(one GPU, GQA {HQ}/{HK}, D {D}, bf16, one layer's attention forward; each of {world} ranks' ring calls "
          f"in turn without P2P; bound = t1 / ({world} max compute): the efficiency the ring's compute side "
          f"allows; t2 and the hidden share need {world} GPUs)")
    return {"rows": rows, "compute_only": True}


def run(args):
    import tempfile

    import torch
    import torch.multiprocessing as mp
    world = args.cp_world
    if getattr(args, "cp_compute_only", False):
        if not torch.cuda.is_available():
            raise RuntimeError("--suite context_parallel --cp-compute-only needs a GPU")
        return _run_compute_only(args, torch, _lengths(args), max(2, min(args.reps, 5)))
    if torch.cuda.device_count() < world:
        raise RuntimeError(f"--suite context_parallel needs {world} GPUs of one host; this one has "
                           f"{torch.cuda.device_count()}")
    lengths = _lengths(args)
    reps = max(2, min(args.reps, 5))
    with tempfile.TemporaryDirectory() as where:
        out_path = os.path.join(where, "rows.pt")
        mp.start_processes(_rank, args=(world, os.path.join(where, "rendezvous"), lengths, reps, out_path),
                           nprocs=world, start_method="spawn")
        rows = torch.load(out_path)
    print(f"{'S':>8} {'mask':6} {'sharding':10} {'t1 ms':>9} {'t2 ms':>9} {'eff':>6} {'compute':>9} {'comm':>9} "
          f"{'hidden':>7}")
    for r in rows:
        t1 = r.get("t1 ms")
        r["efficiency"] = t1 / (world * r["t2 ms"]) if t1 else None
        exposed = max(0.0, r["t2 ms"] - r["t_compute ms"])
        r["hidden"] = 1.0 - exposed / r["t_comm ms"] if r["t_comm ms"] > 0 else None
        print(f"{r['S']:>8} {r['mask']:6} {r['sharding']:10} {t1 if t1 else float('nan'):>9.2f} {r['t2 ms']:>9.2f} "
              f"{r['efficiency'] if r['efficiency'] else float('nan'):>6.3f} {r['t_compute ms']:>9.2f} "
              f"{r['t_comm ms']:>9.2f} {r['hidden'] if r['hidden'] is not None else float('nan'):>7.3f}")
    print(f"(GQA {HQ}/{HK}, D {D}, bf16, one layer's attention forward; {world} GPUs; efficiency = t1 / "
          f"({world} t2); hidden = 1 - (t2 - compute) / comm)")
    return {"rows": rows}


driver.register("context_parallel", run, "context_parallel_attention over the GPUs of one host against one GPU "
                "(--cp-lengths, --cp-world)", add_arguments, plan=plan)
