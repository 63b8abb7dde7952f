"""`python -m rtcattn`: warm (then RTCATTN_NO_COMPILE=1 proves the cache complete), info, clear, bench without a GPU."""
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rtc_testing import need_lib
from rtcattn.ops.attention_fwd import bench
from rtcattn.runtime import dispatch, manifest
from rtcattn.tools import timing

ROOT = Path(__file__).resolve().parents[2]
# gfx90a through hipRTC (Debian's ROCm 5.2), a reduced set: the baseline's 2 round modes x 1 bucket (rtz: outside
# the default set).
WARM = ["warm", "--op", "attention_fwd", "--all", "--arch", "gfx90a", "--round-mode", "rtne,rtz", "--mask", "none",
        "--kv", "dense", "--dtype", "bf16", "--kernels", "baseline", "--head-dim", "64", "--score-mod", "plain",
        "--dropout", "nodrop", "--jobs", "2"]


def cli(*args, env_extra=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "rtcattn", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def table_rows(stdout: str) -> list:
    """The rows of warm's final table: (arch, variant, size, compile ms, origin, path)."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["arch", "variant"]) + 2
    return [ln.split() for ln in lines[start:] if ln.split() and ln.split()[0] == "gfx90a"]


def test_warm_then_no_compile_then_clear(tmp_path):
    need_lib()
    cache = tmp_path / "cache"
    first = cli(*WARM, "--cache-dir", str(cache))
    assert first.returncode == 0, first.stderr
    assert "[2/2]" in first.stdout and "2 ready (2 compiled), 0 failed" in first.stdout
    rows = table_rows(first.stdout)
    assert sorted(r[1] for r in rows) == ["attention_fwd/baseline-rtne-none-dense-d64-bf16-same-plain-nodrop",
                                          "attention_fwd/baseline-rtz-none-dense-d64-bf16-same-plain-nodrop"]
    assert all(r[4] == "compile" and int(r[2]) > 0 and Path(r[5]).is_file() for r in rows)
    assert all(Path(r[5]).parent == cache for r in rows)

    # A warm cache is complete: nothing may compile, everything comes from the cache dir.
    again = cli(*WARM, "--cache-dir", str(cache), env_extra={"RTCATTN_NO_COMPILE": "1"})
    assert again.returncode == 0, again.stderr
    rows2 = table_rows(again.stdout)
    assert [r[4] for r in rows2] == ["user_cache", "user_cache"] and "(0 compiled)" in again.stdout
    assert sorted(r[5] for r in rows2) == sorted(r[5] for r in rows)

    missing = cli(*WARM[:-4], "--head-dim", "128", "--cache-dir", str(cache), env_extra={"RTCATTN_NO_COMPILE": "1"})
    assert missing.returncode == 1 and "0 ready" in missing.stdout and "NoCompileError" in missing.stdout

    cleared = cli("clear", "--cache-dir", str(cache))
    assert cleared.returncode == 0, cleared.stderr
    removed = re.search(r"removed (\d+) cache entries", cleared.stdout)
    assert removed and int(removed.group(1)) >= 2   # the runtime also counts its lock files
    assert not list(cache.glob("*.co"))


def test_warm_refuses_a_cache_dir_it_cannot_make(tmp_path):
    """The parent of --cache-dir is a regular file: mkdir fails even for root. warm makes the dir first and
    refuses (exit 2) before compiling anything, as for a 0777 dir."""
    need_lib()
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a dir")
    res = cli(*WARM, "--cache-dir", str(blocker / "cache"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"cache dir {blocker / 'cache'} is unusable" in res.stderr and "Not a directory" in res.stderr
    assert "nothing was written" in res.stderr and "[1/" not in res.stdout  # nothing compiled


@pytest.mark.parametrize("parent", ["immutable", "sysfs"])
def test_warm_refuses_a_cache_dir_under_a_parent_it_cannot_write(tmp_path, parent):
    """The dir does not exist yet and its parent refuses new entries even to root (an immutable dir, sysfs):
    warm makes the dir first and refuses (exit 2) before compiling, instead of compiling every variant and
    failing each as not written."""
    need_lib()
    if parent == "immutable":
        base = tmp_path / "immutable"
        base.mkdir()
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(base)]).returncode != 0:
            pytest.skip("no chattr +i here (needs root and a file system with the immutable flag)")
    else:
        base = Path("/sys") / f"rtcattn-test-{os.getpid()}"
        if not os.path.ismount("/sys"):
            pytest.skip("no sysfs at /sys")
    try:
        res = cli(*WARM, "--cache-dir", str(base / "cache"))
    finally:
        if parent == "immutable":
            subprocess.run(["chattr", "-i", str(base)], check=True)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"cache dir {base / 'cache'} is unusable (mkdir " in res.stderr and "nothing was written" in res.stderr
    assert "[1/" not in res.stdout, res.stdout  # nothing compiled


def run_as(uid: int, argv: list, out: Path) -> tuple:
    """cli.main(argv) in a forked child that has dropped to uid (the interpreter's own dir may be closed to
    other users, so a new process of that uid may not start at all); (exit status, output)."""
    from rtcattn.runtime import dispatch
    from rtcattn.tools import cli as cli_module
    dispatch.lib()  # loaded before the fork, as the parent's user
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 70
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = os.fdopen(fd, "w", buffering=1)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            code = cli_module.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root (CI runs as root)")
@pytest.mark.parametrize("where", ["under-a-root-dir", "own-dir-0500"])
def test_warm_as_another_user_refuses_a_dir_it_cannot_write(tmp_path, monkeypatch, where):
    need_lib()
    for k in [k for k in os.environ if k.startswith("RTCATTN_")]:
        monkeypatch.delenv(k)
    # pytest's tmp_path sits under a dir closed to other users: the other uid would fail on that instead
    base = Path(tempfile.mkdtemp(prefix="rtcattn-other-uid-", dir="/tmp"))
    try:
        base.chmod(0o755)
        if where == "under-a-root-dir":
            cache = base / "cache"
            expect = "is unusable (mkdir " + str(cache) + ": Permission denied)"
        else:
            cache = base / "theirs"
            cache.mkdir(mode=0o500)
            os.chown(cache, 65534, 65534)
            expect = "is not writable by this user"
        code, out = run_as(65534, WARM[:-2] + ["--jobs", "1", "--cache-dir", str(cache)], tmp_path / "out.txt")
    finally:
        shutil.rmtree(base)
    assert code == 2, out
    assert f"cache dir {cache} {expect}" in out and "nothing was written" in out and "[1/" not in out, out


def test_info_lists_compilers_and_cache(tmp_path):
    need_lib()
    res = cli("info", env_extra={"RTCATTN_CACHE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "kernel data:" in res.stdout and "torch GPU" in res.stdout and "clang" in res.stdout
    data = json.loads(cli("info", "--json", env_extra={"RTCATTN_CACHE_DIR": str(tmp_path)}).stdout)
    assert {c["name"] for c in data["compilers"]} >= {"clang", "hiprtc", "nvrtc", "host"}


def test_warm_rejects_unknown_arch_and_axis():
    need_lib()
    res = cli("warm", "--arch", "gfx000")
    assert res.returncode != 0 and "--arch=gfx000" in res.stderr and "gfx942" in res.stderr
    res = cli("warm", "--arch", "gfx942", "--round-mode", "rnd")
    assert res.returncode != 0 and "--round-mode=rnd" in res.stderr and "rtne" in res.stderr
    res = cli("warm", "--arch", "gfx942", "--head-dim", "100")
    buckets = ", ".join(str(b) for b in manifest.load().op("attention_fwd").axis_values("head_dim"))
    assert res.returncode != 0 and "--head-dim=100" in res.stderr and f"accepted: {buckets}" in res.stderr
    res = cli("warm", "--arch", "gfx942", "--op", "attention_xyz")
    assert res.returncode != 0 and "--op=attention_xyz" in res.stderr and "attention_fwd" in res.stderr
    res = cli("warm", "--arch", "gfx942", "--jobs", "0")
    assert res.returncode != 0 and "--jobs=0" in res.stderr


def _names(*argv) -> list:
    from rtcattn.tools import cli as cli_module
    return sorted(f"{v.arch} {v.name}" for v in cli_module._warm_variants(cli_module.parser().parse_args(argv)))


def test_warm_builds_the_default_set_and_all_with_the_flag():
    """Without --all, warm takes the manifest's warm_default (rtne, each kernel where dispatch picks it first); the
    filters narrow either set."""
    one = ["--arch", "gfx90a,sm_90a", "--mask", "none", "--kv", "dense"]
    m = manifest.load()

    def first_choice(arch, d, dtype, supports):  # the variant dispatch picks first for a dense unmasked rtne call
        call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": d, "dtype": dtype,
                "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}
        return dispatch.select("attention_fwd", arch, call, m=m, supports=supports).variant

    # Decode calls and prefill ones: a kernel that declines whole classes of calls at run time declines the latter.
    calls = (None, lambda k: k.declines_at_run_time or None)
    for d in (32, 64, 128, 256):  # --head-dim names a bucket: the first choices compiled at that bucket
        default = _names("warm", *one, "--head-dim", str(d))
        picks = [(a, first_choice(a, d, dt, s)) for a in ("gfx90a", "sm_90a") for dt in ("bf16", "fp16") for s in calls]
        assert default == sorted({f"{a} {v.name}" for a, v in picks if v["head_dim"] == d}), (d, default)
        every = _names("warm", "--all", *one, "--head-dim", str(d))
        assert set(default) < set(every) and {n for n in every if "-rtz-" in n}, every
    assert "sm_90a sm90-rtne-none-dense-d64-fp16-same-plain-nodrop" in _names("warm", *one, "--head-dim", "64")
    every = _names("warm", "--all", "--arch", "gfx942,gfx90a,sm_90a")
    default = _names("warm", "--arch", "gfx942,gfx90a,sm_90a")
    assert set(default) < set(every) and not [n for n in default if "-rtna-" in n or "-rtz-" in n]


def test_warm_says_when_only_all_has_the_variants():
    res = cli("warm", "--arch", "gfx942", "--round-mode", "rtz", timeout=120)
    assert res.returncode != 0 and "[1/" not in res.stdout
    assert "no variant of the default set matches" in res.stderr and "add --all" in res.stderr, res.stderr
    assert ("attention_fwd: round_mode in ['rtne'], kv_dtype in ['same'], score_mod in ['plain'], dropout in "
            "['nodrop'], not (mask in ['none'], kv in ['paged', 'varlen']), each kernel where it is the first choice"
            in res.stderr)


def test_warm_queues_the_archs_in_turn():
    """One compiler may build one variant at a time per process (hipRTC): its arch's variants are spread over the
    queue, each arch's own order kept."""
    from rtcattn.tools import cli as cli_module
    variants = cli_module._warm_variants(cli_module.parser().parse_args(["warm", "--arch", "gfx942,gfx90a,sm_90a"]))
    queued = cli_module._interleaved(variants)
    assert sorted(queued, key=id) == sorted(variants, key=id)
    assert [v.arch for v in queued[:6]] == ["sm_90a", "gfx942", "gfx90a"] * 2
    for arch in ("gfx942", "gfx90a", "sm_90a"):
        assert [v for v in queued if v.arch == arch] == [v for v in variants if v.arch == arch]


@pytest.mark.parametrize("args,env,flag,accepted", [
    (["--shape", "1,2"], {}, "--shape: '1,2'", "B,S,H,D, four positive integers"),
    (["--shape", "1,x,2,64"], {}, "--shape: '1,x,2,64'", "B,S,H,D, four positive integers"),
    (["--shape", "1,64,2,264"], {}, "--shape: '1,64,2,264' has head dim D=264", "a head dim in 8..256"),
    (["--shape", "1,64,2,4"], {}, "--shape: '1,64,2,4' has head dim D=4", "padded to the next multiple of 8"),
    (["--device", "tpu"], {}, "--device: invalid choice: 'tpu'", "'cuda', 'cpu'"),
    (["--device", "cpu"], {}, "--device=cpu", "RTCATTN_EMULATE=gfx942, gfx90a or gfx950"),
    (["--device", "cpu"], {"RTCATTN_EMULATE": "gfx1100"}, "--device=cpu", "RTCATTN_EMULATE='gfx1100'"),
    (["--runs", "0"], {}, "--runs: '0'", "an integer >= 1"),
    (["--device", "cuda"], {}, "--device=cuda", "cpu, on the wave emulator"),
])
def test_first_call_names_the_bad_flag(args, env, flag, accepted):
    """Checked in the parent: an argparse-style error naming the flag, the value and what is accepted (exit 2),
    never a measuring process's traceback."""
    if "cuda" in args and __import__("torch").cuda.is_available():
        pytest.skip("checks the no-GPU message")
    res = cli("first-call", *args, env_extra=env, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "python -m rtcattn first-call: error: argument " + flag in res.stderr, res.stderr
    assert accepted in res.stderr and "Traceback" not in res.stderr and "measuring process" not in res.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_bench_without_gpu_says_so():
    res = cli("bench", "--quick")
    assert res.returncode == 2 and "needs a CUDA or ROCm GPU" in res.stderr


def test_bench_shapes_parsing():
    C = bench.Case
    assert bench.parse_shapes("2,24,8192;1,2,3,4") == [C(2, 24, 8192, 8192), C(1, 2, 3, 4)]
    assert bench.parse_shapes("2,32/8,16384:causal") == [C(2, 32, 16384, 16384, 8, True)]
    assert len(bench.parse_shapes("masks")) == 6 and all(c.causal or c.hk for c in bench.parse_shapes("masks"))
    for bad in ("2,24", "1,2,x", "1,0,3", "2,32/5,64", "2,4,8:sliding"):
        with pytest.raises(ValueError, match=r"B,H\[/Hk\],S\[,Sk\]\[:causal\]"):
            bench.parse_shapes(bad)
    assert bench.flops(C(1, 1, 2, 3), 4) == 4 * 2 * 3 * 4
    assert bench.flops(C(1, 1, 8, 8, causal=True), 4) == 4 * 8 * 8 * 4 / 2
    assert C(2, 32, 16384, 16384, 8, True).label() == "2,32/8,16384,16384 causal"


def test_bench_plot_writes_a_png(tmp_path):
    """--plot's chart from rows of the bench's own JSON shape (no GPU needed to draw)."""
    rows = [dict(B=2, H=24, Sq=s, Sk=s, D=128, layout="bshd", impl=impl, mode=mode, kernel=impl,
                 ms=1.0, reps=3, spread=0.01, tflops=tf, vs_cudnn=1.0)
            for s in (8192, 16384) for impl, mode, tf in
            (("sdpa-cudnn", "-", 620.0), ("sdpa-flash", "-", 350.0), ("rtcattn", "rtne", 650.0))]
    path = tmp_path / "bench.png"
    bench.plot(rows, str(path), timing.matplotlib_pyplot())
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7])
def test_bench_round_orders_balance_neighbours(n):
    """Each round calls every implementation once, and over a full cycle every implementation comes
    right after every other one equally often (a plain rotation keeps the same neighbour forever)."""
    cycle = n if n % 2 == 0 else 2 * n
    rows = timing.round_orders(n, 3 * cycle)
    assert all(sorted(r) == list(range(n)) for r in rows)
    pairs = collections.Counter((a, b) for r in rows[:cycle] for a, b in zip(r, r[1:]))
    assert len(pairs) == n * (n - 1) and len(set(pairs.values())) <= 1
    assert rows[cycle:2 * cycle] == rows[:cycle]


