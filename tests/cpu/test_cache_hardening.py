"""Hardening of the code-object cache: planted links, untrusted entries, bounded reads, crafted headers,
hangs (compiler, lock), bad compiler output, entries that fail to load, stale temporaries, messages."""
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# `lib as lib`: the fixture, re-exported so that pytest finds it in this module (tests below take it as an argument)
from cpu.test_cache import LIB_PY, ROOT, build_here, build_in_child, child_env, kernel_source, lib as lib, request

pytestmark = pytest.mark.skipif(shutil.which("clang++-19") is None and shutil.which("clang++") is None,
                                reason="needs clang++ (the CI installs clang-19)")

MAGIC = b"RTCATTN-CODE-OBJECT 1\n"
IS_ROOT = os.geteuid() == 0
OTHER_UID = 12345


# ---- helpers ------------------------------------------------------------------------------------------

def entry_bytes(key: bytes, blob: bytes, blob_size=None, key_size=None, sha=None) -> bytes:
    """An entry in the runtime's format; the size and checksum fields may be given to forge one."""
    sha = sha if sha is not None else hashlib.sha256(blob).hexdigest().encode()
    blob_size = str(len(blob) if blob_size is None else blob_size).encode()
    key_size = str(len(key) if key_size is None else key_size).encode()
    return MAGIC + b"blob-sha256 " + sha + b"\nblob-size " + blob_size + b"\nkey-size " + key_size + b"\n" + key + blob


def split_entry(data: bytes):
    """(key text, blob) of a valid entry."""
    lines = data.split(b"\n", 4)
    key_size = int(lines[3].split()[1])
    return lines[4][:key_size], lines[4][key_size:]


def run_child(req, cache_dir, timeout=60, limit_memory=False, **extra):
    """build_in_child with a timeout (a hang fails the test instead of stalling the suite)."""
    from cpu.test_cache import CHILD
    env = child_env(cache_dir, **extra)
    pre = None
    if limit_memory:  # a read without a bound fails here instead of taking the machine's memory
        pre = lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # noqa: E731
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(LIB_PY), json.dumps(req)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pre)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the child did not finish within {timeout} s")
    assert proc.returncode == 0, f"child failed: {err}"
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), err


def failing_request(tag):
    return request(tag, main=["tiny.hip", kernel_source(tag, "p.x[i] = undeclared_name;")])


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def make_old(path: Path, seconds=7200):
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


# ---- 1: no writes through planted links, never into a refused dir --------------------------------------

@pytest.mark.parametrize("dir_mode", [0o777, 0o700])
def test_failed_source_never_follows_planted_links(tmp_path, dir_mode):
    req = failing_request(f"planted-{dir_mode:o}")
    probe, _ = run_child(req, tmp_path / "probe", TMPDIR=tmp_path)
    assert probe["error"] == "CompileError"
    name = re.search(r"compile of (\S+\.co) failed", probe["message"]).group(1)
    cache_dir = tmp_path / "cache"
    planted = cache_dir / "failed" / name[:-3]
    planted.mkdir(parents=True)
    victims = []
    for n in ("tiny.hip", "platform.h", "build.txt"):
        victim = tmp_path / f"victim-{n}"
        victim.write_text("precious")
        victim.chmod(0o600)
        (planted / n).symlink_to(victim)
        victims.append(victim)
    cache_dir.chmod(dir_mode)
    (tmp_path / "tmp").mkdir()
    result, _ = run_child(req, cache_dir, TMPDIR=tmp_path / "tmp")
    assert result["error"] == "CompileError"
    assert all(v.read_text() == "precious" for v in victims)
    saved = Path(re.search(r"source saved in (\S+)", result["message"]).group(1))
    if dir_mode == 0o777:  # refused: nothing is written into it
        assert not str(saved).startswith(str(cache_dir)) and str(saved).startswith(str(tmp_path / "tmp"))
    assert saved != planted and not (saved / "tiny.hip").is_symlink()
    assert (saved / "tiny.hip").read_text() == req["main"][1]
    assert saved.stat().st_mode & 0o777 == 0o700


