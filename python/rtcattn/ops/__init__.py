"""The op stubs: one module per op of configs/ops.json, each a torch custom op with a fake implementation."""
from . import (
    attention_fwd,  # noqa: F401  (registers torch.ops.rtcattn.fwd / fwd_out)
    attention_fwd_varlen,  # noqa: F401  (torch.ops.rtcattn.fwd_varlen / fwd_varlen_out: packed sequences)
)
