"""RTCATTN_RECORD: what a process launches, one line per distinct variant and call, for `warm --from` to compile.

Recording (dispatch calls note() before each launch while RTCATTN_RECORD names a file): a line is one JSON object,
compact, keys sorted, newline-terminated:

    {"arch":"<arch>","call":{"<axis>":<value>,...},"kernel":"<kernel>","op":"<op>","variant":"<variant name>"}

`call` holds the call's value on every axis of the op's manifest entry (a bucketed axis: the call's own integer, e.g.
head dim 40, not its bucket), so the line can be mapped to another arch, whose kernels may bucket it differently.
Each line is written once: a process remembers the lines it wrote or found (a set: after the first launch of a
variant and call, a launch costs one lookup), and across processes the file is locked (flock) while it is read and
the line appended when absent, in one write on an O_APPEND descriptor. Nothing here names an op or a kernel.

Mapping (map_record(), `warm --from FILE --arch A[,B...]`): each record gives, for each target arch,
  1. when its kernel serves the arch (the kernel's `archs` in the manifest): that kernel's variant for the record's
     call values (the emulator's archs are names of their own, `<arch>-emu`: a record made there, of a kernel whose
     archs list both, warmed for the GPU's `<arch>` gives that kernel's variant for `<arch>`);
  2. otherwise the kernel dispatch would pick on the arch for that call by the manifest's conditions, in the op's
     order of preference, keeping the record's role: a record of a kernel that declines calls at run time
     (`declines_at_run_time`: the decode kernels, which take only a few query rows per sequence) takes the first
     kernel whose conditions accept the call; any other record the first such kernel that declines nothing at run
     time (a prefill call is never a decode kernel's);
  3. when no kernel serves it: the record is skipped on that arch, with the reason (not a failure).
"""
from __future__ import annotations

import fcntl
import json
import os
import threading
from dataclasses import dataclass

from . import manifest

KNOB = "RTCATTN_RECORD"
KEYS = ("arch", "call", "kernel", "op", "variant")

_lock = threading.Lock()
_seen: set = set()   # (file, variant, call items) written or found by this process


def line(variant: manifest.Variant, call: dict) -> str:
    """The record of a launch of variant for a call (its value on every axis of the op)."""
    return json.dumps({"op": variant.op, "arch": variant.arch, "kernel": variant.kernel, "variant": variant.name,
                       "call": call}, sort_keys=True, separators=(",", ":")) + "\n"


def note(path: str, variant: manifest.Variant, call: tuple) -> None:
    """Records a launch of variant for call (((axis, value), ...), the op's axis order) in path, once per process
    and once in the file."""
    key = (path, variant, call)
    if key in _seen:
        return
    with _lock:
        if key not in _seen:
            append(path, line(variant, dict(call)))
            _seen.add(key)


