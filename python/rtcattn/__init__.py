"""rtcattn: flash-attention ops (prefill, decode and the backward; bf16 and fp16) whose kernels are compiled from
text at first use and cached."""
__version__ = "0.1.0"

# importing api registers the ops
from . import aiter  # rtcattn.aiter.register()
from .api import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, forward, forward_varlen, quantize_kv

__all__ = ["forward", "forward_varlen", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "quantize_kv", "aiter", "__version__"]
