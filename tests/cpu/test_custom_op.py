"""torch.ops.rtcattn.fwd / fwd_out: registration, fake implementation, make_fx and torch.compile(fullgraph) tracing."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import rtcattn
from rtc_testing import need_lib
from rtcattn.ops.attention_fwd import stub

BF = torch.bfloat16


@pytest.fixture
def fake_launch(monkeypatch):
    def run(q, k, v, out, return_lse, layout, round_mode, problem):
        out = torch.empty_like(q) if out is None else out
        out.copy_(q)   # a cheap, shape-correct stand-in for the kernel
        b, s, h, _ = (q.shape if layout == "bshd" else (q.shape[0], q.shape[2], q.shape[1], q.shape[3]))
        lse = torch.full((b, h, s) if return_lse else (0,), float(problem.seq_k))
        return out, lse
    monkeypatch.setattr(stub, "launch", run)


def targets(gm):
    """Op names called by a graph; Dynamo records the packet (rtcattn.fwd), make_fx the overload (.default)."""
    return {str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function"}


def test_ops_registered_with_schema():
    schema = str(torch.ops.rtcattn.fwd.default._schema)
    assert schema.startswith("rtcattn::fwd(Tensor q, Tensor k, Tensor v, str layout, str round_mode, "
                             "float? softmax_scale, bool return_lse, int window_left=-1, int window_right=-1, "
                             "bool deterministic=False, float softcap=0., Tensor? alibi_slopes=None, "
                             "float dropout_p=0., Tensor? rng_state=None) -> (Tensor, Tensor)")
    out_schema = str(torch.ops.rtcattn.fwd_out.default._schema)
    assert "Tensor(a" in out_schema and "!) out" in out_schema   # declares the mutation of out


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_fake_impl_shapes(layout):
    with FakeTensorMode():
        q = torch.empty(2, 5, 3, 64, dtype=BF)
        k = torch.empty(2, 7, 3, 64, dtype=BF) if layout == "bshd" else torch.empty(2, 5, 7, 64, dtype=BF)
        out, lse = torch.ops.rtcattn.fwd(q, k, k, layout, "rtne", 0.125, True)
        assert out.shape == q.shape and out.dtype == BF
        b, s, h = (2, 5, 3) if layout == "bshd" else (2, 3, 5)
        assert lse.shape == (b, h, s) and lse.dtype == torch.float32
        _, no_lse = torch.ops.rtcattn.fwd(q, k, k, layout, "rtne", 0.125, False)
        assert no_lse.shape == (0,)


@pytest.mark.parametrize("d", [4, 264])
def test_fake_impl_validates(d):
    with FakeTensorMode():
        q = torch.empty(1, 4, 2, d, dtype=BF)
        with pytest.raises(ValueError, match=f"D={d} .*accepted: a head dim in 8..256"):
            torch.ops.rtcattn.fwd(q, q, q, "bshd", "rtne", 0.1, False)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_fake_impl_shapes_for_a_padded_head_dim(layout):
    """D = 59 runs padded to 64 inside the op; its fakes give q's shape, not the padded one."""
    with FakeTensorMode():
        q = torch.empty(2, 5, 3, 59, dtype=BF)
        out, lse = torch.ops.rtcattn.fwd(q, q, q, layout, "rtne", None, True)
        assert out.shape == q.shape and out.is_contiguous()
        assert lse.shape == ((2, 3, 5) if layout == "bshd" else (2, 5, 3))
        packed = torch.empty(7, 4, 59, dtype=BF)
        cu = torch.tensor([0, 3, 7], dtype=torch.int32)
        out, lse = torch.ops.rtcattn.fwd_varlen(packed, packed, packed, cu, cu, 4, 4, "rtne", None, True)
        assert out.shape == packed.shape and lse.shape == (4, 7)


@pytest.fixture
def emulated(monkeypatch):
    """A padded call is sized in the runtime before its copies exist: CPU tensors need the emulated arch."""
    need_lib()
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


