"""Quantized KV caches' arguments: every bad one is refused before anything is launched or written, naming the
argument, its value and what is accepted (the Python checks, and the runtime's own for a caller past them); the
kv_dtype values the kernels read (attn_params.h) are the manifest's; the ops stay traceable (schemas, fakes)."""
import re
from pathlib import Path

import pytest
import torch
from test_kvcache_api import inputs

import rtcattn
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import kvquant, stub, validate
from rtcattn.runtime import dispatch, manifest

BF, I32 = torch.bfloat16, torch.int32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def emulated(monkeypatch, tmp_path):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(tmp_path / "cache"))


def _paged_call(kind: str) -> dict:
    """A valid paged forward_varlen call (2 sequences, Hq 4, Hk 2, D 64, 16-row pages) with a cache of `kind`."""
    q = torch.randn(6, 4, 64).to(BF)
    pool = torch.randn(5, 16, 2, 64).to(BF)
    call = dict(q=q, cu_seqlens_q=torch.tensor([0, 1, 6], dtype=I32), cu_seqlens_k=torch.tensor([0, 20, 40], dtype=I32),
                max_seqlen_q=5, max_seqlen_k=20, block_table=torch.tensor([[0, 1], [2, 3]], dtype=I32))
    if kind == "fp4":
        (k, ks), (v, vs) = kvquant.quantize_fp4(pool), kvquant.quantize_fp4(pool)
        return dict(call, k=k.permute(0, 2, 1, 3), v=v.permute(0, 2, 1, 3), kv_cache_dtype="fp4_e2m1", k_scale=ks,
                    v_scale=vs)
    if kind == "fp8":
        k = kvquant.quantize_fp8(pool, torch.ones(()))
        return dict(call, k=k, v=k.clone(), k_descale=torch.ones(2, 2), v_descale=torch.ones(1))
    return dict(call, k=pool, v=pool.clone())