def append(path: str, text: str) -> bool:
    """Appends text (one newline-terminated line) to path unless the file holds that line already; whether it was
    written. Safe for many processes and threads at once: the file is locked (flock, on this open description) while
    it is read and the line written in one write on an O_APPEND descriptor, so no line is torn or written twice."""
    data = text.encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OSError(f"{KNOB}={path!r} cannot be opened to record the variants launched ({e.strerror}); "
                      "accepted: a file this process may create or append to") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = _read_all(fd)
        if data.rstrip(b"\n") in held.split(b"\n"):
            return False
        if held and not held.endswith(b"\n"):  # a line another writer left unfinished stays apart from ours
            data = b"\n" + data
        written = os.write(fd, data)
        if written != len(data):  # the disk is full: the line must not stay half written
            os.ftruncate(fd, len(held))
            raise OSError(f"wrote {written} of {len(data)} bytes")
        return True
    except OSError as e:
        raise OSError(f"{KNOB}={path!r} cannot be written to record the variants launched "
                      f"({e.strerror or e}); accepted: a file this process may create or append to") from e
    finally:
        os.close(fd)  # drops the lock


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while True:
        chunk = os.pread(fd, 1 << 16, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


# ---- reading and mapping (warm --from) ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    lineno: int       # its line in the file, from 1
    op: str
    arch: str
    kernel: str
    variant: str
    call: tuple       # ((axis, value), ...) in the op's axis order


class RecordError(ValueError):
    """A line of a record file that is not a record of this manifest: names the file, the line and what is wrong."""

    def __init__(self, path, lineno: int, what: str):
        self.path, self.lineno, self.what = path, lineno, what
        super().__init__(f"{path}, line {lineno}: {what}")


def read(path, m: manifest.Manifest | None = None) -> list:
    """The records of a file RTCATTN_RECORD wrote, each checked against the manifest (blank lines are skipped);
    RecordError on the first line that is not a record."""
    m = m or manifest.load()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else f"not UTF-8 text ({e.reason})"
        raise OSError(f"--from {path}: cannot be read ({reason}); accepted: a file RTCATTN_RECORD wrote") from e
    records = []
    for n, raw in enumerate(text.split("\n"), 1):
        if raw.strip():
            records.append(_parse(m, path, n, raw))
    return records


def _parse(m: manifest.Manifest, path, n: int, raw: str) -> Record:
    def fail(what: str):
        raise RecordError(path, n, what)

    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        fail(f"not JSON ({e.msg} at column {e.colno}); accepted: one JSON object a line, as RTCATTN_RECORD writes")
    if not isinstance(obj, dict) or sorted(obj) != list(KEYS):
        shown = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        fail(f"{shown} is not a record; accepted: a JSON object with the keys {', '.join(KEYS)}")
    for key in ("op", "arch", "kernel", "variant"):
        if not isinstance(obj[key], str):
            fail(f"{key}={obj[key]!r} is not accepted; accepted: a string")
    try:
        spec = m.op(obj["op"])
        k = spec.kernel(obj["kernel"])
    except ValueError as e:
        fail(str(e))
    if obj["arch"] not in k.archs:
        fail(f"arch={obj['arch']!r} is not an arch of kernel {k.name!r} of op {spec.name!r}; accepted: "
             f"{', '.join(k.archs)}")
    call = obj["call"]
    names = [a.name for a in spec.axes]
    if not isinstance(call, dict) or sorted(call) != sorted(names):
        shown = sorted(call) if isinstance(call, dict) else repr(call)
        fail(f"call {shown} is not accepted; accepted: an object with one value for each axis of op {spec.name!r} "
             f"({', '.join(names)})")
    for axis in spec.axes:
        value = call[axis.name]
        if axis.buckets:
            if not isinstance(value, int) or isinstance(value, bool):
                fail(f"call.{axis.name}={value!r} is not accepted; accepted: an integer")
        elif value not in axis.value_names():
            fail(f"call.{axis.name}={value!r} is not a value of axis {axis.name!r} of op {spec.name!r}; accepted: "
                 f"{', '.join(axis.value_names())}")
        why = k.why_not(axis, value)
        if why:
            fail(f"call.{axis.name}={value!r} is not a call kernel {k.name!r} serves ({why})")
    excluded = spec.why_excluded(call)
    if excluded:
        fail(f"call {excluded}")
    expect = m.variant_for(spec.name, k.name, obj["arch"], call).name
    if obj["variant"] != expect:
        fail(f"variant={obj['variant']!r} is not the variant kernel {k.name!r} gives this call ({expect!r}); a record "
             "of another version of the manifest? record it again")
    return Record(n, spec.name, obj["arch"], k.name, obj["variant"], tuple((a, call[a]) for a in names))


def map_record(m: manifest.Manifest, rec: Record, arch: str) -> tuple:
    """(variant, None) that warm compiles on arch for a record, or (None, why no kernel serves it there): the rules
    of the module's docstring."""
    spec, call = m.op(rec.op), dict(rec.call)
    recorded = spec.kernel(rec.kernel)
    if arch in recorded.archs:
        return m.variant_for(rec.op, recorded.name, arch, call), None
    why_not = []
    for k in spec.kernels:
        why = spec.rejects(k, arch, call)
        if why is None and k.declines_at_run_time and not recorded.declines_at_run_time:
            why = f"declines at run time {k.declines_at_run_time}, and kernel {recorded.name} does not"
        if why is None:
            return m.variant_for(rec.op, k.name, arch, call), None
        why_not.append(f"{k.name}: {why}")
    return None, f"no kernel of {rec.op} serves the call on {arch}: " + "; ".join(why_not)
