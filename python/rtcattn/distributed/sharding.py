"""How a sequence is cut among the ranks of a context-parallel group: which chunks of the global sequence rank r
holds, and shard / unshard for the caller.

- "contiguous": rank r holds tokens [r S / W, (r + 1) S / W).
- "zigzag": the sequence is cut into 2W chunks of S / 2W; rank r holds chunks r and 2W - 1 - r, back to back. Under a
  causal mask every rank then has the same work (an early chunk sees little, its partner late chunk sees much).
"""
from __future__ import annotations

import torch

SHARDINGS = ("zigzag", "contiguous")


def check_sharding(sharding: str) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding={sharding!r} is not supported; accepted: {', '.join(map(repr, SHARDINGS))}")


def pieces(sharding: str, world: int) -> int:
    """How many equal chunks the global sequence is cut into."""
    check_sharding(sharding)
    return 2 * world if sharding == "zigzag" else world


def chunks_of(rank: int, world: int, sharding: str) -> tuple:
    """The indices (in pieces(sharding, world) equal chunks of the global sequence) that rank holds, in its order."""
    return (rank, 2 * world - 1 - rank) if pieces(sharding, world) == 2 * world else (rank,)


def check_length(name: str, seq: int, world: int, sharding: str) -> None:
    n = pieces(sharding, world)
    if seq % n:
        raise ValueError(f"{name}={seq} is not supported with sharding={sharding!r} over {world} ranks; accepted: "
                         f"a multiple of {n}")


def shard(x: torch.Tensor, rank: int, world: int, sharding: str = "zigzag", seq_dim: int = 1) -> torch.Tensor:
    """This rank's shard of a whole sequence x (a copy for zigzag, a view for contiguous), along seq_dim (1: "bshd",
    2: "bhsd")."""
    check_length(f"x.shape[{seq_dim}]", x.shape[seq_dim], world, sharding)
    parts = x.chunk(pieces(sharding, world), dim=seq_dim)
    mine = [parts[c] for c in chunks_of(rank, world, sharding)]
    return mine[0] if len(mine) == 1 else torch.cat(mine, dim=seq_dim)


def unshard(x: torch.Tensor, group=None, sharding: str = "zigzag", seq_dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's shard x (all-gathered over group), in global order."""
    import torch.distributed as dist
    world = dist.get_world_size(group)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    n = pieces(sharding, world)
    ordered = [None] * n
    for r, part in enumerate(gathered):
        for c, piece in zip(chunks_of(r, world, sharding), part.chunk(len(chunks_of(r, world, sharding)), seq_dim)):
            ordered[c] = piece
    return torch.cat(ordered, dim=seq_dim)
