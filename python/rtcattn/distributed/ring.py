"""Ring attention: each rank's queries against every rank's keys and values, the K/V shards passed around the ring
while the block in hand is attended, the partial outputs merged by their LSE.

Step t on rank r holds the K/V shard of rank (r - t) mod W; the next one is already on its way (isend to r + 1, irecv
from r - 1, posted before the attention of the step). Every (query chunk, key chunk) pair is one rtcattn call whose
mask is the global one seen from the pair: the global condition -left <= j_g - i_g <= right (right 0 when causal)
becomes, in the chunks' own indices, a <= j - i <= b with a = Δ - left, b = Δ + right, Δ = the query chunk's global
offset minus the key chunk's. rtcattn's masks are bands around the bottom-right diagonal (j - i = Sk - Sq), so a
band that misses the pair's diagonal is brought to it by leaving out, from the end, the query rows or keys that see
nothing: with a > 0 the last a rows (each sees only keys j >= i + a), with b < 0 the last -b keys. A pair whose band
misses the chunk entirely is skipped (a causal mask's blocks above the diagonal). Rows a pair leaves out get no
contribution from it (LSE -inf there).

The merge, per row, in a fixed order (the steps', then the pairs'), in fp32: lse = log(e^lse_acc + e^lse_t),
o = o_acc e^(lse_acc - lse) + o_t e^(lse_t - lse); the same inputs give the same bits every run. Each partial o_t is
the kernel's output, rounded to q's dtype as a single call rounds it; the merged o is rounded once more at the end
(round_mode): docs/numerics.md, "Context parallel", says what that adds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import api
from ..ops import checks
from ..ops.attention_fwd import reference
from . import sharding as sh

INF = math.inf


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, causal: bool = False,
                               window_size: tuple = (-1, -1), layout: str = "bshd", round_mode: str = "rtne",
                               sharding: str = "zigzag", softmax_scale: float | None = None,
                               return_lse: bool = False):
    """Attention of this rank's shard of q over the whole sequence, whose K/V shards the group's ranks hold (self
    attention: q, k and v are the same tokens' shards, cut by `sharding`: sharding.shard). Masks are the whole
    sequence's (causal / window_size as rtcattn.forward's, with Sq = Sk). Returns out (q's shape and dtype), or
    (out, lse) with lse fp32 [B, Hq, S_local]. Every rank of the group must call it with the same arguments."""
    import torch.distributed as dist
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    sh.check_sharding(sharding)
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout={layout!r} is not supported; accepted: 'bshd', 'bhsd'")
    seq_dim = 1 if layout == "bshd" else 2
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.check_type(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name}.ndim={t.dim()} is not supported; accepted: 4 ([B, S, H, D] or [B, H, S, D])")
    local = q.shape[seq_dim]
    if k.shape[seq_dim] != local or v.shape[seq_dim] != local:
        raise ValueError(f"the shards' lengths q {local}, k {k.shape[seq_dim]}, v {v.shape[seq_dim]} differ; "
                         "accepted: equal lengths (self attention over one sequence)")
    n_chunks = len(sh.chunks_of(rank, world, sharding))
    if local % n_chunks:
        raise ValueError(f"the shard's length {local} is not supported with sharding={sharding!r}; accepted: a "
                         f"multiple of {n_chunks}")
    left, right = checks.check_window(window_size, causal)
    plan = _Plan(group, world, rank, [dist.get_global_rank(group, r) if group is not None else r for r in range(world)],
                 sharding, seq_dim, layout, local // n_chunks, left, right,
                 softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5, round_mode)
    out, lse = _Ring.apply(q, k, v, plan)
    return (out, lse) if return_lse else out


@dataclass(frozen=True)
class _Plan:
    """What every step of a call needs: the group, this rank, the cut, the mask, the scale and the rounding."""
    group: object
    world: int
    rank: int
    ranks: list                 # the group's ranks as global ranks (P2P addresses them so)
    sharding: str
    seq_dim: int
    layout: str
    chunk: int                  # rows of a chunk (a shard holds one or two)
    left: int
    right: int
    scale: float
    round_mode: str

    def blocks(self, src: int) -> list:
        """The calls of one step against src's shard, in a fixed order: (first query row, rows, first key, keys,
        window) in the shards' own indices. Pairs (query chunk, key chunk) that see each other whole (no mask
        inside) and form one rectangle of adjacent chunks go in one call (zigzag's causal steps but the first: one
        call each); the others one call per pair, its band brought to the pair's diagonal (_band); pairs that see
        nothing none."""
        n = self.chunk
        bands = {}
        for qi, qc in enumerate(sh.chunks_of(self.rank, self.world, self.sharding)):
            for ki, kc in enumerate(sh.chunks_of(src, self.world, self.sharding)):
                band = _band(self, (qc - kc) * n)
                if band is not None:
                    bands[qi, ki] = band
        whole = sorted(p for p, (rows, keys, window) in bands.items() if rows == keys == n and window == (-1, -1))
        rows_w, keys_w = sorted({qi for qi, _ in whole}), sorted({ki for _, ki in whole})
        rectangle = (whole and len(whole) == len(rows_w) * len(keys_w) and _adjacent(rows_w)
                     and _adjacent(keys_w))
        out = []
        if rectangle:
            out.append((rows_w[0] * n, len(rows_w) * n, keys_w[0] * n, len(keys_w) * n, (-1, -1)))
        for (qi, ki), (rows, keys, window) in sorted(bands.items()):
            if not (rectangle and (qi, ki) in whole):
                out.append((qi * n, rows, ki * n, keys, window))
        return out

    def shift(self, tensors):
        """Posts the sends of tensors to the next rank and the receives of the previous rank's: (works, received)."""
        import torch.distributed as dist
        incoming = tuple(torch.empty_like(t) for t in tensors)
        nxt, prev = self.ranks[(self.rank + 1) % self.world], self.ranks[(self.rank - 1) % self.world]
        ops = [dist.P2POp(dist.isend, t, nxt, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, prev, self.group) for t in incoming]
        return dist.batch_isend_irecv(ops), incoming


