"""Context parallelism on torch.distributed (NCCL on GPUs, gloo on the CPU with the emulator): attention over a
sequence whose shards the ranks of a group hold.

- context_parallel_attention(q, k, v, group=None, causal=False, window_size=(-1, -1), layout="bshd",
  round_mode="rtne", sharding="zigzag", softmax_scale=None, return_lse=False): ring.py.
- shard(x, rank, world, sharding="zigzag", seq_dim=1) / unshard(x, group=None, sharding="zigzag", seq_dim=1): the
  caller's cut of a sequence and its inverse: sharding.py.
"""
from .ring import context_parallel_attention
from .sharding import SHARDINGS, shard, unshard

__all__ = ["context_parallel_attention", "shard", "unshard", "SHARDINGS"]
