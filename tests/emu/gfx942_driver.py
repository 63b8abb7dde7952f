"""Runs the gfx942 fast kernel on the wave emulator through the product (rtcattn.forward), with the tail split pinned.

The kernel, the emulated CU count and the split are pinned with dispatch.pinned; everything else (argument
block, workspace, plan, launches) is what a user's call does.
"""
from __future__ import annotations

import os

import rtcattn
from rtcattn.runtime import dispatch


def forward(q, k, v, layout, mode, scale=None, lse=False, *, arch="gfx942", tail_split=0, num_cus=None,
            window=(-1, -1)):
    """O (and LSE) of the gfx942 kernel for CPU bf16 tensors in `layout` (num_cus None: the emulated MI300X's)."""
    num_cus = dispatch.emulated_cus("gfx942-emu") if num_cus is None else num_cus
    before = os.environ.get("RTCATTN_EMULATE")
    os.environ["RTCATTN_EMULATE"] = arch
    try:
        with dispatch.pinned(kernel="gfx942", tail_split=tail_split, num_cus=num_cus):
            return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                                   window_size=window)
    finally:
        if before is None:
            del os.environ["RTCATTN_EMULATE"]
        else:
            os.environ["RTCATTN_EMULATE"] = before
