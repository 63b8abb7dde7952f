"""rtcattn.flash_attn_with_kvcache on the CPU without a kernel: the signature, bad input refused before anything is
written, the fake and torch.compile, and the device work's freedom from host syncs."""
import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rtcattn
from rtcattn.ops.attention_fwd import kvcache, stub, validate

BF = torch.bfloat16
FLASH_ATTN_ORDER = ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                    "cache_batch_idx", "cache_leftpad", "block_table", "softmax_scale", "causal", "window_size",
                    "softcap", "rotary_interleaved", "alibi_slopes", "num_splits", "return_softmax_lse"]


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def inputs(b=2, sq=3, hq=4, hk=2, d=64, s=48, new=2):
    q = torch.randn(b, sq, hq, d, dtype=BF)
    kc, vc = torch.randn(b + 1, s, hk, d, dtype=BF), torch.randn(b + 1, s, hk, d, dtype=BF)
    extra = dict(k=torch.randn(b, new, hk, d, dtype=BF), v=torch.randn(b, new, hk, d, dtype=BF),
                 rotary_cos=torch.randn(s, 16, dtype=BF), rotary_sin=torch.randn(s, 16, dtype=BF),
                 cache_seqlens=i32([5, 40][:b]), cache_batch_idx=i32([2, 0][:b]), cache_leftpad=i32([1, 3][:b]))
    return q, kc, vc, extra


def test_signature_is_flash_attn_2s_then_keyword_only():
    params = inspect.signature(rtcattn.flash_attn_with_kvcache).parameters
    assert list(params)[:len(FLASH_ATTN_ORDER)] == FLASH_ATTN_ORDER
    assert [(n, p.kind, p.default) for n, p in list(params.items())[len(FLASH_ATTN_ORDER):]] == [
        ("how_v3_bf16_cvt", inspect.Parameter.KEYWORD_ONLY, 1), ("out", inspect.Parameter.KEYWORD_ONLY, None),
        # a quantized cache's (FA3's descales; FP4's format name and scales)
        ("k_descale", inspect.Parameter.KEYWORD_ONLY, None), ("v_descale", inspect.Parameter.KEYWORD_ONLY, None),
        ("kv_cache_dtype", inspect.Parameter.KEYWORD_ONLY, "auto"), ("k_scale", inspect.Parameter.KEYWORD_ONLY, None),
        ("v_scale", inspect.Parameter.KEYWORD_ONLY, None)]
    assert params["window_size"].default == (-1, -1) and params["rotary_interleaved"].default is True
    assert params["num_splits"].default == 0 and params["softcap"].default == 0.0


def _paged(b=2, page=16, pages=3):
    q, _, _, extra = inputs(b=b)
    kc, vc = torch.randn(7, page, 2, 64, dtype=BF), torch.randn(7, page, 2, 64, dtype=BF)
    extra = dict(extra, block_table=i32([[0, 1, 2], [3, 4, 5]][:b]), rotary_cos=torch.randn(48, 16, dtype=BF),
                 rotary_sin=torch.randn(48, 16, dtype=BF))
    extra.pop("cache_batch_idx")
    extra.pop("cache_leftpad")
    return q, kc, vc, extra