# ---- 2: each entry is checked, not only its dir ----------------------------------------------------------

def plant(kind: str, good: Path, target: Path):
    if kind == "symlink":
        target.symlink_to(good)
        return
    shutil.copyfile(good, target)
    if kind == "group-writable":
        target.chmod(0o664)
    elif kind == "other-owner":
        target.chmod(0o644)
        os.chown(target, OTHER_UID, OTHER_UID)


@pytest.mark.parametrize("where", ["user", "system"])
@pytest.mark.parametrize("kind,why", [("symlink", "symbolic link"), ("group-writable", "writable by its group"),
                                      ("other-owner", f"owned by uid {OTHER_UID}")])
def test_untrusted_entry_is_not_loaded(tmp_path, where, kind, why):
    if kind == "other-owner" and not IS_ROOT:
        pytest.skip("handing a file to another uid needs root (CI runs as root)")
    req = request()
    first, _ = build_in_child(req, tmp_path / "src")
    good = Path(first["path"])
    user_dir = tmp_path / "user"
    entry_dir = user_dir if where == "user" else tmp_path / "system"
    entry_dir.mkdir(mode=0o755)
    user_dir.mkdir(mode=0o700, exist_ok=True)
    plant(kind, good, entry_dir / good.name)
    extra = {"RTCATTN_SYSTEM_CACHE": entry_dir} if where == "system" else {}
    result, err = run_child(req, user_dir, RTCATTN_NO_COMPILE=1, **extra)
    assert result.get("error") == "NoCompileError", result
    assert good.name in err and why in err, err
    assert good.is_file()  # the link's target is never touched
    if where == "user":  # discarded from the user dir
        assert not os.path.lexists(entry_dir / good.name)
    else:
        assert os.path.lexists(entry_dir / good.name)


@pytest.mark.parametrize("kind,why", [("symlink", "symbolic link"), ("group-writable", "writable by its group"),
                                      ("other-owner", f"owned by uid {OTHER_UID}"), ("fifo", "not a regular file")])
def test_untrusted_log_beside_an_entry_is_not_read(tmp_path, lib, capfd, kind, why):
    """BuildResult.log() hands the .log beside an entry back to the caller: it is read under the entry's rules, so a
    link or another user's file planted there gives nothing away."""
    if kind == "other-owner" and not IS_ROOT:
        pytest.skip("handing a file to another uid needs root (CI runs as root)")
    req = request()
    cache_dir = tmp_path / "cache"
    first, _ = build_in_child(req, cache_dir)
    log = Path(first["path"] + ".log")
    assert log.is_file()
    log.unlink()
    secret = tmp_path / "secret"
    secret.write_text("TOP SECRET")
    secret.chmod(0o600)
    if kind == "symlink":
        log.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(log, 0o600)
    else:
        shutil.copyfile(secret, log)
        log.chmod(0o664 if kind == "group-writable" else 0o644)
        if kind == "other-owner":
            os.chown(log, OTHER_UID, OTHER_UID)
    r = build_here(lib, req, cache_dir)
    assert r.origin == "user_cache"
    assert r.log() == ""
    err = capfd.readouterr().err
    assert str(log) in err and "is not read" in err and why in err, err
    assert secret.read_text() == "TOP SECRET"


# ---- 3: reads are bounded ----------------------------------------------------------------------------------

