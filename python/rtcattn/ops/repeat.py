"""A repeat of an op's call: what its first run checked and chose, kept by the call's signature.

An op's checks, its kernel's selection and its argument block depend on the call's signature alone (every tensor's
shape, strides, dtype, device and address modulo ALIGN, the scalars, the knobs' environment, the pins), not on the
addresses' values. A repeat of a signature takes the argument block its first run launched with, patches the
addresses of this call's tensors into it and launches, skipping the rest of the host's path (a decode step calls every
layer's attention with one signature; a training step's backward likewise). An op's stub decides which calls may
repeat (not those whose checks read addresses or values, e.g. out= overlaps, a per-call generator state, padded head
dims, RTCATTN_CHECK=1) and names the argument-block field of each tensor; this module knows no op."""
from __future__ import annotations

import threading

ALIGN = 16  # addresses enter a signature modulo this: the kernels' conditions ask 16-byte alignment at most
KEPT = 256  # signatures kept per op (all are dropped when full: a workload has few)


def _meta(t) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % ALIGN)


class Repeats:
    """One op's kept calls: signature -> (selection, argument block of its first launch, its workspace's bytes: the
    kernel's host sizes it from the signature's values, not the addresses)."""

    def __init__(self, op: str):
        self.op = op
        self.kept: dict = {}
        self.launched = threading.local()  # .entry: (selection, argument block) of this thread's last whole launch

    def signature(self, named, scalars: tuple) -> tuple:
        """named: ((argument-block field, tensor or None), ...); scalars: everything else the call's path reads."""
        from ..runtime import dispatch
        dispatch.check_knobs()
        return tuple(_meta(t) for _, t in named) + scalars + (id(dispatch.knob_env()), dispatch.pins())

    def get(self, sig):
        return self.kept.get(sig)

    def keep(self, sig, sel, args) -> None:
        from ..runtime import dispatch
        if len(self.kept) >= KEPT:
            self.kept.clear()
        nbytes = dispatch.lib().op_workspace_bytes(self.op, sel.kernel.name, args)
        self.kept[sig] = (sel, type(args).from_buffer_copy(args), nbytes)

    def note_launch(self, sel, args) -> None:
        """Called by a stub's whole path at its launch: what keep_last() keeps."""
        self.launched.entry = (sel, args)

    def forget_launch(self) -> None:
        self.launched.entry = None

    def keep_last(self, sig) -> None:
        """Keeps this thread's last noted launch under sig (nothing when none was noted since forget_launch())."""
        entry = getattr(self.launched, "entry", None)
        if sig is not None and entry is not None:
            self.keep(sig, *entry)

    def launch(self, hit, device, named, outputs) -> None:
        """Launches a kept call with this call's tensors: named as signature() took them, outputs ((field, tensor),
        ...) allocated by the stub as its whole path allocates them."""
        from ..runtime import dispatch
        sel, template, nbytes = hit
        args = type(template).from_buffer_copy(template)
        for name, t in (*named, *outputs):
            if t is not None:
                setattr(args, name, t.data_ptr())
        dispatch.launch(self.op, device, sel, args, nbytes)
