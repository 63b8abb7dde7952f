"""attention_bwd: the backward pass (dQ, dK, dV), by role.

- stub.py: the torch ops (torch.ops.rtcattn.bwd, bwd_varlen), their fakes, the argument block, the launch; the
  forward ops' autograd calls them (ops/backward.py);
- validate.py: the checks of a backward call beyond its forward's (dO, the forward's output and LSE);
- reference.py: the host references of the backward's numerics (tests and tools).
"""
OP = "attention_bwd"  # the op's name in configs/ops.json (and this folder's)

from .stub import selection  # noqa: E402  (registers the ops)

__all__ = ["OP", "selection"]