@pytest.mark.no_asan  # the child's address-space limit leaves ASan no room for its shadow memory
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "oversized"])
def test_entry_reads_are_bounded(tmp_path, kind):
    req = request()
    first, _ = build_in_child(req, tmp_path / "src")
    name = Path(first["path"]).name
    user_dir = tmp_path / "user"
    user_dir.mkdir(mode=0o700)
    entry = user_dir / name
    if kind == "fifo":
        os.mkfifo(entry, 0o600)
    elif kind == "dev-zero":
        entry.symlink_to("/dev/zero")
    else:  # a sparse file past the cap, starting with a plausible header
        with open(entry, "wb") as f:
            f.write(Path(first["path"]).read_bytes())
            f.truncate(257 << 20)
        entry.chmod(0o600)
    result, err = run_child(req, user_dir, timeout=30, limit_memory=True, RTCATTN_NO_COMPILE=1)
    assert result.get("error") == "NoCompileError", result
    reason = {"fifo": "not a regular file", "dev-zero": "symbolic link", "oversized": "larger than"}[kind]
    assert name in err and reason in err, err


# ---- 4: crafted headers: discarded and rebuilt; the parser never crashes and never accepts a forgery ---------

@pytest.mark.parametrize("craft", ["wrapping-sizes", "negative-size", "overflowing-size", "spaces", "leading-zero"])
def test_crafted_header_is_discarded_and_rebuilt(tmp_path, craft):
    req = request()
    first, _ = build_in_child(req, tmp_path)
    path = Path(first["path"])
    key, blob = split_entry(path.read_bytes())
    if craft == "wrapping-sizes":  # key-size + blob-size wrap past 2^64 to the real length
        data = entry_bytes(key, b"", blob_size=1 << 63, key_size=len(key) + (1 << 63))
    elif craft == "negative-size":
        data = entry_bytes(key, blob, blob_size=-1)
    elif craft == "overflowing-size":
        data = entry_bytes(key, blob, blob_size=99999999999999999999999)
    elif craft == "spaces":
        data = entry_bytes(key, blob, blob_size=f" {len(blob)}")
    else:
        data = entry_bytes(key, blob, blob_size=f"0{len(blob)}")
    path.write_bytes(data)
    second, err = run_child(req, tmp_path)
    assert second.get("origin") == "compile", second
    assert "invalid" in err and path.name in err
    third, _ = run_child(req, tmp_path)
    assert third["origin"] == "user_cache" and third["sha"] == first["sha"]


def mutations(rng: random.Random, valid: bytes, header_len: int):
    numbers = [b"0", b"-1", b"+5", b" 5", b"05", b"18446744073709551615", b"18446744073709551616",
               b"9223372036854775808", b"99999999999999999999999", b"", b"1e3", b"0x10"]
    yield valid[:0]
    for cut in range(0, header_len + 2):
        yield valid[:cut]
    for _ in range(3000):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(min(len(data), header_len + 8))
            op = rng.randrange(4)
            if op == 0:
                data[pos] ^= 1 << rng.randrange(8)
            elif op == 1:
                data.insert(pos, rng.randrange(256))
            elif op == 2 and len(data) > 1:
                del data[pos]
            else:
                data[pos] = rng.choice(b"0123456789 -+\n\x00")
        yield bytes(data)
    for _ in range(1000):
        n = rng.choice([rng.randrange(0, 400), rng.randrange(0, 40)])
        prefix = rng.choice([b"", MAGIC, MAGIC + b"blob-sha256 "])
        yield prefix + bytes(rng.randrange(256) for _ in range(n))
    for b in numbers:
        for k in numbers:
            yield (MAGIC + b"blob-sha256 " + valid[len(MAGIC) + 12:len(MAGIC) + 76] + b"\nblob-size " + b +
                   b"\nkey-size " + k + b"\n" + valid[header_len:])


def test_entry_parser_fuzz(lib):
    rng = random.Random(1234)
    key = b"op=fuzz\nvariant=v\narch=gfx942\n"
    blob = bytes(rng.randrange(256) for _ in range(300))
    valid = entry_bytes(key, blob)
    assert lib.check_cache_entry(valid, key) is None
    header_len = len(valid) - len(key) - len(blob)
    t0, n = time.time(), 0
    for data in mutations(rng, valid, header_len):
        why = lib.check_cache_entry(data, key)
        assert (why is None) == (data == valid), (data[:header_len + 8], why)
        if why is not None:
            assert why and "internal error" not in why
        n += 1
    assert n > 4000 and time.time() - t0 < 20


