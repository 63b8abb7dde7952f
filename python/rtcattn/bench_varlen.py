"""`python -m rtcattn bench --shapes serving`: packed sequences and paged KV against FA4 and cuDNN.

Two problems, D 128, Hq 32, Hk 8 (timed like the dense bench: interleaved rounds, CUDA events, medians):
- varlen: 12 sequences of the serving issue's mix (32 225 tokens), causal and not. FA4 runs its own
  varlen call; cuDNN runs one SDPA call per sequence (what a dense-only library leaves a server with).
- chunked prefill: 8 sequences, 512 new queries over 4096 keys, causal. rtcattn and FA4 dense
  ([8, 512] over [8, 4096]), rtcattn packed, and rtcattn paged with pages of 16, 64, 128, 256 rows
  (shuffled page ids), FA4 paged where its version takes a page table.
FLOPs are 4 D H per (query, key) pair a row sees (causal: bottom-right), so Sq = Sk causal is half
of the full count, as FlashAttention reports it.
"""
from __future__ import annotations

import statistics
import sys

from . import bench

VARLEN_MIX = (8192, 4096, 4096, 2048, 1024, 1024, 512, 300, 7000, 1500, 333, 2100)
HQ, HK, D = 32, 8, 128
PREFILL = (8, 512, 4096)  # sequences, new queries, keys
PAGES = (16, 64, 128, 256)


def _pairs(sq: int, sk: int, causal: bool) -> int:
    if not causal:
        return sq * sk
    # row i sees keys j <= i + sk - sq
    return sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq))


def _flops(lens_q, lens_k, causal) -> float:
    return 4.0 * D * HQ * sum(_pairs(a, b, causal) for a, b in zip(lens_q, lens_k))


