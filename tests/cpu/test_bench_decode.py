"""`python -m rtcattn bench --shapes decode` without a GPU: the cases and their KV bytes, the dry run, the calls each
column makes, the n/a path with fake peers, the % of copy arithmetic with fake timings, and the CLI's errors."""
import argparse
import json

import pytest
from test_cli import ROOT, cli

from rtcattn.ops.attention_fwd import bench_decode as dec, peers
from rtcattn.tools import timing

# Issue 22's table: B, context, Hq/Hk, page, KV MB (D 128, bf16, one query row per sequence).
ISSUE_TABLE = [(32, 4096, 32, 8, 16, 537), (32, 4096, 32, 8, 64, 537), (128, 2048, 32, 8, 16, 1074),
               (8, 32768, 32, 8, 64, 1074), (1, 131072, 32, 8, 64, 537), (64, 8192, 64, 8, 16, 2147),
               (256, 1024, 32, 8, 16, 1074)]


def test_decode_cases_are_the_issues_table_and_four_more():
    cases = dec.DECODE_CASES[:11]
    assert len(dec.DECODE_CASES) == 17 and len({c.label() for c in dec.DECODE_CASES}) == 17
    assert all(c.kv == "bf16" for c in cases)
    assert [(c.b, c.context, c.hq, c.hk, c.page, round(c.kv_bytes / 1e6)) for c in cases[:7]] == ISSUE_TABLE
    assert all((c.d, c.sq) == (128, 1) for c in cases[:7])
    extra = cases[7:]
    assert [(c.sq, c.hk, c.d) for c in extra] == [(4, 8, 128), (1, 1, 128), (1, 8, 64), (1, 8, 256)]
    assert extra[1].hq == 32 and all(c.kv_bytes == cases[0].kv_bytes for c in extra)
    # K and V of every used key, all KV heads, 2 bytes each
    assert cases[4].kv_bytes == 2 * 1 * 131072 * 8 * 128 * 2
    assert cases[9].kv_bytes == 2 * 64 * 4096 * 8 * 64 * 2
    assert dec.DecodeCase(1, 17, 4, 1, 16).pages_per_seq == 2 and dec.DecodeCase(2, 64, 4, 1, 64).pages_per_seq == 1
    assert cases[7].label() == "32x4096 32/8 p16 Sq4" and cases[10].label() == "16x4096 32/8 p16 D256"


def test_quantized_cases_are_three_bf16_shapes_in_fp8_and_fp4():
    quant = dec.DECODE_CASES[11:]
    assert [c.kv for c in quant] == ["fp8_e4m3"] * 3 + ["fp4_e2m1"] * 3
    # cases 1, 4 and 6's shapes, each a bf16 case of the suite
    assert [dec.DECODE_CASES.index(c.bf16()) + 1 for c in quant] == [1, 4, 6, 1, 4, 6]
    assert all(c.context >= 4096 for c in quant)  # issue 23's targets are at contexts >= 4096
    # the bytes a step reads: FP8 one a value, FP4 half a byte a value plus one scale byte per key row and head
    assert quant[0].kv_bytes == 2 * 32 * 4096 * 8 * 128 and quant[3].kv_bytes == 2 * 32 * 4096 * 8 * (64 + 1)
    assert quant[0].label() == "32x4096 32/8 p16 fp8" and quant[5].label() == "64x8192 64/8 p16 fp4"
    assert quant[0].fields()["kv_dtype"] == "fp8_e4m3"


def test_quant_lines_give_each_quantized_case_over_its_bf16_case():
    fp8 = dec.DECODE_CASES[11]
    rows = [{"case": fp8.bf16().label(), "impl": "rtcattn", "status": "ok", "ms": 0.2},
            {"case": fp8.label(), "impl": "rtcattn", "status": "ok", "ms": 0.1},
            {"case": dec.DECODE_CASES[14].label(), "impl": "rtcattn", "status": "ok", "ms": 0.05}]
    assert dec.quant_lines(rows) == ["32x4096 32/8 p16 fp8: 0.500x the bf16 cache's time (0.100 / 0.200 ms)",
                                     "32x4096 32/8 p16 fp4: 0.250x the bf16 cache's time (0.050 / 0.200 ms)"]


def _args(**kw):
    return argparse.Namespace(**{"decode_cases": None, "fa4_splits": None, "quick": False, **kw})