# ---- 5: the README says what the cache trusts ------------------------------------------------------------------

def test_readme_describes_the_trust_model():
    text = (ROOT / "README.md").read_text()
    heads = re.findall(r"^## .*$", text, re.M)
    i = heads.index("## Code-object cache")
    assert heads[i + 1] == "## Trust model of the code-object cache"
    section = text.split("## Trust model of the code-object cache")[1].split("\n## ")[0]
    for fact in ("RTCATTN_SYSTEM_CACHE", "_cache", "0755", "0644", "symbolic link", "O_NOFOLLOW", "256 MiB",
                 "temp", "lock", "failed", "RTCATTN_COMPILE_TIMEOUT", "RTCATTN_LOCK_TIMEOUT"):
        assert fact in section, fact


# ---- 9: hangs ---------------------------------------------------------------------------------------------------

def fake_clang(tmp_path: Path, body: str) -> Path:
    real = shutil.which("clang++-19") or shutil.which("clang++")
    fake = tmp_path / "fake-clang"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then exec "{real}" --version; fi\n{body}\n')
    fake.chmod(0o755)
    return fake


def test_compile_timeout_stops_a_hanging_compiler(tmp_path):
    fake = fake_clang(tmp_path, "exec sleep 120")
    t0 = time.time()
    result, _ = run_child(request(), tmp_path / "cache", timeout=40, RTCATTN_CLANG=fake, RTCATTN_COMPILE_TIMEOUT=2)
    assert result.get("error") == "CompileError", result
    assert "RTCATTN_COMPILE_TIMEOUT=2" in result["message"]
    assert time.time() - t0 < 20