def test_opcheck_padded_head_dim(fake_launch, emulated):
    """The eager padded call's output (shape, strides, dtype) is what its fake says it is."""
    q = torch.randn(1, 4, 2, 59, dtype=BF)
    k = torch.randn(1, 6, 2, 59, dtype=BF)
    torch.library.opcheck(torch.ops.rtcattn.fwd.default, (q, k, k, "bshd", "rtna", None, True),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.rtcattn.fwd_out.default, (q, k, k, out, "bshd", "rtz", 0.125, False),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_padded_head_dim(fake_launch, emulated):
    graphs = []

    @torch.compile(fullgraph=True, backend=_recording_backend(graphs))
    def f(q, k, v):
        out, lse = rtcattn.forward(q, k, v, layout="bhsd", return_lse=True)
        return out.reshape(-1, 43) * 2, lse + 1

    q = torch.randn(1, 2, 4, 43, dtype=BF)
    k = torch.randn(1, 2, 9, 43, dtype=BF)
    out, lse = f(q, k, k)
    assert len(graphs) == 1 and "rtcattn.fwd" in targets(graphs[0])
    assert torch.equal(out, q.reshape(-1, 43) * 2)   # the launch echoes the padded q: the op slices it back
    assert lse.shape == (1, 2, 4) and bool((lse == 10.0).all())


def test_make_fx_symbolic_traces_the_op():
    q = torch.randn(1, 4, 2, 64, dtype=BF)
    gm = make_fx(lambda q, k, v: rtcattn.forward(q, k, v, return_lse=True), tracing_mode="fake")(q, q, q)
    assert "rtcattn.fwd" in targets(gm)


def test_opcheck(fake_launch):
    q = torch.randn(1, 4, 2, 64, dtype=BF)
    k = torch.randn(1, 6, 2, 64, dtype=BF)
    torch.library.opcheck(torch.ops.rtcattn.fwd.default, (q, k, k, "bshd", "rtna", 0.125, True),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.rtcattn.fwd_out.default, (q, k, k, out, "bshd", "rtz", 0.125, False),
                          test_utils=("test_schema", "test_faketensor"))


def _recording_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


def test_torch_compile_fullgraph_traces(fake_launch):
    graphs = []

    @torch.compile(fullgraph=True, backend=_recording_backend(graphs))
    def f(q, k, v):
        out, lse = rtcattn.forward(q, k, v, layout="bhsd", round_mode="rtz", return_lse=True)
        return out * 2, lse + 1

    q = torch.randn(1, 2, 4, 64, dtype=BF)
    k = torch.randn(1, 2, 9, 64, dtype=BF)
    out, lse = f(q, k, k)
    assert len(graphs) == 1 and "rtcattn.fwd" in targets(graphs[0])
    assert torch.equal(out, q * 2)
    assert lse.shape == (1, 2, 4) and bool((lse == 10.0).all())


def test_torch_compile_fullgraph_out_and_flash_attn_func(fake_launch):
    graphs = []

    @torch.compile(fullgraph=True, backend=_recording_backend(graphs))
    def f(q, k, v, out):
        rtcattn.forward(q, k, v, out=out)
        return rtcattn.flash_attn_func(q, k, v, how_v3_bf16_cvt=2) + out

    q = torch.randn(1, 4, 2, 64, dtype=BF)
    out = torch.zeros_like(q)
    res = f(q, q, q, out)
    assert len(graphs) == 1
    assert {"rtcattn.fwd", "rtcattn.fwd_out"} <= targets(graphs[0])
    assert torch.equal(out, q) and torch.equal(res, q + q)


def test_compiled_cpu_call_without_emulator_fails_at_run_not_trace(monkeypatch):
    """Tracing works on CPU tensors; the real CPU run needs RTCATTN_EMULATE and says so."""
    need_lib()
    monkeypatch.delenv("RTCATTN_EMULATE", raising=False)
    graphs = []
    f = torch.compile(lambda q: rtcattn.forward(q, q, q), fullgraph=True, backend=_recording_backend(graphs))
    with pytest.raises(ValueError, match="RTCATTN_EMULATE"):
        f(torch.randn(1, 4, 2, 64, dtype=BF))
    assert len(graphs) == 1 and "rtcattn.fwd" in targets(graphs[0])
