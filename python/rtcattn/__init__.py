"""rtcattn: a bf16 flash-attention forward op whose kernels are compiled from text at first use and cached."""
__version__ = "0.1.0"

from .api import flash_attn_func, forward  # noqa: E402  (registers torch.ops.rtcattn.fwd)
from . import aiter  # noqa: E402  (rtcattn.aiter.register())

__all__ = ["forward", "flash_attn_func", "aiter", "__version__"]
