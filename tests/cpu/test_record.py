"""RTCATTN_RECORD and `warm --from`: a process records each variant and call it launches once (across processes too, no
line torn), warm --from compiles exactly those for the archs asked (an emulator record mapped to a GPU's kernels by
the manifest's conditions), and a cache so warmed serves the same inference with RTCATTN_NO_COMPILE=1. CPU only: the
emulator (gfx942-emu) runs the inference; nothing is compiled for a GPU arch here but one gfx942 variant."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtc_testing import need_lib
from rtcattn.runtime import manifest, record
from rtcattn.tools import cli as cli_module

ROOT = Path(__file__).resolve().parents[2]
OP = "attention_fwd"

# A prefill (B 1, S 40, H 2, D 64, causal) and a decode step (one query row over 100 keys), each run twice.
INFER = """
import torch, rtcattn
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 40, 2, 64, generator=g).to(torch.bfloat16) for _ in range(3))
kc, vc = (torch.randn(1, 100, 2, 64, generator=g).to(torch.bfloat16) for _ in range(2))
for _ in range(2):
    rtcattn.forward(q, k, v, causal=True)
    rtcattn.forward(q[:, :1], kc, vc, causal=True)
print("RAN")
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _infer(**env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", INFER], capture_output=True, text=True, timeout=300,
                          env=_env(RTCATTN_EMULATE="gfx942", **env))


