"""Runs the gfx942 fast kernel on the wave emulator through the runtime's C ABI, with the tail split chosen by the test."""
from __future__ import annotations

from pathlib import Path

import torch

from rtcattn import _lib, manifest

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCE = "attention_fwd_gfx942.hip"
SYMBOL = "attention_fwd_gfx942"
LAYOUT = {"bshd": 0, "bhsd": 1}
MODE = {"rtne": 0, "rtna": 1, "rtz": 2}
_programs: dict = {}


def program(arch: str, layout: str, mode: str) -> int:
    """The emulated build (arch gfx942-emu or gfx90a-emu) of one variant, once per process."""
    key = (arch, layout, mode)
    if key not in _programs:
        headers = manifest.read_headers(ROOT / "csrc_common", True)
        src = (ROOT / "op_sources" / SOURCE).read_text()
        opts = [f"-DRTC_LAYOUT={LAYOUT[layout]}", f"-DRTC_ROUND={MODE[mode]}", "-DRTC_HEAD_DIM_MAX=128", "-O2"]
        res = _lib.build("attention_fwd", f"gfx942-{layout}-{mode}-d128", f"{arch}-emu", SYMBOL, (SOURCE, src),
                         headers, opts, compiler="host")
        _programs[key] = res.program
    return _programs[key]


def _strides(t: torch.Tensor, layout: str):
    s = t.stride()
    return (s[0], s[1], s[2]) if layout == "bshd" else (s[0], s[2], s[1])


def forward(q, k, v, layout, mode, scale=None, lse=False, *, arch="gfx942", tail_split=0, num_cus=304):
    """O (and LSE) of the gfx942 kernel for CPU bf16 tensors in `layout`."""
    b = q.shape[0]
    h, sq = (q.shape[2], q.shape[1]) if layout == "bshd" else (q.shape[1], q.shape[2])
    sk = k.shape[1] if layout == "bshd" else k.shape[2]
    d = q.shape[3]
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse_t = torch.empty((b, h, sq), dtype=torch.float32) if lse else None
    args = _lib.attention_args(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                               strides=[_strides(t, layout) for t in (q, k, v, out)], batch=b, heads=h, seq_q=sq,
                               seq_k=sk, head_dim=d, softmax_scale=scale,
                               lse=lse_t.data_ptr() if lse else 0, tail_split=tail_split, num_cus=num_cus)
    nbytes = _lib.attention_workspace_bytes("gfx942", args)
    ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8)  # poisoned: a read of unwritten workspace shows up
    args.workspace, args.workspace_bytes = ws.data_ptr(), nbytes
    _lib.attention_fwd(program(arch, layout, mode), "gfx942", args, "host", 0)
    return (out, lse_t) if lse else out