def _cu(lens, torch):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def _paged(k, v, lens, page, torch, seed=0):
    """k, v [total, Hk, D] -> pools [pages, page, Hk, D] with shuffled page ids, and the block table."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // page) for n in lens]
    order = torch.randperm(sum(need), generator=gen).tolist()
    pools = [torch.zeros(sum(need), page, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    table = torch.zeros(len(lens), max(need), dtype=torch.int32)
    start, nxt = 0, 0
    for s, n in enumerate(lens):
        for j in range(need[s]):
            pid, rows = order[nxt], min(page, n - j * page)
            nxt += 1
            table[s, j] = pid
            for pool, src in zip(pools, (k, v)):
                pool[pid, :rows] = src[start + j * page:start + j * page + rows]
        start += n
    return pools[0], pools[1], table.to("cuda")


def _fa4():
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        return flash_attn_func, flash_attn_varlen_func
    except ImportError:
        return None, None


def _first(res):
    return res[0] if isinstance(res, tuple) else res


def _time(fns: dict, inputs, reps, budget_s, f: float, label: str) -> list:
    ok = {}
    for name, fn in fns.items():
        try:
            fn(*inputs[0])
            ok[name] = fn
        except (RuntimeError, TypeError, ValueError, AssertionError) as e:
            print(f"  {label}: {name} skipped ({type(e).__name__}: {str(e).splitlines()[0][:100]})", file=sys.stderr)
    times = bench.time_rounds(ok, inputs, reps, budget_s)
    peers = {p: times.get(p) for p in ("cudnn", "fa4")}
    rows = []
    for name, t in times.items():
        ms = statistics.median(t)
        row = {"case": label, "impl": name, "ms": ms, "tflops": f / (ms * 1e-3) / 1e12, "reps": len(t)}
        for p, pt in peers.items():
            row["vs_" + p] = statistics.median(a / b for a, b in zip(pt, t)) if pt else None
        rows.append(row)
    return rows


def varlen_rows(causal: bool, modes, reps, budget_s) -> list:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import rtcattn
    lens = list(VARLEN_MIX)
    total, cu, mx = sum(lens), _cu(lens, torch), max(lens)
    mk = lambda h: torch.randn(total, h, D, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    inputs = [(mk(HQ), mk(HK), mk(HK)) for _ in range(2)]
    bounds = [(a, b) for a, b in zip(cu.tolist()[:-1], cu.tolist()[1:])]

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for a, b in bounds:
                sdpa(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None],
                     is_causal=causal, enable_gqa=True)
    fns = {"cudnn": cudnn}
    _, fa4_varlen = _fa4()
    if fa4_varlen is not None:
        fns["fa4"] = lambda q, k, v: _first(fa4_varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx,
                                                       max_seqlen_k=mx, causal=causal))
    for m in modes:
        fns[f"rtcattn {m}"] = (lambda q, k, v, m=m: rtcattn.forward_varlen(q, k, v, cu, cu, mx, mx, round_mode=m,
                                                                           causal=causal))
    label = f"varlen 12 seqs {total} tok" + (" causal" if causal else "")
    return _time(fns, inputs, reps, budget_s, _flops(lens, lens, causal), label)


def prefill_rows(modes, reps, budget_s) -> list:
    import torch

    import rtcattn
    b, sq, sk = PREFILL
    lens_q, lens_k = [sq] * b, [sk] * b
    cq, ck = _cu(lens_q, torch), _cu(lens_k, torch)
    q = torch.randn(b * sq, HQ, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b * sk, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    f = _flops(lens_q, lens_k, True)
    fa4_dense, fa4_varlen = _fa4()
    dense = (q.view(b, sq, HQ, D), k.view(b, sk, HK, D), v.view(b, sk, HK, D))
    fns = {}
    if fa4_dense is not None:
        fns["fa4"] = lambda q, k, v: _first(fa4_dense(q, k, v, causal=True))
    for m in modes:
        fns[f"rtcattn {m}"] = lambda q, k, v, m=m: rtcattn.forward(q, k, v, round_mode=m, causal=True)
    rows = _time(fns, [dense], reps, budget_s, f, "prefill 8x512/4096 dense")
    packed = {"rtcattn rtne": lambda q, k, v: rtcattn.forward_varlen(q, k, v, cq, ck, sq, sk, causal=True)}
    if fa4_varlen is not None:
        packed["fa4"] = lambda q, k, v: _first(fa4_varlen(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=sq,
                                                          max_seqlen_k=sk, causal=True))
    rows += _time(packed, [(q, k, v)], reps, budget_s, f, "prefill 8x512/4096 packed")
    for page in PAGES:
        kp, vp, table = _paged(k, v, lens_k, page, torch, seed=page)
        fns = {"rtcattn rtne": lambda q, k, v, table=table: rtcattn.forward_varlen(
            q, k, v, cq, ck, sq, sk, causal=True, block_table=table)}
        if fa4_varlen is not None:
            used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
            fns["fa4"] = lambda q, k, v, table=table, used=used: _first(fa4_varlen(
                q, k, v, cu_seqlens_q=cq, max_seqlen_q=sq, seqused_k=used, page_table=table, causal=True))
        rows += _time(fns, [(q, kp, vp)], reps, budget_s, f, f"prefill 8x512/4096 paged {page}")
    return rows


def print_rows(rows: list) -> None:
    head = f"{'problem':<36}{'impl':<14}{'ms':>9}{'TFLOP/s':>9}{'x cuDNN':>9}{'x FA4':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:<36}{r['impl']:<14}{r['ms']:>9.3f}{r['tflops']:>9.0f}"
              f"{bench._fmt(r['vs_cudnn'], '.3f'):>9}{bench._fmt(r['vs_fa4'], '.3f'):>8}")


def run(modes, reps, budget_s) -> list:
    rows = []
    for causal in (False, True):
        print(f"varlen causal={causal} ...", file=sys.stderr, flush=True)
        rows += varlen_rows(causal, modes, reps, budget_s)
    print("chunked prefill ...", file=sys.stderr, flush=True)
    rows += prefill_rows(modes, reps, budget_s)
    print_rows(rows)
    return rows