def _wait(works) -> None:
    for work in works:
        work.wait()


class _Ring(torch.autograd.Function):
    """The ring's forward (the K/V shards travel) and backward (the K/V shards travel again, each with its dK / dV
    accumulators, which one more step brings home)."""

    @staticmethod
    def forward(ctx, q, k, v, plan: _Plan):
        acc_o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        acc_lse = torch.full(_lse_shape(q, plan.layout), -INF, dtype=torch.float32, device=q.device)
        kv = (k.contiguous(), v.contiguous())
        merged = []
        for step in range(plan.world):
            pending = plan.shift(kv) if step + 1 < plan.world else None  # the next shard travels meanwhile
            attend_step(plan, q, kv[0], kv[1], acc_o, acc_lse, (plan.rank - step) % plan.world, merged)
            if pending is not None:
                _wait(pending[0])
                kv = pending[1]
        out = reference.round_to(acc_o, q.dtype, plan.round_mode)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, out, acc_lse)
        return out, acc_lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv, acc = (k.contiguous(), v.contiguous()), (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
                                                      torch.zeros(v.shape, dtype=torch.float32, device=v.device))
        for step in range(plan.world):
            # the next K / V shard travels during this step's calls; the dK / dV this step adds to follow them
            ahead = plan.shift(kv) if step + 1 < plan.world else None
            dk, dv = acc
            for block in plan.blocks((plan.rank - step) % plan.world):
                q0, rows, k0, keys, _ = block
                gq, gk, gv = _attend_backward(plan, q, kv[0], kv[1], out, lse, dout, dlse, block)
                d = plan.seq_dim
                dq.narrow(d, q0, rows).add_(gq)  # fp32 += the call's gradient (no fp32 copy of it first)
                dk.narrow(d, k0, keys).add_(gk)
                dv.narrow(d, k0, keys).add_(gv)
            works, acc = plan.shift(acc)  # after the last step this is the hop home
            _wait(works)
            if ahead is not None:
                _wait(ahead[0])
                kv = ahead[1]
        dk, dv = acc
        rnd = plan.round_mode
        return (reference.round_to(dq, q.dtype, rnd), reference.round_to(dk, k.dtype, rnd),
                reference.round_to(dv, v.dtype, rnd), None)


