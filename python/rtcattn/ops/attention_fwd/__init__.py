"""attention_fwd: the forward pass, by role.

- stub.py: the torch ops (torch.ops.rtcattn.fwd, fwd_out, fwd_varlen, fwd_varlen_out), their fakes and
  autograd, the argument block, the launch;
- validate.py: the argument checks of the dense, packed and paged forms;
- reference.py: the host references of the numerics contract (tests and tools);
- bench.py: the benchmark suites, registered with `python -m rtcattn bench` (imported only by it); the decode
  suite in bench_decode.py, which bench.py imports; peers.py: the peers both time rtcattn against (FA4) and
  the probe that turns a peer's failure into its n/a reason.
"""
OP = "attention_fwd"  # the op's name in configs/ops.json (and this folder's)

from .stub import args_block, args_block_varlen, selection, selection_varlen  # noqa: E402  (registers the ops)

__all__ = ["OP", "args_block", "args_block_varlen", "selection", "selection_varlen"]
