"""The checks of a backward call that its forward's checks (attention_fwd/validate.py) do not make: dO and the
forward's output have q's shape and dtype, the LSE (and its gradient) the forward's LSE shape, fp32. Each error names
the argument, the value and what is accepted, before anything is launched."""
from __future__ import annotations

import torch

from .. import checks


def check_grad_inputs(q: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                      dlse: torch.Tensor | None, lse_shape: tuple) -> None:
    """dout and out: q's shape, dtype and device, the head dim contiguous; lse (and dlse when given): fp32 of
    lse_shape on q's device."""
    for name, t in (("out", out), ("dout", dout)):
        checks.check_type(name, t)
        if tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype:
            raise ValueError(f"{name} has shape {tuple(t.shape)} and dtype {t.dtype}; accepted: q's shape "
                             f"{tuple(q.shape)} and dtype {q.dtype}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name}.stride(-1)={t.stride(-1)}: the head dim must be contiguous; accepted: stride 1 "
                             "in the last dim")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is None and name == "dlse":
            continue
        checks.check_type(name, t)
        if tuple(t.shape) != tuple(lse_shape) or t.dtype != torch.float32:
            raise ValueError(f"{name} has shape {tuple(t.shape)} and dtype {t.dtype}; accepted: the forward's LSE, "
                             f"float32 {tuple(lse_shape)}")
    checks.check_same("devices", ("q.device", "out.device", "dout.device", "lse.device"),
                      (q.device, out.device, dout.device, lse.device))
