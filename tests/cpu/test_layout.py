"""The source layout keeps the runtime op-agnostic: jit/runtime/ names no op and includes no op header."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "jit" / "runtime"


def test_runtime_names_no_op():
    hits = [f"{p.name}:{i}: {line.strip()}" for p in sorted(RUNTIME.iterdir())
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"attn|attention", line, re.I)]
    assert not hits, hits


def test_runtime_includes_only_runtime_and_emulator_abi_headers():
    own = {p.name for p in RUNTIME.glob("*.h")}
    for p in sorted(RUNTIME.iterdir()):
        for name in re.findall(r'^\s*#\s*include\s*"([^"]+)"', p.read_text(), re.M):
            assert name in own or name == "emu/launch_abi.h", f"{p.name} includes {name}"


def test_each_op_has_host_code_and_kernel_sources():
    from rtcattn.runtime import manifest
    for op, spec in manifest.load().ops.items():
        assert (ROOT / "jit" / "ops" / op).is_dir(), op
        for k in spec.kernels:
            assert (ROOT / "op_sources" / op / k.source).is_file(), (op, k.name)