def _lse_shape(q, layout):
    return (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else tuple(q.shape[:3])


def _adjacent(indices) -> bool:
    return indices == list(range(indices[0], indices[0] + len(indices)))


def _band(plan, delta: int):
    """(rows kept, keys kept, rtcattn window) of a pair (the module's docstring), or None when it sees nothing."""
    n = plan.chunk
    lo = -INF if plan.left < 0 else -plan.left
    hi = INF if plan.right < 0 else plan.right
    a, b = lo + delta, hi + delta
    if a > n - 1 or b < -(n - 1):
        return None
    a = -INF if a <= -(n - 1) else a   # a bound no (row, key) of the pair reaches: no bound
    b = INF if b >= n - 1 else b
    rows, keys = n - int(max(0, a)), n - int(max(0, -b))
    c = keys - rows
    return rows, keys, (-1 if a == -INF else int(c - a), -1 if b == INF else int(b - c))


def attend_step(plan, q, k, v, acc_o, acc_lse, src: int, merged: list) -> None:
    """One step's calls (this rank's queries against src's K/V shard k, v), each merged into the accumulators as it
    returns. merged: the row ranges (first, rows) a partial has reached in the steps so far (updated): a block over
    none of them is copied into the accumulators, not merged."""
    for block in plan.blocks(src):
        first, rows = block[0], block[1]
        fresh = all(first + rows <= f or f + n <= first for f, n in merged)
        _merge(acc_o, acc_lse, _attend(plan, q, k, v, block), first, plan.seq_dim, fresh)
        merged.append((first, rows))


def _attend(plan, q, k, v, block):
    """One call: (o, lse) of the block's query rows against its keys."""
    q0, rows, k0, keys, window = block
    d = plan.seq_dim
    o, lse = api.forward(q.narrow(d, q0, rows), k.narrow(d, k0, keys), v.narrow(d, k0, keys), layout=plan.layout,
                         round_mode=plan.round_mode, softmax_scale=plan.scale, window_size=window, return_lse=True)
    return o, lse


def _attend_backward(plan, q, k, v, out, lse, dout, dlse, block):
    """(dq, dk, dv) of one call: rtcattn's backward over the block's rows and keys with the merged output and LSE
    (P = exp(S - LSE) is then the whole row's probability)."""
    q0, rows, k0, keys, window = block
    d = plan.seq_dim

    def rows_of(t):
        return t.narrow(d, q0, rows).contiguous()
    lse_rows = lse.narrow(2, q0, rows).contiguous()
    dlse_rows = None if dlse is None else dlse.narrow(2, q0, rows).contiguous()
    kk, vv = (t.narrow(d, k0, keys).contiguous() for t in (k, v))
    return torch.ops.rtcattn.bwd(rows_of(dout), rows_of(q), kk, vv, rows_of(out), lse_rows, plan.layout,
                                 plan.round_mode, plan.scale, *window, True, dlse_rows)


def _merge(acc_o, acc_lse, part, first: int, seq_dim: int, fresh: bool = False) -> None:
    """acc (fp32) <- acc merged with a partial (o, lse) over its rows, from row `first` of the shard. fresh: no
    partial has reached these rows yet (acc 0, LSE -inf there), so the merge is the partial itself, copied: the
    bits the merge gives (0 x 0 + o x 1; a row that sees no key is 0 with LSE -inf either way). Otherwise two passes
    over the rows' accumulator, in place: o_acc x w_old, then + o_t x w_new (the shard's fp32 accumulator is the
    largest tensor of the call: temporaries of its size cost as much memory traffic as the attention's own reads)."""
    o, lse = part
    rows = lse.shape[2]
    acc_rows = acc_lse.narrow(2, first, rows)
    out_rows = acc_o.narrow(seq_dim, first, rows)
    if fresh:
        out_rows.copy_(o)
        acc_rows.copy_(lse)
        return
    new = torch.logaddexp(acc_rows, lse)
    seen = new > -INF
    w_old = torch.where(seen, torch.exp(acc_rows - new), 0.0)
    w_new = torch.where(seen, torch.exp(lse - new), 0.0)
    if seq_dim == 1:  # bshd: weights [B, H, S] -> [B, S, H, 1]
        w_old, w_new = w_old.transpose(1, 2)[..., None], w_new.transpose(1, 2)[..., None]
    else:
        w_old, w_new = w_old[..., None], w_new[..., None]
    out_rows.mul_(w_old).addcmul_(o, w_new)
    acc_rows.copy_(new)
