"""The source layout keeps the runtime op-agnostic: jit/runtime/ names no op and includes no op header;
python/rtcattn/runtime/ names no op and imports nothing op-specific."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "jit" / "runtime"
PY_RUNTIME = ROOT / "python" / "rtcattn" / "runtime"
# An op's name as a word of an identifier or string (attention_fwd, fwd_out, flash_attn); not the product's
# name, rtcattn, whose "attn" is inside a word.
OP_WORD = re.compile(r"(?<![a-z0-9])(attention|attn|fwd)(?![a-z0-9])", re.I)


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


def test_python_runtime_names_no_op():
    hits = [f"{p.name}:{i}: {line.strip()}" for p in sorted(PY_RUNTIME.glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if OP_WORD.search(line)]
    assert not hits, hits


def _imported_modules(path: Path) -> list:
    """The absolute names of the modules (and the package members) a file of rtcattn.runtime imports."""
    here = "rtcattn.runtime"
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            names += [module] + [f"{module}.{a.name}" for a in node.names]
    return names


def test_python_runtime_imports_only_itself_from_the_package():
    """The engine imports no op stub, API, validation, reference, bench or tool: from the package only
    rtcattn.runtime.* and the package's version."""
    for p in sorted(PY_RUNTIME.glob("*.py")):
        for name in _imported_modules(p):
            if name == "rtcattn" or not name.startswith("rtcattn."):
                continue
            own = name == "rtcattn.runtime" or name.startswith("rtcattn.runtime.")
            assert own or name == "rtcattn.__version__", f"{p.name} imports {name}"


PACKAGE = ROOT / "python" / "rtcattn"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_imports(path: Path) -> set:
    """The package's modules a file imports, at module level or inside its functions."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            out |= {module} | {f"{module}.{a.name}" for a in node.names}
    return {n for n in out if n == "rtcattn" or n.startswith("rtcattn.")}


def test_the_package_has_no_import_cycle():
    """No module imports one that imports it back, at import time or later inside a function (a submodule
    may import its own package, which Python has half-initialised by then: that edge is left out). The
    bench driver finds the ops' suites by name at run time, as a plugin registry does, not by import."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {m: {n for n in _package_imports(p) if n in files and n != m and not m.startswith(n + ".")}
             for m, p in files.items()}
    state: dict = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(edges[m]):
            assert state.get(n) != "open", "import cycle: " + " -> ".join(path + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = "done"
    for m in sorted(files):
        if m not in state:
            visit(m, [])


def test_the_bench_driver_and_timing_harness_name_no_op():
    for p in (PACKAGE / "tools" / "bench.py", PACKAGE / "tools" / "timing.py"):
        hits = [f"{p.name}:{i}: {line.strip()}" for i, line in enumerate(p.read_text().splitlines(), 1)
                if OP_WORD.search(line)]
        assert not hits, hits


def test_a_new_ops_checklist_touches_no_engine_file():
    """docs/adding-an-op.md's table for a new op lists its files; none is the engine's (jit/runtime/,
    python/rtcattn/runtime/, python/rtcattn/tools/, setup.py) and every Python role has its file."""
    text = (ROOT / "docs" / "adding-an-op.md").read_text()
    table = text[text.index("## A new op"):text.index("Nothing else changes")]
    files = re.findall(r"^\| `([^`]+)`", table, re.M)
    engine = ("jit/runtime/", "python/rtcattn/runtime/", "python/rtcattn/tools/", "setup.py")
    assert files and not [f for f in files if f.startswith(engine)], files
    for role in ("__init__", "stub", "validate", "reference", "bench"):
        assert f"python/rtcattn/ops/my_op/{role}.py" in files, role