def process_gone(pid: int) -> bool:
    """No such process, or a zombie (its parent is gone and nobody has reaped it yet): it runs no more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_sigterm_of_the_caller_stops_its_compiler_group(tmp_path):
    """The compiler runs in its own process group (so a timeout can stop all of it), which a SIGTERM of its
    caller does not reach: the runtime stops the group before the caller ends."""
    pids = tmp_path / "pids"
    fake = fake_clang(tmp_path, f'sleep 300 &\necho "$$ $!" > "{pids}.tmp"\nmv "{pids}.tmp" "{pids}"\nwait')
    env = child_env(tmp_path / "cache", RTCATTN_CLANG=fake)
    from cpu.test_cache import CHILD
    caller = subprocess.Popen([sys.executable, "-c", CHILD, str(LIB_PY), json.dumps(request())], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not pids.exists() and time.time() < deadline and caller.poll() is None:
            time.sleep(0.05)
        assert pids.exists(), caller.communicate()
        compiler, grandchild = map(int, pids.read_text().split())
        caller.send_signal(signal.SIGTERM)
        caller.communicate(timeout=30)
        assert caller.returncode == -signal.SIGTERM  # ended by the signal, as without the runtime's handler
        deadline = time.time() + 10
        while not (process_gone(compiler) and process_gone(grandchild)) and time.time() < deadline:
            time.sleep(0.05)
        assert process_gone(compiler) and process_gone(grandchild)
    finally:
        caller.kill()
        caller.wait()
        for pid in map(int, pids.read_text().split()) if pids.exists() else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_sigterm_handled_by_the_caller_keeps_its_compile_running(tmp_path):
    """A SIGTERM handler of the caller's own (here Python's) decides: the runtime does not stop the compile."""
    code = textwrap.dedent(f"""
        import importlib.util, json, os, signal, sys
        signal.signal(signal.SIGTERM, lambda *a: print("HANDLED", flush=True))
        spec = importlib.util.spec_from_file_location("rtc_lib_child", {str(LIB_PY)!r})
        L = importlib.util.module_from_spec(spec); sys.modules["rtc_lib_child"] = L; spec.loader.exec_module(L)
        req = json.loads(sys.argv[1])
        r = L.build(req["op"], req["variant"], req["arch"], req["symbol"], tuple(req["main"]),
                    [tuple(h) for h in req["headers"]], req["options"], compiler=req["compiler"])
        print("ORIGIN", r.origin, signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, flush=True)
    """)
    started = tmp_path / "started"
    real = shutil.which("clang++-19") or shutil.which("clang++")
    fake = fake_clang(tmp_path, f'touch "{started}"\nsleep 2\nexec "{real}" "$@"')
    caller = subprocess.Popen([sys.executable, "-c", code, json.dumps(request())], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env(tmp_path / "cache", RTCATTN_CLANG=fake))
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline and caller.poll() is None:
        time.sleep(0.05)
    caller.send_signal(signal.SIGTERM)
    out, err = caller.communicate(timeout=120)
    assert caller.returncode == 0, err
    assert "HANDLED" in out and "ORIGIN compile True" in out, out + err


def test_lock_wait_names_the_holder_and_times_out(tmp_path, lib):
    req = request()
    name = build_here(lib, req, tmp_path / "probe").cache_name
    cache_dir = tmp_path / "cache"
    lock_path = cache_dir / (name + ".lock")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        os.makedirs({str(cache_dir)!r}, mode=0o700, exist_ok=True)
        fd = os.open({str(lock_path)!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, b"%d\\n" % os.getpid())
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.time()
        result, err = run_child(req, cache_dir, timeout=40, RTCATTN_LOCK_TIMEOUT=3)
        waited = time.time() - t0
    finally:
        holder.kill()
        holder.wait()
    assert result.get("error"), result
    for text in (result["message"], err):
        assert f"pid {holder.pid}" in text, text
    assert "RTCATTN_LOCK_TIMEOUT" in result["message"] and str(lock_path) in result["message"]
    assert 3 <= waited < 20


@pytest.mark.parametrize("recorded", ["dead-pid", "nothing"])
def test_lock_wait_does_not_blame_a_pid_that_is_not_the_holder(tmp_path, lib, recorded):
    """The pid in the lock file is advisory: a gone pid (the lock kept by a descriptor a fork inherited) or none
    at all is said as such, not as the holder."""
    req = request()
    name = build_here(lib, req, tmp_path / "probe").cache_name
    cache_dir = tmp_path / "cache"
    lock_path = cache_dir / (name + ".lock")
    text = f"{dead_pid()}\n" if recorded == "dead-pid" else ""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        os.makedirs({str(cache_dir)!r}, mode=0o700, exist_ok=True)
        fd = os.open({str(lock_path)!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, {text.encode()!r})
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result, err = run_child(req, cache_dir, timeout=40, RTCATTN_LOCK_TIMEOUT=3)
    finally:
        holder.kill()
        holder.wait()
    why = "which is not a live process here" if recorded == "dead-pid" else "wrote no pid into the lock file"
    for out in (result["message"], err):
        assert why in out and "has not recorded its pid" not in out, out


FORK_CHILD = textwrap.dedent("""
    import importlib.util, json, os, sys, threading, time
    spec = importlib.util.spec_from_file_location("rtc_lib_child", sys.argv[1])
    L = importlib.util.module_from_spec(spec); sys.modules["rtc_lib_child"] = L; spec.loader.exec_module(L)
    req = json.loads(sys.argv[2])
    def build():
        t0 = time.time()
        try:
            r = L.build(req["op"], req["variant"], req["arch"], req["symbol"], tuple(req["main"]),
                        [tuple(h) for h in req["headers"]], req["options"], compiler=req["compiler"])
            return {"origin": r.origin, "seconds": time.time() - t0}
        except Exception as e:
            return {"error": type(e).__name__, "message": str(e), "seconds": time.time() - t0}
    results = []
    worker = threading.Thread(target=lambda: results.append(build()))
    worker.start()
    time.sleep(0.4)  # the worker holds the key's lock and compiles
    pid = os.fork()
    if pid == 0:
        os.write(1, ("FORKED " + json.dumps(build()) + "\\n").encode())
        os._exit(0)
    worker.join()
    os.waitpid(pid, 0)
    print("PARENT " + json.dumps(results[0]), flush=True)