BAD = [  # (change of the call, error type, message)
    (lambda a: a.update(q=a["q"].float()), TypeError, r"q.dtype=torch.float32 is not supported"),
    (lambda a: a.update(k_cache=a["k_cache"].half()), TypeError, r"mismatched dtypes: q.dtype=torch.bfloat16, "
                                                                 r"k_cache.dtype=torch.float16"),
    (lambda a: a.update(q=a["q"][..., :4]), ValueError, r"mismatched head dim: q=4, k_cache=64"),
    (lambda a: a.update(q=torch.randn(2, 3, 3, 64, dtype=BF)), ValueError, r"mismatched number of heads: q=3, k=v=2"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), TypeError,
     r"cache_seqlens.dtype=torch.int64 is not supported; accepted: torch.int32"),
    (lambda a: a.update(cache_seqlens=i32([1, 2, 3])), ValueError, r"cache_seqlens.shape=\(3,\) .*\[batch=2\]"),
    (lambda a: a.update(cache_seqlens=47), ValueError, r"cache_seqlens=47 is not supported; accepted: an int >= 0 "
                                                       r"and <= 46"),
    (lambda a: a.update(cache_seqlens=None), ValueError, r"cache_seqlens=None with k / v given"),
    (lambda a: a.update(v=None), ValueError, r"k is given and v is None"),
    (lambda a: a.update(k=a["k"][:, :, :1]), ValueError, r"mismatched k and v shapes"),
    (lambda a: a.update(k=a["k"][:, :, :1], v=a["v"][:, :, :1]), ValueError,
     r"k.shape=\(2, 2, 1, 64\) is not supported; accepted: \[B=2, S_new, Hk=2, D=64\]"),
    (lambda a: a.update(k=torch.randn(2, 49, 2, 64, dtype=BF), v=torch.randn(2, 49, 2, 64, dtype=BF)), ValueError,
     r"k.shape\[1\]=49 new rows per sequence is not supported; accepted: at most the cache's 48"),
    (lambda a: a.update(rotary_sin=None), ValueError, r"rotary_cos and rotary_sin: one is None"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"][:, :12], rotary_sin=a["rotary_sin"][:, :12]), ValueError,
     r"rotary_dim=24 \(rotary_cos.shape=\(48, 12\)\) is not supported; accepted: a multiple of 16 in 16..D=64"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"][:40], rotary_sin=a["rotary_sin"][:40]), ValueError,
     r"rotary_cos.shape\[0\]=40 is not supported; accepted: at least the cache's 48 keys"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"].half()), TypeError, r"rotary_cos.dtype=torch.float16 .*q's dtype"),
    (lambda a: a.update(k=None, v=None), ValueError, r"rotary_cos / rotary_sin given without k / v"),
    (lambda a: a.update(num_splits=-1), ValueError, r"num_splits=-1 is not supported; accepted: an int >= 0"),
    (lambda a: a.update(softcap=-30.0), ValueError, r"softcap=-30.0 is not supported"),
    (lambda a: a.update(alibi_slopes=torch.zeros(5)), ValueError, r"alibi_slopes \(shape \(5,\).*is not supported"),
    (lambda a: a.update(how_v3_bf16_cvt=3), ValueError, r"how_v3_bf16_cvt=3 is not supported"),
    (lambda a: a.update(rotary_interleaved=1), TypeError, r"rotary_interleaved=1 \(int\) is not supported"),
    (lambda a: a.update(k_cache=a["k_cache"].transpose(0, 1), v_cache=a["v_cache"].transpose(0, 1),
                        cache_batch_idx=None), ValueError,
     r"k_cache.stride\(\)=\(128, 6144, 64, 1\) is not supported; accepted: a batch stride that is a whole number"),
    (lambda a: a.update(block_table=i32([[0], [1]])), ValueError,
     r"cache_batch_idx with block_table is not supported"),
    (lambda a: a.update(out=torch.empty(2, 3, 4, 32, dtype=BF)), ValueError, r"out.shape=\(2, 3, 4, 32\)"),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_input_is_refused_before_anything_is_written(i):
    q, kc, vc, extra = inputs()
    call = dict(extra, q=q, k_cache=kc, v_cache=vc)
    change, error, message = BAD[i]
    change(call)
    before = (call["k_cache"].clone(), call["v_cache"].clone())
    with pytest.raises(error, match=message):
        rtcattn.flash_attn_with_kvcache(**call)
    assert torch.equal(call["k_cache"], before[0]) and torch.equal(call["v_cache"], before[1])


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(cache_leftpad=i32([0, 0])), r"cache_leftpad with block_table is not supported"),
    (lambda a: a.update(k_cache=torch.randn(7, 24, 2, 64, dtype=BF), v_cache=torch.randn(7, 24, 2, 64, dtype=BF)),
     r"page_size=24 \(k_cache.shape\[1\], paged\) is not supported; accepted: a power of two >= 16"),
    (lambda a: a.update(block_table=a["block_table"][:1]), r"block_table.shape=\(1, 3\) is not supported"),
])
def test_bad_paged_input(change, message):
    q, kc, vc, extra = _paged()
    call = dict(extra, q=q, k_cache=kc, v_cache=vc)
    change(call)
    with pytest.raises(ValueError, match=message):
        rtcattn.flash_attn_with_kvcache(**call)


