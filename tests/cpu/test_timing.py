"""The bench's timing harness against a model of a GPU stream and a host clock (no GPU): the lead queued ahead of
the timed calls covers the host's queueing, so the events bracket GPU time even where a call costs the host more
than the GPU; where the GPU still catches up, the batch is retried with a longer lead, then a warning names it."""
import types

from rtcattn.tools import timing


class Stream:
    """In-order GPU work against a host clock (ms): an op queued at host time H starts at max(GPU free, H)."""

    def __init__(self):
        self.host = 0.0
        self.gpu = 0.0

    def queue(self, ms: float) -> float:
        start = max(self.gpu, self.host)
        self.gpu = start + ms
        return start

    def fake_torch(self, monkeypatch):
        stream = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = stream.queue(0.0)

            def query(self):
                return self.t is not None and self.t <= stream.host

            def elapsed_time(self, end):
                return end.t - self.t

        def synchronize():
            stream.host = max(stream.host, stream.gpu)

        cuda = types.SimpleNamespace(Event=Event, synchronize=synchronize,
                                     _sleep=lambda cycles: stream.queue(cycles / timing.SLEEP_CYCLES_PER_MS))
        monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(cuda=cuda))
        monkeypatch.setattr(timing.time, "perf_counter", lambda: stream.host / 1e3)

    def call(self, host_ms: float, gpu_ms: float):
        def fn():
            self.host += host_ms
            self.queue(gpu_ms)
        return fn


def test_a_slow_host_still_times_the_gpu(monkeypatch, capsys):
    """0.5 ms of host time and 0.15 ms of GPU time a call, 20 rounds: a fixed 3 ms lead would be outrun after a few
    calls (the later events reading the host's time); the lead sized from the probe covers the whole batch the first
    time (2 warm-up calls, the probe, 20 rounds: no retry), and every call reads its GPU time."""
    s = Stream()
    s.fake_torch(monkeypatch)
    calls = {"a": 0, "b": 0}

    def counted(name, host_ms, gpu_ms):
        inner = s.call(host_ms, gpu_ms)

        def fn():
            calls[name] += 1
            inner()
        return fn
    times = timing.time_rounds({"a": counted("a", 0.5, 0.15), "b": counted("b", 0.5, 0.3)}, [()], 20, 10.0)
    assert len(times["a"]) == 20 and all(abs(t - 0.15) < 1e-9 for t in times["a"]), times["a"]
    assert all(abs(t - 0.3) < 1e-9 for t in times["b"]), times["b"]
    assert calls == {"a": 23, "b": 23} and capsys.readouterr().err == "", calls


def test_a_host_slower_than_probed_is_retried_then_named(monkeypatch, capsys):
    """A host that turns slower after the probe (each call 10x its probe cost) starves every batch: two retries with
    doubled leads, then a warning on stderr; a fast GPU call is never silently reported as the host's time."""
    s = Stream()
    s.fake_torch(monkeypatch)
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        s.host += 0.01 if calls["n"] <= 3 else 5.0  # warm-up and probe cheap, then slow
        s.queue(0.1)
    timing.time_rounds({"slow": fn}, [()], 10, 10.0)
    err = capsys.readouterr().err
    assert "the GPU waited for the host" in err and "slow" in err, err
    assert calls["n"] == 3 + 3 * 10  # warm-up 2, probe 1, three timed batches of 10


def test_a_fast_host_keeps_the_minimum_lead(monkeypatch, capsys):
    s = Stream()
    s.fake_torch(monkeypatch)
    times = timing.time_rounds({"x": s.call(0.01, 1.0)}, [()], 5, 10.0)
    assert all(abs(t - 1.0) < 1e-9 for t in times["x"]) and capsys.readouterr().err == ""
