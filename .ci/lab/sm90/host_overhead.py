"""Host time per rtcattn.forward call on a GPU (CPU timer over many calls of a tiny shape), split by layer:
the public call, the torch op, then this tree's layers below it (validation, argument block, dispatch.run,
the runtime's op_launch alone).

Usage: python3 host_overhead.py [PKG_DIR]  (PKG_DIR: another copy of the python package to time, e.g. an
older one; its internal layers are skipped where its API differs). Prints microseconds per call per layer."""
import sys
import time

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
import torch

import rtcattn


def per_call_us(fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def internal_layers(q, k, v, out):
    """The layers under torch.ops.rtcattn.fwd, as this tree's package has them."""
    from rtcattn.ops import attention_fwd as op
    from rtcattn.ops.attention_fwd import validate
    from rtcattn.runtime import dispatch
    prob = validate.check_inputs(q, k, v, "bshd", "rtne", None)
    machine = dispatch.machine_fields(q.device)
    call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": prob.head_dim, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}
    args = op.args_block(q, k, v, out, None, "bshd", prob, machine)
    sel = op.selection(q, k, v)
    prog = dispatch.build(sel.variant).program
    stream = torch.cuda.current_stream().cuda_stream
    return {
        "validate.check_inputs": lambda: validate.check_inputs(q, k, v, "bshd", "rtne", None),
        "ops.attention_fwd.args_block": lambda: op.args_block(q, k, v, out, None, "bshd", prob, machine),
        "dispatch.run": lambda: dispatch.run(op.OP, q.device, call, args),
        f"C op_launch ({sel.kernel.name}) alone": lambda: dispatch.lib().op_launch(
            prog, op.OP, sel.kernel.name, args, "cuda", q.device.index or 0, stream),
    }


def main():
    q, k, v = (torch.randn(1, 128, 1, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lines = {
        "rtcattn.forward": lambda: rtcattn.forward(q, k, v),
        "forward(out=)": lambda: rtcattn.forward(q, k, v, out=out),
        "torch.ops.rtcattn.fwd": lambda: torch.ops.rtcattn.fwd(q, k, v, "bshd", "rtne", None, False),
    }
    rtcattn.forward(q, k, v)
    try:
        lines.update(internal_layers(q, k, v, out))
    except (ImportError, AttributeError, TypeError) as e:  # another package copy with other internals
        print(f"(internal layers skipped: {e})")
    for name, fn in lines.items():
        print(f"host {name:<40} {per_call_us(fn):8.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