""")


def test_fork_while_a_thread_compiles_does_not_deadlock_the_child(tmp_path):
    """A child forked while another thread holds a key's lock inherits the lock's descriptor; its copy must not
    keep the lock once the parent's thread releases it, so the child waits for the parent's compile only and
    then loads the entry from disk (warm in a thread, then fork workers: gunicorn preload, multiprocessing)."""
    real = shutil.which("clang++-19") or shutil.which("clang++")
    fake = fake_clang(tmp_path, f'sleep 3\nexec "{real}" "$@"')
    env = child_env(tmp_path / "cache", RTCATTN_CLANG=fake, RTCATTN_LOCK_TIMEOUT=20)
    proc = subprocess.Popen([sys.executable, "-c", FORK_CHILD, str(LIB_PY), json.dumps(request())], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    parent = json.loads(out.split("PARENT ")[1].splitlines()[0])
    forked = json.loads(out.split("FORKED ")[1].splitlines()[0])
    assert parent["origin"] == "compile", parent
    assert forked.get("origin") == "user_cache", forked
    assert forked["seconds"] < 15, forked  # the parent's compile (about 3 s), not the lock timeout
    assert f"waiting for pid {proc.pid}, which holds" in err, err


# ---- 10: compiler output is checked; an entry that fails to load is rebuilt once --------------------------------

@pytest.mark.parametrize("output,why", [("echo garbage", "not an ELF"), ("cp /bin/true", "e_machine")])
def test_compiler_output_must_be_an_elf_of_the_arch(tmp_path, output, why):
    find_out = 'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out="$2"; fi; shift; done'
    write = f'{output} > "$out"' if output.startswith("echo") else f'{output} "$out"'
    fake = fake_clang(tmp_path, f"{find_out}\n{write}\nexit 0")
    cache_dir = tmp_path / "cache"
    result, _ = run_child(request(), cache_dir, RTCATTN_CLANG=fake)
    assert result.get("error") == "CompileError", result
    assert why in result["message"] and "gfx942" in result["message"]
    assert not list(cache_dir.glob("*.co"))


EMU_CHILD = textwrap.dedent("""
    import ctypes, importlib.util, struct, sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("rtc_lib_child", sys.argv[1])
    L = importlib.util.module_from_spec(spec); sys.modules["rtc_lib_child"] = L; spec.loader.exec_module(L)
    common = Path(sys.argv[2])
    headers = [(p.relative_to(common).as_posix(), p.read_text()) for p in sorted(common.rglob("*.h"))]
    src = ('#include "platform.h"\\nstruct P { float* x; };\\n'
           'RTC_KERNEL(64) tiny(P p) { p.x[threadIdx.x] = 3.0f; }\\nRTC_EXPORT_KERNEL(tiny, P)\\n')
    r = L.build("emutiny", "v", "gfx942-emu", "tiny", ("tiny.hip", src), headers, compiler="host",
                cache_dir=sys.argv[3])
    print("ORIGIN", r.origin, flush=True)
    buf = (ctypes.c_float * 64)()
    try:
        L.launch(r.program, "host", 0, (1, 1, 1), (64, 1, 1), struct.pack("Q", ctypes.addressof(buf)),
                 ranges=[(ctypes.addressof(buf), 256)])
        print("RAN", buf[0], buf[63])
    except Exception as e:
        print("ERROR", type(e).__name__, e)