BAD_VARLEN = [  # (cache kind, change of the call, error type, message)
    ("bf16", lambda a: a.update(k_descale=torch.ones(1)), ValueError,
     r"k_descale given with a cache in q's dtype is not supported; accepted: k_descale=None \(descales go with an FP8 "
     r"cache"),
    ("bf16", lambda a: a.update(v_scale=torch.ones(5, 16, 2, dtype=torch.uint8)), ValueError,
     r"v_scale given with a cache in q's dtype is not supported; accepted: v_scale=None"),
    ("bf16", lambda a: a.update(kv_cache_dtype="fp8_e4m3"), ValueError,
     r"kv_cache_dtype='fp8_e4m3' with k.dtype=torch.bfloat16 is not supported; accepted: 'auto'"),
    ("bf16", lambda a: a.update(kv_cache_dtype="fp8"), ValueError, r"kv_cache_dtype.*'fp8'.*fp4_e2m1"),
    ("bf16", lambda a: a.update(k=a["k"].view(torch.uint8)), TypeError,
     r"k.dtype=torch.uint8 is not supported without kv_cache_dtype='fp4_e2m1'"),
    ("fp8", lambda a: a.update(q=a["q"].to(torch.float8_e4m3fn)), TypeError,
     r"q.dtype=torch.float8_e4m3fn is not supported; accepted: torch.bfloat16, torch.float16"),
    ("fp8", lambda a: a.update(v=a["v"].to(BF)), TypeError,
     r"mismatched dtypes: k.dtype=torch.float8_e4m3fn, v.dtype=torch.bfloat16; accepted: one FP8 dtype for both"),
    ("fp8", lambda a: a.update(v=a["v"].float().to(torch.float8_e4m3fnuz)), TypeError,
     r"mismatched dtypes: k.dtype=torch.float8_e4m3fn, v.dtype=torch.float8_e4m3fnuz"),
    ("fp8", lambda a: a.update(kv_cache_dtype="fp8_e4m3fnuz"), ValueError,
     r"kv_cache_dtype='fp8_e4m3fnuz' with k.dtype=torch.float8_e4m3fn is not supported; accepted: 'auto' or "
     r"'fp8_e4m3'"),
    ("fp8", lambda a: a.update(k_descale=torch.ones(2, 3)), ValueError,
     r"k_descale.shape=\(2, 3\) is not supported; accepted: \[B=2, Hk=2\] \(per sequence and K/V head\) or one"),
    ("fp8", lambda a: a.update(v_descale=torch.ones(2, 2, dtype=torch.float16)), TypeError,
     r"v_descale.dtype=torch.float16 is not supported; accepted: torch.float32"),
    ("fp8", lambda a: a.update(k_descale=torch.ones(1, device="meta")), ValueError,
     r"k_descale.device=meta is not supported; accepted: q's device cpu"),
    ("fp8", lambda a: a.update(k_scale=torch.ones(5, 16, 2, dtype=torch.uint8)), ValueError,
     r"k_scale given with a fp8_e4m3 cache is not supported; accepted: k_scale=None"),
    ("fp8", lambda a: a.update(q=a["q"][..., :36], k=a["k"][..., :36], v=a["v"][..., :36]), ValueError,
     r"head dim D=36 with a fp8_e4m3 cache is not supported; accepted: a multiple of 8 \(a quantized cache is not "
     r"padded\)"),
    ("fp4", lambda a: a.update(k_scale=None), ValueError,
     r"k_scale=None with kv_cache_dtype='fp4_e2m1' is not supported; accepted: its E8M0 scales, uint8 \[5, 16, 2\]"),
    ("fp4", lambda a: a.update(v_scale=a["v_scale"][:, :8]), ValueError,
     r"v_scale.shape=\(5, 8, 2\) is not supported; accepted: \[5, 16, 2\] \[num_blocks, page_size, Hk\]"),
    ("fp4", lambda a: a.update(k_scale=a["k_scale"].to(I32)), TypeError,
     r"k_scale.dtype=torch.int32 is not supported; accepted: torch.uint8 \(E8M0\)"),
    ("fp4", lambda a: a.update(k_descale=torch.ones(1)), ValueError,
     r"k_descale given with a fp4_e2m1 cache is not supported; accepted: k_descale=None"),
    ("fp4", lambda a: a.update(k=a["k"][..., :16], v=a["v"][..., :16]), ValueError,
     r"mismatched head dim \(FP4: 2 \* k.shape\[3\]\): q=64, k=32"),
    ("fp4", lambda a: a.update(k=a["k"].view(torch.int8), v=a["v"].view(torch.int8)), TypeError,
     r"k.dtype=torch.int8 with kv_cache_dtype='fp4_e2m1' is not supported; accepted: torch.uint8"),
    ("fp4", lambda a: a.update(block_table=None), ValueError,
     r"kv_cache_dtype='fp4_e2m1' without block_table is not supported; accepted: an FP4 cache in pages"),
]


@pytest.mark.parametrize("i", range(len(BAD_VARLEN)))
def test_bad_quantized_varlen_call_is_refused_before_launch(i, monkeypatch):
    kind, change, error, message = BAD_VARLEN[i]
    call = _paged_call(kind)
    rtcattn.forward_varlen(**call)  # valid as given: it runs
    change(call)
    monkeypatch.setattr(dispatch, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(error, match=message):
        rtcattn.forward_varlen(**call)
    with pytest.raises(error, match=message):  # AITER's entry: the same checks
        names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
        positional = [call.pop(n) for n in names]
        rtcattn.flash_attn_varlen_func(*positional, how_v3_bf16_cvt=0, **call)


def _kvcache_call(kind: str) -> dict:
    q, kc, vc, extra = inputs(b=2, sq=1)
    extra = dict(extra, q=q, rotary_cos=None, rotary_sin=None, cache_leftpad=None)
    if kind == "fp8":
        return dict(extra, k_cache=kvquant.quantize_fp8(kc, torch.ones(())),
                    v_cache=kvquant.quantize_fp8(vc, torch.ones(())), k_descale=torch.ones(2, 2))
    pool = torch.randn(6, 16, 2, 64).to(BF)
    (k, ks), (v, vs) = kvquant.quantize_fp4(pool), kvquant.quantize_fp4(pool)
    extra.pop("cache_batch_idx")
    return dict(extra, k_cache=k.permute(0, 2, 1, 3).contiguous(), v_cache=v.permute(0, 2, 1, 3).contiguous(),
                block_table=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32), kv_cache_dtype="fp4_e2m1",
                k_scale=ks, v_scale=vs)