def cli(*args, timeout=300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rtcattn", *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(**env), cwd=ROOT)


def _call(**values) -> dict:
    """A prefill call's axis values in forward()'s defaults, head dim 64, changed where given."""
    call = {"round_mode": "rtne", "mask": "window", "kv": "dense", "head_dim": 64, "dtype": "bf16", "kv_dtype": "same",
            "score_mod": "plain", "dropout": "nodrop"}
    return {**call, **values}


def _line(kernel: str, arch: str, call: dict) -> str:
    return record.line(manifest.load().variant_for(OP, kernel, arch, call), call)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The record of INFER, run twice in two processes (the second identical), and the cache they filled."""
    need_lib()
    base = tmp_path_factory.mktemp("recorded")
    path, cache = base / "model.jsonl", base / "cache"
    runs = [_infer(RTCATTN_RECORD=path, RTCATTN_CACHE_DIR=cache) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0 and "RAN" in r.stdout, r.stderr
    return path, cache


def test_a_process_records_each_variant_and_call_once(recorded):
    path, _ = recorded
    text = path.read_text()
    assert text.endswith("\n")
    lines = text.splitlines(keepends=True)
    assert lines == [_line("gfx942", "gfx942-emu", _call()), _line("gfx942_decode", "gfx942-emu", _call())], text
    first = json.loads(lines[0])
    assert lines[0] == json.dumps(first, sort_keys=True, separators=(",", ":")) + "\n"  # compact, keys sorted
    assert first["variant"] == "gfx942-rtne-window-dense-d64-bf16-same-plain-nodrop" and first["arch"] == "gfx942-emu"


def _hammer(path: str, lines: list, go: int) -> None:  # a forked child: append every line, twice
    write = os.write

    def slow_write(fd, data):  # widens the window between the read and the write that the lock must close
        time.sleep(0.001)
        return write(fd, data)

    os.write = slow_write  # this child's own os module
    os.read(go, 1)
    for _ in range(2):
        for text in lines:
            record.append(path, text)


def test_concurrent_processes_write_each_line_once_and_whole(tmp_path):
    """Six processes append 100 shared lines (in one order: they race for each) and 20 of their own each, twice over,
    all released at once, each write a millisecond late: every line is in the file exactly once, none torn or joined
    to another."""
    path = str(tmp_path / "shared.jsonl")
    pad = "x" * 600  # lines longer than a small write, as a real record is
    shared = [json.dumps({"n": i, "pad": pad}) + "\n" for i in range(100)]
    own = {p: [json.dumps({"p": p, "n": i, "pad": pad}) + "\n" for i in range(20)] for p in range(6)}
    rfd, wfd = os.pipe()
    pids = []
    for p in range(6):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(wfd)
                _hammer(path, shared + own[p], rfd)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(rfd)
    os.write(wfd, b"g" * 6)  # release them together
    os.close(wfd)
    assert all(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in pids)
    text = Path(path).read_text()
    assert text.endswith("\n")
    got = text.splitlines(keepends=True)
    want = shared + [x for p in own for x in own[p]]
    assert sorted(got) == sorted(want), f"{len(got)} lines for {len(want)}"
    assert all(json.loads(x)["pad"] == pad for x in got)


def test_a_line_another_writer_left_unfinished_stays_apart(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"torn":')
    assert record.append(str(path), '{"a":1}\n') is True
    assert record.append(str(path), '{"a":1}\n') is False
    assert path.read_text() == '{"torn":\n{"a":1}\n'


@pytest.fixture
def emulated(recorded, monkeypatch):
    """This process on the emulator, against the recorded run's cache (nothing compiles)."""
    for k in [k for k in os.environ if k.startswith("RTCATTN_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(recorded[1]))
    monkeypatch.setenv("RTCATTN_NO_COMPILE", "1")


def _prefill():
    import torch
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1, 40, 2, 64, generator=g).to(torch.bfloat16) for _ in range(3)]


def test_an_unwritable_record_file_fails_before_the_launch(emulated, monkeypatch, tmp_path):
    import rtcattn
    target = tmp_path / "no-such-dir" / "r.jsonl"
    monkeypatch.setenv("RTCATTN_RECORD", str(target))
    q, k, v = _prefill()
    out = q.new_full(q.shape, math.nan)
    with pytest.raises(OSError) as e:
        rtcattn.forward(q, k, v, causal=True, out=out)
    assert f"RTCATTN_RECORD='{target}' cannot be opened" in str(e.value) and "No such file or directory" in str(e.value)
    assert out.isnan().all()  # nothing was launched


def test_the_record_keeps_the_calls_head_dim_and_touches_the_file_once(emulated, monkeypatch, tmp_path):
    """Head dim 40 runs the d64 variant of the recorded cache (gfx942's first bucket; sm90 has one of 32 < 40 <= 64):
    the record says 40. A process reads the file for a line once: later launches of it cost a set lookup."""
    import rtcattn
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv("RTCATTN_RECORD", str(path))
    q, k, v = (t[..., :40].contiguous() for t in _prefill())
    rtcattn.forward(q, k, v, causal=True)
    [rec] = [json.loads(x) for x in path.read_text().splitlines()]
    assert rec["call"]["head_dim"] == 40 and rec["variant"] == "gfx942-rtne-window-dense-d64-bf16-same-plain-nodrop"
    calls = []
    monkeypatch.setattr(record, "append", lambda *a: calls.append(a))
    rtcattn.forward(q, k, v, causal=True)
    assert calls == []


def test_unset_the_knob_costs_no_file_access(emulated, monkeypatch, tmp_path):
    import rtcattn

    def refuse(*args):
        raise AssertionError("the record file was touched with RTCATTN_RECORD unset")

    monkeypatch.setattr(record, "append", refuse)
    q, k, v = _prefill()
    rtcattn.forward(q, k, v, causal=True)
    monkeypatch.setenv("RTCATTN_RECORD", str(tmp_path / "r.jsonl"))  # and set: the same call reaches the file
    with pytest.raises(AssertionError, match="was touched"):
        rtcattn.forward(q, k, v, causal=True)
    monkeypatch.delenv("RTCATTN_RECORD")
    rtcattn.forward(q, k, v, causal=True)


def test_warm_from_the_record_makes_the_inference_run_without_compiling(recorded, tmp_path):
    path, _ = recorded
    cache = tmp_path / "warmed"
    warm = cli("warm", "--from", str(path), "--arch", "gfx942-emu", "--cache-dir", str(cache), "--jobs", "2")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert f"2 variants, 2 records of {path}, 0 skipped" in warm.stdout
    assert "2 ready (2 compiled), 0 failed" in warm.stdout
    assert sorted(p.name.split("-gfx942-emu-")[0] for p in cache.glob("*.co")) == [
        "attention_fwd-gfx942-rtne-window-dense-d64-bf16-same-plain-nodrop",
        "attention_fwd-gfx942_decode-rtne-window-dense-d64-bf16-same-plain-nodrop"]
    served = _infer(RTCATTN_NO_COMPILE=1, RTCATTN_CACHE_DIR=cache)
    assert served.returncode == 0 and "RAN" in served.stdout, served.stderr
    cold = _infer(RTCATTN_NO_COMPILE=1, RTCATTN_CACHE_DIR=tmp_path / "empty")  # the control: nothing there
    assert cold.returncode != 0 and "NoCompileError" in cold.stderr, cold.stdout + cold.stderr


def _plan(path, *argv) -> list:
    args = cli_module.parser().parse_args(["warm", "--from", str(path), *argv])
    variants, skipped, _ = cli_module._recorded_variants(args)
    return [f"{v.arch} {v.name}" for v in variants], skipped


def test_an_emulator_record_maps_to_the_kernels_dispatch_picks_on_each_arch(recorded):
    """No compile: the variants warm --from would build. On sm_90a the decode record takes sm90_decode and the prefill
    one sm90; on gfx942 (named without -emu) both keep their kernel; on sm_80 only the baseline serves both."""
    path, _ = recorded
    names, skipped = _plan(path, "--arch", "sm_90a,gfx942,sm_80")
    assert skipped == []
    assert sorted(names) == sorted(f"{arch} {k}-rtne-window-dense-d64-bf16-same-plain-nodrop" for arch, k in [
        ("sm_90a", "sm90"), ("sm_90a", "sm90_decode"), ("gfx942", "gfx942"), ("gfx942", "gfx942_decode"),
        ("sm_80", "baseline")])  # sm_80: both records give one variant, built once
    assert _plan(path, "--arch", "sm_90a", "--kernels", "sm90_decode")[0] == [
        "sm_90a sm90_decode-rtne-window-dense-d64-bf16-same-plain-nodrop"]


def test_mapping_keeps_the_records_role_and_skips_what_no_kernel_serves():
    m = manifest.load()

    def mapped(kernel, arch, to, **values):
        rec = record._parse(m, "r", 1, _line(kernel, arch, _call(**values)))
        v, why = record.map_record(m, rec, to)
        return (v.kernel, v["head_dim"]) if v else why

    assert mapped("gfx942", "gfx942-emu", "sm_90a", head_dim=40) == ("sm90", 64)
    assert mapped("gfx942", "gfx942-emu", "sm_90a", head_dim=24) == ("sm90", 32)  # sm90's own bucket of the call
    assert mapped("gfx942_decode", "gfx942-emu", "sm_90a", head_dim=24) == ("sm90_decode", 32)
    assert mapped("sm90_decode", "sm_90a", "gfx942", head_dim=24) == ("gfx942_decode", 64)
    assert mapped("sm90", "sm_90a", "gfx90a-emu") == ("gfx942", 64)
    # a call the fast kernel declined at run time ran the baseline: it stays the baseline where that serves the arch
    assert mapped("baseline", "gfx942-emu", "sm_90a") == ("baseline", 64)
    assert mapped("baseline", "gfx942-emu", "gfx950") == ("gfx942", 64)
    # gfx950's native FP4 decode: no kernel of gfx942 takes that cache
    why = mapped("gfx950_decode", "gfx950-emu", "gfx942", kv="paged", kv_dtype="fp4_e2m1_native")
    assert why.startswith("no kernel of attention_fwd serves the call on gfx942: ") and "gfx942_decode: kv_dtype" in why


def test_warm_from_reports_a_record_no_kernel_serves_as_skipped(tmp_path):
    path = tmp_path / "fp4.jsonl"
    path.write_text(_line("gfx950_decode", "gfx950-emu", _call(kv="paged", kv_dtype="fp4_e2m1_native")))
    res = cli("warm", "--from", str(path), "--arch", "gfx942", "--cache-dir", str(tmp_path / "c"), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"skipped {path}, line 1 (attention_fwd gfx950_decode-" in res.stdout and "nothing to compile" in res.stdout


GOOD = _line("gfx942", "gfx942-emu", _call())


@pytest.mark.parametrize("bad,what", [
    ("{not json", "not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ('["a"]', "list is not a record; accepted: a JSON object with the keys arch, call, kernel, op, variant"),
    (GOOD.replace('"op":"attention_fwd"', '"op":"attention_xyz"'), "op='attention_xyz' is not in"),
    (GOOD.replace('"kernel":"gfx942"', '"kernel":"gfx943"'), "kernel='gfx943' is not a kernel of op 'attention_fwd'"),
    (GOOD.replace('"arch":"gfx942-emu"', '"arch":"sm_90a"'), "arch='sm_90a' is not an arch of kernel 'gfx942'"),
    (GOOD.replace('"mask":"window"', '"mask":"causal"'),
     "call.mask='causal' is not a value of axis 'mask' of op 'attention_fwd'; accepted: none, window"),
    (GOOD.replace('"head_dim":64', '"head_dim":300'), "call.head_dim=300 is not a call kernel 'gfx942' serves"),
    (GOOD.replace('"head_dim":64', '"head_dim":"64"'), "call.head_dim='64' is not accepted; accepted: an integer"),
    (GOOD.replace('"dropout":"nodrop",', ''), "is not accepted; accepted: an object with one value for each axis"),
    (GOOD.replace("-d64-", "-d96-"), "variant='gfx942-rtne-window-dense-d96-bf16-same-plain-nodrop' is not the "
                                     "variant kernel 'gfx942' gives this call"),
])
def test_a_bad_line_fails_warm_from_naming_the_file_and_line(tmp_path, capsys, bad, what):
    path = tmp_path / "r.jsonl"
    path.write_text(GOOD + "\n" + bad + "\n")  # a blank line between is no record, and no error
    code = cli_module.main(["warm", "--from", str(path), "--arch", "gfx942", "--cache-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and f"{path}, line 3: " in err and what in err, err
    assert not (tmp_path / "c").exists()  # before anything: not even the cache dir


def test_warm_from_exits_2_on_a_bad_file_or_flag(tmp_path):
    """In a process of its own, as a container build runs it: exit 2 and the message, nothing compiled."""
    path = tmp_path / "r.jsonl"
    path.write_text(GOOD.replace('"dtype":"bf16"', '"dtype":"bf17"'))
    res = cli("warm", "--from", str(path), "--arch", "gfx942", timeout=120)
    assert res.returncode == 2 and f"{path}, line 1: call.dtype='bf17' is not a value of axis 'dtype'" in res.stderr
    res = cli("warm", "--from", str(path), "--arch", "gfx942", "--all", "--mask", "none", "--head-dim", "64",
              timeout=120)
    assert res.returncode == 2 and "[1/" not in res.stdout, res.stdout + res.stderr
    assert ("--from cannot be combined with --all, --head-dim, --mask; accepted beside --from: --arch, --op, "
            "--kernels, --cache-dir, --jobs") in res.stderr


def test_warm_from_a_file_it_cannot_read_or_that_holds_nothing(tmp_path, capsys):
    for path, what in ((tmp_path / "absent.jsonl", "cannot be read (No such file or directory)"),
                       (tmp_path / "empty.jsonl", "holds no records")):
        if "empty" in path.name:
            path.write_text("\n")
        code = cli_module.main(["warm", "--from", str(path), "--arch", "gfx942"])
        err = capsys.readouterr().err
        assert code == 2 and f"--from {path}" in err and what in err, err


def test_warm_from_takes_op_and_kernel_filters(recorded, capsys):
    path, _ = recorded
    assert _plan(path, "--arch", "gfx942", "--op", "attention_bwd") == ([], [])
    assert _plan(path, "--arch", "gfx942", "--kernels", "gfx942")[0] == [
        "gfx942 gfx942-rtne-window-dense-d64-bf16-same-plain-nodrop"]
    with pytest.raises(SystemExit, match="--kernels=gfx943 is not supported"):
        _plan(path, "--arch", "gfx942", "--kernels", "gfx943")
    with pytest.raises(SystemExit, match="no variant of the records of .* matches the given --op/--kernels"):
        cli_module.main(["warm", "--from", str(path), "--arch", "gfx942", "--kernels", "baseline"])


def test_the_record_module_names_no_op_or_kernel():
    """record.py is op-agnostic: no op or kernel of the manifest is named in it."""
    text = (ROOT / "python" / "rtcattn" / "runtime" / "record.py").read_text()
    m = manifest.load()
    names = set(m.ops) | {k.name for spec in m.ops.values() for k in spec.kernels}
    assert not [n for n in names if f"'{n}'" in text or f'"{n}"' in text or f"`{n}`" in text]