""")


def run_emu_child(cache_dir):
    env = child_env(cache_dir)
    p = subprocess.run([sys.executable, "-c", EMU_CHILD, str(LIB_PY), str(ROOT / "csrc_common"), str(cache_dir)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout, p.stderr


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_entry_that_fails_to_load_is_rebuilt_once(tmp_path):
    cache_dir = tmp_path / "cache"
    out, _ = run_emu_child(cache_dir)
    assert "ORIGIN compile" in out and "RAN 3.0 3.0" in out, out
    [entry] = cache_dir.glob("*.co")
    key, blob = split_entry(entry.read_bytes())
    bad = blob[:64] + bytes(200)  # a valid ELF header of the host's machine that dlopen refuses
    entry.write_bytes(entry_bytes(key, bad))
    out, err = run_emu_child(cache_dir)
    assert "ORIGIN user_cache" in out and "RAN 3.0 3.0" in out, out + err
    assert entry.name in err and "failed to load" in err, err
    assert split_entry(entry.read_bytes())[1] != bad  # the rebuilt entry replaced it
    out, err = run_emu_child(cache_dir)
    assert "ORIGIN user_cache" in out and "RAN 3.0 3.0" in out and "failed to load" not in err


# ---- 11: temporaries of dead processes are swept; TMPDIR is named when it is the problem -----------------------

def test_stale_temporaries_of_dead_processes_are_swept(tmp_path):
    req = request()
    cache_dir, tmp = tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    first, _ = run_child(req, cache_dir, TMPDIR=tmp)
    name = Path(first["path"]).name
    gone, live = dead_pid(), os.getpid()
    swept = [cache_dir / f"{name}.tmp.{gone}.{gone}", cache_dir / f"{name}.log.tmp.{gone}.{gone}",
             tmp / f"rtcattn-clang-pid{gone}-AbC123", tmp / f"rtcattn-host-pid{gone}-xYz789"]
    kept = [cache_dir / f"{name}.tmp.{live}.{live}", tmp / f"rtcattn-clang-pid{live}-AbC123",
            cache_dir / f"{name}.tmp.{gone}.1", tmp / f"rtcattn-emu-pid{gone}-QwE456",
            tmp / f"other-pid{gone}-AbC123", tmp / f"rtcattn-failed-tiny-v1-gfx942-clang19-{gone}-AbC123"]
    for p in swept + kept:
        if p.parent == tmp:
            p.mkdir()
            (p / "out.co").write_text("x")
            make_old(p / "out.co")
        else:
            p.write_text("x")
    for p in swept + kept[:2] + kept[4:]:
        make_old(p)
    other = tmp / f"rtcattn-cxxv-pid{gone}-RtY000"  # another user's: not ours to remove
    other.mkdir()
    make_old(other)
    if IS_ROOT:
        os.chown(other, OTHER_UID, OTHER_UID)
        make_old(other)
    second, _ = run_child(request(), cache_dir, TMPDIR=tmp)
    assert second["origin"] == "compile"
    assert [p.name for p in swept if os.path.lexists(p)] == []
    assert [p.name for p in kept if not os.path.lexists(p)] == []
    assert other.exists() or not IS_ROOT


def test_tmpdir_is_named_when_no_temp_dir_can_be_made(tmp_path):
    missing = tmp_path / "no-such-dir"
    result, _ = run_child(request(), tmp_path / "cache", TMPDIR=missing)
    assert result.get("error"), result
    assert f"TMPDIR={missing}" in result["message"] and "No such file or directory" in result["message"]


# ---- 12: clear removes only what the runtime wrote, and only in a dir it would use ----------------------------

def test_clear_removes_only_files_the_runtime_wrote(tmp_path, lib, capfd):
    cache_dir = tmp_path / "cache"
    first, _ = build_in_child(request(), cache_dir)
    entry = Path(first["path"])
    gone = dead_pid()
    ours = [entry, Path(f"{entry}.log"), Path(f"{entry}.lock"), cache_dir / f"{entry.name}.tmp.{gone}.{gone}"]
    ours[-1].write_bytes(b"half an entry")
    victim = tmp_path / "victim.co"
    shutil.copyfile(entry, victim)
    theirs = {
        "thesis.co": b"a user's own file that happens to end in .co",
        "thesis.co.lock": b"not a pid",
        "notes.co.log": b"no entry beside it",
        "foreign.co": entry.read_bytes(),
        "foreign.co.lock": b"",
    }
    for name, data in theirs.items():
        (cache_dir / name).write_bytes(data)
    if IS_ROOT:
        os.chown(cache_dir / "foreign.co", OTHER_UID, OTHER_UID)
        os.chown(cache_dir / "foreign.co.lock", OTHER_UID, OTHER_UID)
    (cache_dir / "link.co").symlink_to(victim)
    (cache_dir / "link.co.lock").symlink_to(victim)
    kept = [cache_dir / n for n in (*theirs, "link.co", "link.co.lock")]
    if not IS_ROOT:
        kept = [p for p in kept if not p.name.startswith("foreign")]
    capfd.readouterr()
    assert lib.clear_cache(str(cache_dir)) == len(ours)
    err = capfd.readouterr().err
    assert [p.name for p in ours if os.path.lexists(p)] == []
    assert [p.name for p in kept if not os.path.lexists(p)] == []
    assert victim.read_bytes() == theirs["foreign.co"]  # a link's target is never touched
    assert (cache_dir / "thesis.co").read_bytes() == theirs["thesis.co"]
    reasons = [("thesis.co", "header"), ("thesis.co.lock", "pid"), ("notes.co.log", "no cache entry"),
               ("link.co", "symbolic link")] + ([("foreign.co", f"owned by uid {OTHER_UID}")] if IS_ROOT else [])
    for name, why in reasons:
        assert re.search(rf"left {re.escape(str(cache_dir / name))} in place: .*{why}", err), (name, err)


@pytest.mark.parametrize("kind,why", [("mode-0777", "writable by other users"),
                                      ("other-owner", f"owned by uid {OTHER_UID}")])
def test_clear_refuses_a_dir_the_runtime_would_not_use(tmp_path, kind, why):
    if kind == "other-owner" and not IS_ROOT:
        pytest.skip("handing a dir to another uid needs root (CI runs as root)")
    from cpu.test_cli import cli
    cache_dir = tmp_path / "cache"
    first, _ = build_in_child(request(), cache_dir)
    if kind == "mode-0777":
        cache_dir.chmod(0o777)
    else:
        os.chown(cache_dir, OTHER_UID, OTHER_UID)
    res = cli("clear", "--cache-dir", str(cache_dir))
    assert res.returncode == 2, res.stdout + res.stderr
    assert str(cache_dir) in res.stderr and why in res.stderr and "not cleared" in res.stderr, res.stderr
    assert Path(first["path"]).is_file()


def test_clear_of_a_dir_never_made_removes_nothing(tmp_path, lib):
    assert lib.clear_cache(str(tmp_path / "never-made")) == 0


# ---- small ones ----------------------------------------------------------------------------------------------------

def test_mode_is_printed_with_all_bits(tmp_path):
    cache_dir = tmp_path / "sticky"
    cache_dir.mkdir()
    cache_dir.chmod(0o1777)
    result, err = run_child(request(), cache_dir)
    assert result["origin"] == "compile" and "mode 1777" in err, err


def test_rebuild_with_no_compile_names_the_conflict(tmp_path):
    req = request()
    build_in_child(req, tmp_path)
    result, _ = run_child(req, tmp_path, RTCATTN_REBUILD=1, RTCATTN_NO_COMPILE=1)
    assert result.get("error") == "NoCompileError", result
    assert "not in any cache" not in result["message"]
    assert "RTCATTN_REBUILD=1" in result["message"] and "RTCATTN_NO_COMPILE=1" in result["message"]


def test_long_cache_dir_path_is_returned_whole(tmp_path):
    cache_dir = tmp_path
    while len(str(cache_dir)) <= 1100:
        cache_dir = cache_dir / ("d" * 200)
    result, _ = run_child(request(), cache_dir)
    assert result["origin"] == "compile"
    assert result["path"] == str(cache_dir / result["name"]) and Path(result["path"]).is_file()