# ---- bench --shapes headdim: the suite's cases, its dry run, and peers that decline a case ------------------------

def test_headdim_suite_cases_and_flops():
    cases = bench.headdim_cases()
    assert len(cases) == 9 * 2 * 2 and len({c.label() for c in cases}) == len(cases)
    assert sorted({c.d for c in cases}) == [32, 40, 64, 80, 96, 128, 160, 192, 256]
    assert {c.dtype for c in cases} == {"bf16", "fp16"} and {c.causal for c in cases} == {False, True}
    for c in cases:
        f = c.fields()
        assert (f["B"], f["S"], f["layout"]) == (2, 4096, "bshd") and f["H"] == 4096 // c.d
        assert 4096 - c.d < f["H"] * c.d <= 4096
        assert f["flops"] == 4 * 2 * f["H"] * 4096 * 4096 * c.d / (2 if c.causal else 1)
    assert [(c.case.h, c.case.causal) for c in cases if c.d == 96 and c.dtype == "fp16"] == [(42, False), (42, True)]


def test_headdim_dry_run_lists_the_cases_without_a_gpu(tmp_path):
    out = tmp_path / "plan.json"
    res = cli("bench", "--shapes", "headdim", "--dry-run", "--json", str(out), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "36 cases" in res.stdout and "nothing was run" in res.stdout
    data = json.loads(out.read_text())
    assert data["dry_run"] is True and len(data["rows"]) == 36
    assert data["rows"][0] == {"case": "D32 bf16", "D": 32, "H": 128, "B": 2, "S": 4096, "causal": False,
                               "dtype": "bf16", "layout": "bshd", "flops": 4.0 * 2 * 128 * 4096 * 4096 * 32}
    res = cli("bench", "--suite", "headdim", "--dry-run", "--head-dims", "40,256", "--dtypes", "fp16", timeout=120)
    assert res.returncode == 0 and "4 cases" in res.stdout, res.stdout + res.stderr
    res = cli("bench", "--suite", "headdim", "--dry-run", "--head-dims", "264", timeout=120)
    assert res.returncode == 2 and "--head-dims '264' is not supported; accepted: integers from 8 to 256" in res.stderr
    res = cli("bench", "--suite", "headdim", "--dry-run", "--dtypes", "fp8", timeout=120)
    assert res.returncode == 2 and "--dtypes 'fp8' is not supported; accepted: 'bf16', 'fp16'" in res.stderr
    res = cli("bench", "--suite", "serving", "--dry-run", timeout=120)
    assert res.returncode == 2 and "--dry-run is not supported for suite 'serving'" in res.stderr


def test_backward_dry_run_lists_the_cases_without_a_gpu(tmp_path):
    """bench --backward: issue 24's shapes and D 64 / 256, causal and not, RTNE and RTZ, deterministic on and off;
    FLOPs 2.5 x the forward's."""
    out = tmp_path / "plan.json"
    res = cli("bench", "--backward", "--dry-run", "--json", str(out), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "48 cases" in res.stdout and "nothing was run" in res.stdout
    rows = json.loads(out.read_text())["rows"]
    assert rows[0] == {"case": "(2, 24, 8192) D128 rtne det", "B": 2, "Hq": 24, "Hk": 24, "S": 8192, "D": 128,
                       "causal": False, "mode": "rtne", "deterministic": True,
                       "flops": 2.5 * 4.0 * 2 * 24 * 8192 * 8192 * 128}
    assert {(r["Hq"], r["Hk"], r["D"]) for r in rows} >= {(32, 8, 128), (32, 32, 64), (8, 8, 256)}
    assert all(r["flops"] == 2.5 * 4.0 * r["B"] * r["Hq"] * r["S"] ** 2 * r["D"] / (2 if r["causal"] else 1)
               for r in rows)
    res = cli("bench", "--backward", "--dry-run", "--backward-modes", "rtq", timeout=120)
    assert res.returncode == 2 and "--backward-modes 'rtq' is not supported" in res.stderr


def test_headdim_peer_that_declines_a_case_is_na_with_its_reason(monkeypatch, capsys):
    """A peer that raises on a case (FA4 at D 40, cuDNN at some fp16 D) becomes an n/a row with the reason; the
    others are timed in the same rounds, and rtcattn's ratio is to the faster of cuDNN and FA4."""
    import warnings

    from rtcattn.ops.attention_fwd import stub

    def declines(q, k, v):
        warnings.warn("Flash attention requires head_dim % 8 == 0 (this is the reason)", stacklevel=1)
        raise RuntimeError("No available kernel. Aborting execution.")

    def fa4(q, k, v):
        raise AssertionError("head_dim 40 is not supported")

    impls = {"rtcattn": lambda q, k, v: q, "sdpa-cudnn": lambda q, k, v: q, "fa4": fa4, "sdpa-flash": declines}
    monkeypatch.setattr(bench, "_inputs", lambda c, d, layout, dtype=None: [(0, 0, 0)])
    monkeypatch.setattr(bench, "_headdim_impls", lambda hc: impls)
    monkeypatch.setattr(timing, "time_rounds", lambda fns, inputs, reps, budget: {
        n: {"rtcattn": [2.0, 2.0, 2.2], "sdpa-cudnn": [1.0, 1.2, 1.1]}[n] for n in fns})
    monkeypatch.setattr(stub, "selection", lambda *a, **k: type("S", (), {"kernel": type("K", (), {"name": "sm90"})}))
    hc = bench.HeadDimCase(40, True, "fp16")
    rows = {r["impl"]: r for r in bench.headdim_case_rows(hc, 3, 1.0)}
    assert rows["fa4"]["status"] == "n/a: AssertionError: head_dim 40 is not supported" and rows["fa4"]["ms"] is None
    assert rows["sdpa-flash"]["status"] == ("n/a: RuntimeError: No available kernel. Aborting execution. "
                                            "(Flash attention requires head_dim % 8 == 0 (this is the reason))")
    ours = rows["rtcattn"]
    assert ours["kernel"] == "sm90" and ours["best_peer"] == "sdpa-cudnn" and ours["vs_fa4"] is None
    # the median of the per-round ratios (1/2, 1.2/2, 1.1/2.2), not the ratio of the medians
    assert ours["vs_best"] == pytest.approx(0.5) and ours["tflops"] == pytest.approx(hc.fields()["flops"] / 2e9)
    bench.print_headdim(list(rows.values()))
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.lstrip().startswith("40"))
    assert line.split()[:5] == ["40", "102", "yes", "fp16", f"{ours['tflops']:.0f}"] and line.count("n/a") == 2
    assert "0.500  cuDNN" in line
    assert "D40 fp16 causal, FA4: n/a: AssertionError: head_dim 40 is not supported" in out
    assert "geomean x best peer fp16: 0.500" in out


def test_headdim_suite_lives_in_the_op_not_the_driver():
    driver = (ROOT / "python" / "rtcattn" / "tools" / "bench.py").read_text()
    assert "headdim" not in driver and "attention" not in driver
    from rtcattn.tools import bench as bench_driver
    assert bench_driver.SUITES["headdim"].plan is bench.headdim_plan