class SyncDetector(TorchDispatchMode):
    """Records the aten ops a call runs; the ones that read a value back to the host (a sync on a GPU) are
    _local_scalar_dense (.item(), .tolist(), bool()), nonzero and masked_select (boolean-mask indexing)."""
    SYNCS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))

    def syncs(self):
        return [op for op in self.ops if op.startswith(self.SYNCS)]


@pytest.mark.parametrize("paged", [False, True])
def test_device_work_reads_nothing_back(monkeypatch, paged):
    """Every op the entry queues before the launch (validation, append, rotary, metadata, the packed call's set-up)
    runs under a dispatch mode that sees each aten op: none of them reads a value back to the host. The launch is
    replaced by a stand-in, so nothing compiles."""
    launched = []
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")  # dispatch's choice as on the device; nothing compiles
    monkeypatch.setattr("rtcattn.runtime.dispatch.launch", lambda op, dev, sel, args: launched.append(args))
    q, kc, vc, extra = _paged() if paged else inputs()
    mode = SyncDetector()
    with mode:
        stub._kvcache(q, kc, vc, extra["k"], extra["v"], extra["rotary_cos"], extra["rotary_sin"],
                      extra["cache_seqlens"], extra.get("cache_batch_idx"), extra.get("cache_leftpad"),
                      extra.get("block_table"), None, "rtne", None, True, (-1, 0), True, False)
    assert len(launched) == 1 and "aten.index_put_" in mode.ops and "aten.cat" in mode.ops  # the work did run
    assert mode.syncs() == [], f"ops that read device values back: {mode.syncs()}"


def test_device_work_traces_whole_under_torch_compile():
    """The append, rotary and metadata compile as one graph (fullgraph=True): a Python branch on a device value would
    break it and fail the compile (a host read that decides nothing is what the meta-device test below catches)."""
    q, kc, vc, extra = inputs()
    p = validate.check_kvcache_inputs(q, kc, vc, **extra)

    def work(q, kc, vc, k, v, cos, sin, seqlens, idx, lp):
        packed = kvcache.plan(q, kc, vc, seqlens, idx, lp, p)
        packed = kvcache.apply(packed, q, kc, vc, k, v, cos, sin, seqlens, idx, None, p, False, True)
        return packed.q, packed.cu_k, packed.seqused_k

    args = (q, kc, vc, *(extra[n] for n in ("k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
                                            "cache_leftpad")))
    want = work(q, kc.clone(), vc.clone(), *args[3:])
    got = torch.compile(work, fullgraph=True, backend="aot_eager")(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(got[2], i32([5 + 2 - 1, 40 + 2 - 3])) and torch.equal(got[1], i32([2 * 48 + 1, 3, 0]))


def test_fake_shapes_and_compile_fullgraph(monkeypatch):
    monkeypatch.setattr(stub, "_packed", lambda q, k, v, out, *a, **kw: (
        q.clone() if out is None else out.copy_(q), torch.full((q.shape[1], q.shape[0]), 2.0)))
    monkeypatch.setattr(stub, "selection_varlen", lambda *a, **k: None)
    q, kc, vc, extra = inputs()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    @torch.compile(fullgraph=True, backend=backend)
    def f(q, kc, vc, k, v):
        out, lse = rtcattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=extra["cache_seqlens"],
                                                   causal=True, return_softmax_lse=True)
        return out + 1, lse

    out, lse = f(q, kc, vc, extra["k"], extra["v"])
    assert len(graphs) == 1 and out.shape == q.shape and lse.shape == (2, 4, 3)
    names = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert any("fwd_kvcache" in n for n in names)
    assert torch.equal(kc[0, 5:7], extra["k"][0]) and torch.equal(kc[1, 40:42], extra["k"][1])  # appended in place