BAD_KVCACHE = [
    ("fp8", lambda a: a.update(v_descale=torch.ones(3)), ValueError,
     r"v_descale.shape=\(3,\) is not supported; accepted: \[B=2, Hk=2\]"),
    ("fp8", lambda a: a.update(k_cache=a["k_cache"].to(BF), v_cache=a["v_cache"].to(BF)), ValueError,
     r"k_descale given with a cache in q's dtype is not supported"),
    ("fp8", lambda a: a.update(k=a["k"].to(torch.float8_e4m3fn)), TypeError, r"k.dtype=torch.float8_e4m3fn"),
    ("fp4", lambda a: a.update(v_scale=None), ValueError, r"v_scale=None with kv_cache_dtype='fp4_e2m1'"),
    ("fp4", lambda a: a.update(block_table=None), ValueError,
     r"kv_cache_dtype='fp4_e2m1' without block_table is not supported; accepted: uint8 \[num_blocks, Hk, page_size, "
     r"D / 2\] with block_table \(FP4\)"),
    ("fp4", lambda a: a.update(k_scale=a["k"].view(torch.uint8).view(-1)[:6 * 16 * 2].view(6, 16, 2)), ValueError,
     r"k overlaps k_scale in memory; accepted: new rows that share no memory with the cache"),
]


