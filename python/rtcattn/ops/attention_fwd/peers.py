"""The peers the benchmark suites (bench.py, bench_decode.py) time rtcattn against: FlashAttention-4's entry
points when flash_attn.cute imports, and the probe that turns a peer's failure on a case into its n/a reason."""
from __future__ import annotations


def fa4():
    """(flash_attn_func, flash_attn_varlen_func) of flash_attn.cute, or (None, None) when it does not import."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        return flash_attn_func, flash_attn_varlen_func
    except ImportError:
        return None, None


def first(res):
    """The output of a call that returns it alone or first in a tuple (FA4 returns (out, lse))."""
    return res[0] if isinstance(res, tuple) else res


def first_line(text, n: int = 110) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:n] + ("..." if len(line) > n else "")


def try_call(fn, inputs) -> str | None:
    """None when fn runs on these inputs, else why not: the exception, and the first warning the call gave
    (torch's SDPA says there why a backend declined)."""
    import warnings

    import torch
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            fn(*inputs[0])
            if torch.cuda.is_available():  # a launch that fails on the device is this peer's failure too
                torch.cuda.synchronize()
            return None
        except Exception as e:  # any failure of a peer is that peer's n/a, never the suite's end
            why = f"{type(e).__name__}: {first_line(e)}"
    hints = [first_line(w.message) for w in seen if first_line(w.message)]
    return why + (f" ({hints[0]})" if hints else "")