def test_decode_selection_and_its_errors():
    assert dec.decode_selection(_args()) == list(dec.DECODE_CASES)
    assert dec.decode_selection(_args(quick=True)) == [dec.DECODE_CASES[i] for i in (0, 4, 7)]
    assert dec.decode_selection(_args(decode_cases="11, 2")) == [dec.DECODE_CASES[10], dec.DECODE_CASES[1]]
    for bad in ("0", "18", "x", "1.5", ",", "-1"):
        with pytest.raises(ValueError, match=r"--decode-cases '.*' is not supported; accepted: integers from 1 "
                                             r"to 17"):
            dec.decode_selection(_args(decode_cases=bad))
    assert dec.fa4_splits(_args()) is None and dec.fa4_splits(_args(fa4_splits=0)) == 0
    with pytest.raises(ValueError, match=r"--fa4-splits -1 is not supported; accepted: 0 \(FA4's heuristic\)"):
        dec.fa4_splits(_args(fa4_splits=-1))


def test_decode_dry_run_lists_the_cases_without_a_gpu(tmp_path):
    out = tmp_path / "plan.json"
    res = cli("bench", "--shapes", "decode", "--dry-run", "--json", str(out), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "17 cases" in res.stdout and "nothing was run" in res.stdout and "FA4's default num_splits" in res.stdout
    lines = res.stdout.splitlines()
    assert lines[2].split() == ["1", "32x4096", "32/8", "p16", "32", "4096", "1", "32/8", "16", "128", "537", "8192"]
    data = json.loads(out.read_text())
    assert data["dry_run"] is True and data["copy_bytes"] == 4 << 30 and data["fa4_num_splits"] is None
    assert len(data["rows"]) == 17 and [r["n"] for r in data["rows"]] == list(range(1, 18))
    assert data["rows"][5] == {"case": "64x8192 64/8 p16", "n": 6, "B": 64, "context": 8192, "Sq": 1, "Hq": 64,
                               "Hk": 8, "page": 16, "D": 128, "dtype": "bf16", "kv_dtype": "bf16", "layout": "paged",
                               "kv_bytes": 2 * 64 * 8192 * 8 * 128 * 2, "pages": 64 * 8192 // 16}
    res = cli("bench", "--suite", "decode", "--dry-run", "--decode-cases", "5,9", "--fa4-splits", "0", timeout=120)
    assert res.returncode == 0 and "2 cases" in res.stdout and "FA4 num_splits=0" in res.stdout, res.stderr
    assert [ln.split()[0] for ln in res.stdout.splitlines()[2:4]] == ["5", "9"]


@pytest.mark.parametrize("flags, message", [
    (["--decode-cases", "18"], "--decode-cases '18' is not supported; accepted: integers from 1 to 17"),
    (["--fa4-splits", "-2"], "--fa4-splits -2 is not supported; accepted: 0 (FA4's heuristic) or a positive count"),
    (["--fa4-splits", "x"], "argument --fa4-splits: invalid int value: 'x'"),
])
def test_decode_bad_flags_exit_2_naming_the_flag(flags, message):
    res = cli("bench", "--shapes", "decode", "--dry-run", *flags, timeout=120)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_decode_inputs_are_shuffled_pages_and_the_call_metadata():
    import torch
    c = dec.DecodeCase(3, 40, 4, 2, 16, d=8, sq=4)
    [(q, k, v)], m = dec._decode_inputs(c, "cpu")
    assert q.shape == (12, 4, 8) and k.shape == v.shape == (9, 16, 2, 8) and q.dtype == k.dtype == torch.bfloat16
    table = m["table"]
    assert table.dtype == torch.int32 and table.shape == (3, 3)
    assert sorted(table.flatten().tolist()) == list(range(9)) and table.flatten().tolist() != list(range(9))
    assert m["cu_q"].tolist() == [0, 4, 8, 12] and m["cu_k"].tolist() == [0, 40, 80, 120]
    assert m["seqlens"].tolist() == [40, 40, 40] and m["seqlens"].dtype == torch.int32


def test_decode_columns_call_rtcattn_as_vllm_does_and_fa4_with_a_page_table(monkeypatch):
    """rtcattn.flash_attn_varlen_func positionally with block_table, causal, RTNE; flash_attn_with_kvcache (when the
    package has it) on the same pages; FA4 with page_table and seqused_k, num_splits only when asked."""
    import rtcattn
    calls = {}
    record = lambda name: lambda *a, **k: calls.setdefault(name, (a, k))  # noqa: E731
    monkeypatch.setattr(rtcattn, "flash_attn_varlen_func", record("varlen"))
    monkeypatch.setattr(rtcattn, "flash_attn_with_kvcache", record("kvcache"), raising=False)
    monkeypatch.setattr(peers, "fa4", lambda: (None, record("fa4")))
    c = dec.DecodeCase(3, 40, 4, 2, 16, d=8, sq=4)
    inputs, m = dec._decode_inputs(c, "cpu")
    fns = dec._decode_impls(c, m, None)
    assert list(fns) == ["rtcattn", "rtcattn-kvcache", "fa4"]
    for fn in fns.values():
        fn(*inputs[0])
    q, k, v = inputs[0]
    a, kw = calls["varlen"]
    assert a[:3] == (q, k, v) and a[3] is m["cu_q"] and a[4] is m["cu_k"] and a[5:] == (4, 40)
    assert kw == {"causal": True, "block_table": m["table"], "how_v3_bf16_cvt": 0}
    a, kw = calls["kvcache"]
    assert a[0].shape == (3, 4, 4, 8) and a[1:] == (k, v)
    assert kw == {"cache_seqlens": m["seqlens"], "block_table": m["table"], "causal": True, "how_v3_bf16_cvt": 0}
    a, kw = calls["fa4"]
    assert a == (q, k, v) and kw == {"cu_seqlens_q": m["cu_q"], "max_seqlen_q": 4, "seqused_k": m["seqlens"],
                                     "page_table": m["table"], "causal": True}
    calls.clear()
    dec._decode_impls(c, m, 0)["fa4"](*inputs[0])
    assert calls["fa4"][1]["num_splits"] == 0
    monkeypatch.delattr(rtcattn, "flash_attn_with_kvcache")
    monkeypatch.setattr(peers, "fa4", lambda: (None, None))
    fns = dec._decode_impls(c, m, None)
    assert list(fns) == ["rtcattn", "fa4"] and fns["fa4"] == "flash_attn.cute is not installed"


def test_decode_percent_of_copy_is_the_median_of_per_round_ratios():
    c = dec.DECODE_CASES[0]   # 537 MB of KV: 1/16 of the copy's 8 GiB of traffic
    times = {"rtcattn": [1.0, 1.0, 2.0], "copy": [1.0, 4.0, 4.0], "fa4": [3.0, 1.0, 2.0]}
    rows = {r["impl"]: r for r in dec.decode_rows(c, times, {}, "sm90")}
    ours = rows["rtcattn"]
    # per-round copy / ours: 1, 4, 2 -> 2 (the ratio of the medians, 4 / 1, would give 25 %)
    assert ours["pct_copy"] == pytest.approx(100 / 16 * 2) and ours["kv_gbps"] == pytest.approx(c.kv_bytes / 1e6)
    assert ours["vs_fa4"] == pytest.approx(1.0) and ours["kernel"] == "sm90" and ours["mode"] == "rtne"
    assert rows["copy"]["gbps"] == pytest.approx(2 * (4 << 30) / 4e6) and rows["copy"]["pct_copy"] is None
    assert rows["fa4"]["pct_copy"] == pytest.approx(100 / 16 * 2) and "vs_fa4" not in rows["fa4"]
    # without the copy (it could not run) there is no % of copy, but the rest stands
    rows = {r["impl"]: r for r in dec.decode_rows(c, {"rtcattn": [1.0]}, {"copy": "RuntimeError: out of memory"})}
    assert rows["rtcattn"]["pct_copy"] is None and rows["copy"]["status"] == "n/a: RuntimeError: out of memory"


def _fake_run(monkeypatch, impls, times):
    monkeypatch.setattr(dec, "_decode_inputs", lambda c: ([(0, 0, 0)], {}))
    monkeypatch.setattr(dec, "_decode_impls", lambda c, meta, splits: dict(impls))
    monkeypatch.setattr(dec, "_kernel", lambda c, inputs, meta: "sm90")
    monkeypatch.setattr(dec, "copy_fn", lambda: lambda *_: None)
    monkeypatch.setattr(timing, "time_rounds", lambda fns, inputs, reps, budget: {n: times[n] for n in fns})


def test_decode_peer_that_raises_is_na_with_its_reason(monkeypatch, capsys):
    def fa4(q, k, v):
        raise AssertionError("page_table is not supported with cu_seqlens_k")

    _fake_run(monkeypatch, {"rtcattn": lambda q, k, v: q, "fa4": fa4},
              {"rtcattn": [2.0, 2.0, 2.0], "copy": [4.0, 4.0, 4.0]})
    rows = dec.decode_case_rows(dec.DECODE_CASES[1], dec.copy_fn(), 3, 1.0)
    by = {r["impl"]: r for r in rows}
    assert by["fa4"]["status"] == "n/a: AssertionError: page_table is not supported with cu_seqlens_k"
    assert by["fa4"]["ms"] is None and by["rtcattn"]["vs_fa4"] is None
    assert by["rtcattn"]["pct_copy"] == pytest.approx(100 / 16 * 2)
    dec.print_decode(rows)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("  2 "))  # the case's number in the suite
    assert line.split() == ["2", "32x4096", "32/8", "p64", "537", "2147", "sm90", "2.000", "268", "12.5", "n/a", "-"]
    assert "32x4096 32/8 p64, FA4: n/a: AssertionError: page_table is not supported with cu_seqlens_k" in out
    assert "geomean" not in out


def test_decode_suite_end_to_end_with_fake_peers(monkeypatch, capsys, tmp_path):
    """The suite over two cases with rtcattn, its kvcache entry, FA4 and the copy faked: the table, the geomean of
    rtcattn / FA4 per rtcattn column, the JSON fields and the chart."""
    _fake_run(monkeypatch, {"rtcattn": lambda *a: None, "rtcattn-kvcache": lambda *a: None, "fa4": lambda *a: None},
              {"rtcattn": [1.0, 1.0, 1.0], "rtcattn-kvcache": [2.0, 2.0, 2.0], "fa4": [4.0, 4.0, 4.0],
               "copy": [2.0, 2.0, 2.0]})
    args = argparse.Namespace(decode_cases="5,8", fa4_splits=None, quick=False, reps=3, budget_s=1.0)
    result = dec.decode(args)
    out = capsys.readouterr().out
    assert "rtcattn / FA4" in out and "kvcache / FA4" in out
    assert "geomean x FA4 paged rtcattn rtne: 4.000 (min 4.000, 2 shapes)" in out
    assert "geomean x FA4 paged rtcattn-kvcache rtne: 2.000 (min 2.000, 2 shapes)" in out
    rows = result["rows"]
    assert len(rows) == 8 and {r["case"] for r in rows} == {"1x131072 32/8 p64", "32x4096 32/8 p16 Sq4"}
    assert result["copy_bytes"] == 4 << 30 and "copy" in result["title"]
    ours = next(r for r in rows if r["impl"] == "rtcattn")
    assert ours["pct_copy"] == pytest.approx(100 / 16 * 2) and ours["B"] == 1 and ours["context"] == 131072
    path = tmp_path / "decode.png"
    dec.plot(rows, str(path), timing.matplotlib_pyplot(), "fake")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_decode_suite_lives_in_the_op_and_runs_from_shapes():
    from rtcattn.ops.attention_fwd import bench
    from rtcattn.tools import bench as driver
    assert driver.SUITES["decode"].plan is dec.decode_plan and driver.SUITES["decode"].run is dec.decode
    assert bench.OTHER_SUITES["decode"] == (dec.decode, dec.decode_plan)
    assert "decode" not in (ROOT / "python" / "rtcattn" / "tools" / "bench.py").read_text()


def test_shapes_decode_plots_the_decode_chart():
    """`bench --shapes decode --plot F` charts % of copy bandwidth with the decode suite's plot: the default suite ran
    it, and its TFLOP/s chart raised KeyError 'tflops' on the decode rows (seen on the H200)."""
    from rtcattn.tools import bench as driver, cli as tools_cli
    args = tools_cli.parser().parse_args(["bench", "--shapes", "decode", "--plot", "decode.png"])
    suite = driver._suite(args)
    assert suite.plot is dec.plot and suite.run is dec.decode
    args = tools_cli.parser().parse_args(["bench", "--shapes", "64,8,512"])
    assert driver._suite(args).name == "dense"