@pytest.mark.parametrize("i", range(len(BAD_KVCACHE)))
def test_bad_quantized_kvcache_call_is_refused_before_anything_is_written(i, monkeypatch):
    kind, change, error, message = BAD_KVCACHE[i]
    call = _kvcache_call(kind)
    change(call)
    written = {n: call[n].clone() for n in ("k_cache", "v_cache", "k_scale", "v_scale") if call.get(n) is not None}
    monkeypatch.setattr(dispatch, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(error, match=message):
        rtcattn.flash_attn_with_kvcache(**call)
    for n, t in written.items():
        assert torch.equal(call[n].view(torch.uint8), t.view(torch.uint8)), n


def _args_block(kind="fp8"):
    """The runtime's argument block of a valid quantized paged call (nothing launched)."""
    call = _paged_call(kind)
    quant = validate.KvQuant(call.get("kv_cache_dtype", "auto"), call.get("k_descale"), call.get("v_descale"),
                             call.get("k_scale"), call.get("v_scale"))
    p = validate.check_varlen_inputs(call["q"], call["k"], call["v"], call["cu_seqlens_q"], call["cu_seqlens_k"], 5,
                                     20, block_table=call["block_table"], quant=quant)
    return attention_fwd.args_block_varlen(call["q"], call["k"], call["v"], None, call["cu_seqlens_q"],
                                           call["cu_seqlens_k"], call["block_table"], p,
                                           dispatch.arch_fields("gfx942", 304), quant=quant), call


@pytest.mark.parametrize("kind,field,value,pattern", [
    ("fp8", "kv_dtype", 0, r"k_descale is set with kv_dtype=0 \(same\); accepted: descales only with an FP8 cache"),
    ("fp8", "kv_dtype", 3, r"k_descale is set with kv_dtype=3 \(fp4_e2m1\)"),
    ("fp8", "kv_dtype", 9, r"kv_dtype=9 is not accepted; accepted: 0 \(same: K/V in q's dtype\), 1 \(fp8_e4m3\)"),
    ("fp8", "k_descale_strides", (-1, 0), r"k_descale_strides=\(-1, 0\) is not accepted; accepted: 0\.\."),
    ("fp8", "k_scale", 4096, r"k_scale is set with kv_dtype=1 \(fp8_e4m3\); accepted: E8M0 scales only with an FP4"),
    ("fp4", "v_scale", None, r"v_scale is null with kv_dtype=3 \(fp4_e2m1\); accepted: the cache's E8M0 scales"),
    ("fp8", "v_descale_strides", (0, 2**40), r"v_descale_strides=\(0, 1099511627776\) is not accepted"),
])
def test_runtime_refuses_quantized_fields_that_do_not_match(kind, field, value, pattern):
    """A caller past the Python checks (the C ABI): the runtime's validate names the field and its value."""
    args, keep = _args_block(kind)
    assert dispatch.lib().op_supports("attention_fwd", "baseline", args, "host") is None
    setattr(args, field, value)
    with pytest.raises(ValueError, match=pattern):
        dispatch.lib().op_supports("attention_fwd", "baseline", args, "host")


def test_dense_call_with_a_quantized_kv_dtype_is_refused():
    q = torch.randn(1, 4, 2, 64).to(BF)
    args = attention_fwd.args_block(q, q, q, None, None, "bshd", validate.check_inputs(q, q, q),
                                   dispatch.arch_fields("gfx942", 304))
    args.kv_dtype = 1
    with pytest.raises(ValueError, match=r"kv_dtype=1 \(fp8_e4m3\) on a dense call is not accepted; accepted: a "
                                         r"quantized cache with packed sequences"):
        dispatch.lib().op_supports("attention_fwd", "baseline", args, "host")


def test_kernel_defines_are_the_manifest_values():
    """attn_params.h's RTC_KV_DTYPE_* (what the kernels and the host compare kv_dtype with) equal the manifest's
    kv_dtype values (what the stub fills the block's kv_dtype with and -D RTC_KV_DTYPE takes)."""
    text = (ROOT / "csrc_common" / "attn_params.h").read_text()
    defines = {m.group(1).lower(): int(m.group(2)) for m in re.finditer(r"#define RTC_KV_DTYPE_(\w+) (\d+)", text)}
    values = dict(manifest.load().op("attention_fwd").axis("kv_dtype").values)
    assert defines == values, (defines, values)


def test_fp4_kvcache_op_schema_and_fake_with_its_scales_written(monkeypatch):
    """The kvcache op with an FP4 cache: its schema marks the scales written (the append writes them) and its fake
    gives the output's shapes (torch.library.opcheck's every check, AOT dispatch included: what torch.compile
    traces; the attention itself stubbed out)."""
    monkeypatch.setattr(stub, "_packed", lambda q, k, v, out, *a, **kw: (
        q.clone() if out is None else out.copy_(q), torch.zeros((q.shape[1], q.shape[0]))))
    monkeypatch.setattr(stub, "selection_varlen", lambda *a, **k: None)
    c = _kvcache_call("fp4")
    args = (c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"], None, None, c["cache_seqlens"], None, None,
            c["block_table"], "rtne", None, True, -1, 0, True, 0, None, None, c["k_scale"], c["v_scale"], "fp4_e2m1")
    torch.library.opcheck(torch.ops.rtcattn.fwd_kvcache.default, args)
    assert "Tensor(c!)? k_scale" in str(torch.ops.rtcattn.fwd_kvcache.default._schema)


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
def test_quantized_append_runs_on_meta_tensors(kind):
    """The append into a quantized cache (quantize_kv's code, the scales' write) on tensors without data: no value is
    read back to the host (the meta device raises on any such read)."""
    from rtcattn.ops.attention_fwd import kvcache
    c = _kvcache_call(kind)
    quant = validate.KvQuant(c.get("kv_cache_dtype", "auto"), c.get("k_descale"), None, c.get("k_scale"),
                             c.get("v_scale"))
    p = validate.check_kvcache_inputs(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"],
                                      cache_seqlens=c["cache_seqlens"], cache_batch_idx=c.get("cache_batch_idx"),
                                      block_table=c.get("block_table"), quant=quant)
    meta = {n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in c.items()}
    mq = validate.KvQuant(quant.kv_cache_dtype, *(None if t is None else t.to("meta") for t in (
        quant.k_descale, quant.v_descale, quant.k_scale, quant.v_scale)))
    packed = kvcache.plan(meta["q"], meta["k_cache"], meta["v_cache"], meta["cache_seqlens"],
                          meta.get("cache_batch_idx"), None, p)
    packed = kvcache.apply(packed, meta["q"], meta["k_cache"], meta["v_cache"], meta["k"], meta["v"], None, None,
                           meta["cache_seqlens"], meta.get("cache_batch_idx"), meta.get("block_table"), p, True, True,
                           mq)
    assert packed.k.device.type == "meta" and p.kv_dtype == ("fp4_e2m1" if kind == "fp4" else "fp8_e4m3")