def test_opcheck(monkeypatch):
    monkeypatch.setattr(stub, "_packed", lambda q, k, v, out, *a, **kw: (
        q.clone() if out is None else out.copy_(q), torch.zeros((q.shape[1], q.shape[0]))))
    monkeypatch.setattr(stub, "selection_varlen", lambda *a, **k: None)
    q, kc, vc, extra = inputs()
    args = (q, kc, vc, extra["k"], extra["v"], None, None, extra["cache_seqlens"], None, None, None, "rtne", None,
            True, -1, 0, True)
    torch.library.opcheck(torch.ops.rtcattn.fwd_kvcache.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.rtcattn.fwd_kvcache_out.default, (q, kc, vc, out) + args[3:],
                          test_utils=("test_schema", "test_faketensor"))


def test_the_op_checks_num_splits():
    """torch.ops.rtcattn.fwd_kvcache itself (and its fake) refuses a negative num_splits, naming it, before anything
    is written; the schema carries it after the flash-attn arguments, 0 by default."""
    q, kc, vc, extra = inputs()
    before = kc.clone()
    args = (q, kc, vc, extra["k"], extra["v"], None, None, extra["cache_seqlens"], None, None, None, "rtne", None,
            True, -1, 0, True)
    for fake in (False, True):
        with pytest.raises(ValueError, match=r"num_splits=-2 is not supported; accepted: an int >= 0"):
            stub._kvcache(*args[:11], None, "rtne", None, True, (-1, 0), True, fake, -2)
    with pytest.raises(ValueError, match=r"num_splits=-2 is not supported; accepted: an int >= 0"):
        torch.ops.rtcattn.fwd_kvcache(*args, -2)
    assert torch.equal(kc, before)
    schema = torch.ops.rtcattn.fwd_kvcache.default._schema
    names = [a.name for a in schema.arguments]  # num_splits, a quantized cache's arguments, the score modifications
    assert names[names.index("num_splits"):] == ["num_splits", "k_descale", "v_descale", "k_scale", "v_scale",
                                                 "kv_cache_dtype", "softcap", "alibi_slopes"]
    assert schema.arguments[names.index("num_splits")].default_value == 0


@pytest.mark.parametrize("paged", [False, True])
def test_device_work_runs_on_meta_tensors(paged):
    """The append, rotary and metadata on tensors without data (the meta device): any read of a value back to the
    host (.item(), .tolist(), bool(), a boolean mask) raises there, which a CPU tensor would let pass unseen."""
    q, kc, vc, extra = _paged() if paged else inputs()
    meta = {n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in extra.items()}
    p = validate.check_kvcache_inputs(q, kc, vc, **extra)
    q, kc, vc = (t.to("meta") for t in (q, kc, vc))
    packed = kvcache.plan(q, kc, vc, meta["cache_seqlens"], meta.get("cache_batch_idx"), meta.get("cache_leftpad"), p)
    packed = kvcache.apply(packed, q, kc, vc, meta["k"], meta["v"], meta["rotary_cos"], meta["rotary_sin"],
                           meta["cache_seqlens"], meta.get("cache_batch_idx"), meta.get("block_table"), p, True, True)
    assert packed.q.device.type == "meta" and packed.q.shape == (p.batch * p.seq_q, p.heads, p.head_dim)
    assert packed.seqused_k.shape == (p.batch,) and packed.cu_k.shape == (p.batch + 1,)
