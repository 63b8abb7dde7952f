"""Calls that gave a wrong answer or an unclear error: sizes past 32 bits, ints past 64 bits, out overlapping an
input (packed metadata included), loose argument types, runtime errors naming internal fields, a bad knob
noticed late, and warm that wrote nothing. Each raises before any launch."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rtcattn
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import validate
from rtcattn.runtime import dispatch

ROOT = Path(__file__).resolve().parents[2]
BF = torch.bfloat16
I32 = torch.int32


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_seq_k_past_32_bits_names_its_true_value(emulated):
    q = torch.randn(1, 1, 2, 128).to(BF)
    kv = torch.randn(1, 1, 2, 128).to(BF).expand(1, 2**32 + 16, 2, 128)  # no memory behind the rows
    with pytest.raises(ValueError, match=r"seq_k=4294967312 is not accepted; accepted: 1\.\.2147483647"):
        rtcattn.forward(q, kv, kv, return_lse=True)


def test_seq_k_between_2_31_and_2_32_is_not_shown_wrapped(emulated):
    q = torch.randn(1, 1, 2, 128).to(BF)
    kv = torch.randn(1, 1, 2, 128).to(BF).expand(1, 2**31 + 5, 2, 128)
    with pytest.raises(ValueError, match=r"seq_k=2147483653 is not accepted") as e:
        rtcattn.forward(q, kv, kv)
    assert "-2147483643" not in str(e.value)


def test_batch_too_large_for_every_kernel_raises_naming_it(emulated):
    q = torch.randn(1, 1, 1, 128).to(BF).expand(2**31 - 1, 1, 1, 128)  # would need a 35 TB workspace
    with pytest.raises(ValueError, match="batch=2147483647"):
        rtcattn.forward(q, q, q)


def test_out_overlapping_an_input_is_refused(emulated):
    q, k, v = (torch.randn(1, 16, 2, 64).to(BF) for _ in range(3))
    for name, t in (("k", k), ("q", q), ("v", v)):
        with pytest.raises(ValueError, match=f"out overlaps {name} in memory"):
            rtcattn.forward(q, k, v, out=t)
    big = torch.randn(2, 16, 2, 64).to(BF)
    with pytest.raises(ValueError, match="out overlaps k"):  # the same storage, overlapping bytes
        rtcattn.forward(q, big[1:], v, out=big.view(-1)[16 * 2 * 64 // 2:][:16 * 2 * 64].view(1, 16, 2, 64))
    with pytest.raises(ValueError, match="elements that share memory"):
        rtcattn.forward(q, k, v, out=torch.zeros(1, 1, 2, 64, dtype=BF).expand(1, 16, 2, 64))
    out = torch.empty(1, 16, 2, 64, dtype=BF)       # distinct memory: accepted
    assert rtcattn.forward(q, k, v, out=out) is out


def _paged_call(meta):
    """A paged call of two sequences (15 and 25 query rows; 20 and 12 keys in pages of 16)."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(40, 2, 128, generator=gen).to(BF)
    kp, vp = (torch.randn(4, 16, 2, 128, generator=gen).to(BF) for _ in range(2))
    return lambda out: rtcattn.forward_varlen(q, kp, vp, meta["cu_seqlens_q"], meta["cu_seqlens_k"], 25, 20,
                                              block_table=meta["block_table"], out=out)


def _metadata():
    return dict(cu_seqlens_q=torch.tensor([0, 15, 40], dtype=I32), cu_seqlens_k=torch.tensor([0, 20, 32], dtype=I32),
                block_table=torch.tensor([[2, 0], [3, 1]], dtype=I32))


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k", "block_table"])
def test_varlen_out_overlapping_metadata_is_refused(emulated, name):
    """The kernels read cu_seqlens and the block table while they write out: an out over them would
    change the metadata under the workgroups still reading it."""
    meta = _metadata()
    out_bytes = torch.zeros(40 * 2 * 128 * 2 + 64, dtype=torch.uint8)  # out, then 64 spare bytes
    out = out_bytes[:40 * 2 * 128 * 2].view(BF).view(40, 2, 128)
    inside = out_bytes[1024:1024 + meta[name].numel() * 4].view(I32).view(meta[name].shape)
    inside.copy_(meta[name])
    meta[name] = inside
    pattern = (rf"out overlaps {name} in memory \(out bytes .*\); accepted: an out that shares no memory with any "
               r"input \(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table\)")
    with pytest.raises(ValueError, match=pattern):
        _paged_call(meta)(out)
    assert torch.equal(inside, _metadata()[name]) and not out_bytes[:1024].any()  # nothing written
    beside = out_bytes[-64:][:meta[name].numel() * 4].view(I32).view(meta[name].shape)  # right after out: accepted
    beside.copy_(_metadata()[name])
    meta[name] = beside
    want = _paged_call(_metadata())(None)
    assert _paged_call(meta)(out) is out and torch.equal(out.view(torch.int16), want.view(torch.int16))


# Ints the op's int64 schema cannot carry (and 2**31, which it can but the kernels cannot take), per argument.
PAST = [2**63, -2**63 - 1, 2**64 + 5]
MAX = 2**31 - 1  # the kernels' bound (32-bit indexing): Python's messages and the runtime's state the same


def _dense(fn="forward", **kw):
    q = torch.randn(1, 4, 2, 64).to(BF)
    return lambda: getattr(rtcattn, fn)(q, q, q, **kw)


def _packed(fn="forward_varlen", max_q=5, max_k=5, **kw):
    q = torch.randn(9, 2, 64).to(BF)
    cu = torch.tensor([0, 4, 9], dtype=I32)
    return lambda: getattr(rtcattn, fn)(q, q, q, cu, cu, max_q, max_k, **kw)


def _aiter_standin(monkeypatch):
    import types
    monkeypatch.setitem(sys.modules, "aiter", types.ModuleType("aiter"))
    rtcattn.aiter.register()
    return sys.modules["aiter"]


@pytest.mark.parametrize("value", PAST + [2**31])
@pytest.mark.parametrize("name", ["max_seqlen_q", "max_seqlen_k"])
def test_max_seqlen_past_the_kernels_range_is_named_with_the_range(emulated, name, value):
    pattern = rf"{name}={value} is not supported; accepted: an int >= 1 and <= {MAX}"
    for fn in ("forward_varlen", "flash_attn_varlen_func"):
        with pytest.raises(ValueError, match=pattern):
            _packed(fn, **{name.replace("seqlen_", ""): value})()


@pytest.mark.parametrize("value", PAST)
def test_ints_past_64_bits_get_our_error_not_the_dispatchers(emulated, monkeypatch, value):
    window = (rf"window_size=.*{abs(value)}.* is not supported; accepted: a pair \(left, right\) of integers >= -1 "
              rf"and <= {MAX}")
    for call in (_dense(window_size=(value, 0)), _dense("flash_attn_func", window_size=(0, value)),
                 _packed(window_size=(value, -1))):
        with pytest.raises(ValueError, match=window):
            call()
    with pytest.raises(ValueError, match=rf"min_seqlen_q={value} is not supported; accepted: an int >= 0 and <= {MAX}"):
        _packed("flash_attn_varlen_func", min_seqlen_q=value)()
    with pytest.raises(ValueError, match=rf"how_v3_bf16_cvt={value} is not supported"):
        _dense("flash_attn_func", how_v3_bf16_cvt=value)()
    aiter = _aiter_standin(monkeypatch)
    q = torch.randn(9, 2, 64).to(BF)
    cu = torch.tensor([0, 4, 9], dtype=I32)
    with pytest.raises(ValueError, match=window):
        aiter.rtcattn_fwd(q[None], q[None], q[None], window_size=(value, 0))
    with pytest.raises(ValueError, match=rf"max_seqlen_k={value} is not supported; accepted: an int >= 1 and <= {MAX}"):
        aiter.rtcattn_varlen_fwd(q, q, q, cu, cu, 5, value)
    with pytest.raises(ValueError, match=rf"min_seqlen_q={value} is not supported"):
        aiter.rtcattn_varlen_fwd(q, q, q, cu, cu, 5, 5, value)


def test_softmax_scale_past_float_range_is_named_not_overflowed():
    q = torch.randn(1, 4, 2, 64).to(BF)
    for call in (lambda: rtcattn.forward(q, q, q, softmax_scale=10**400),
                 lambda: rtcattn.flash_attn_func(q, q, q, softmax_scale=-10**400)):
        with pytest.raises(ValueError, match=r"softmax_scale=-?1000000000.* is not supported; accepted: None"):
            call()


def _args_block():
    """The runtime's argument block of a valid paged call (nothing launched)."""
    meta = _metadata()
    q = torch.randn(40, 2, 128).to(BF)
    kp = torch.randn(4, 16, 2, 128).to(BF)
    p = validate.check_varlen_inputs(q, kp, kp, meta["cu_seqlens_q"], meta["cu_seqlens_k"], 25, 20,
                                            block_table=meta["block_table"])
    keep = (q, kp, meta)  # the block holds their addresses
    return attention_fwd.args_block_varlen(q, kp, kp, None, meta["cu_seqlens_q"], meta["cu_seqlens_k"],
                                           meta["block_table"], p,
                                           dispatch.arch_fields("gfx942", 304)), keep


@pytest.mark.parametrize("field,value,pattern", [
    ("seq_q", 2**31, rf"max_seqlen_q=2147483648 is not accepted; accepted: 1\.\.{MAX}"),
    ("seq_k", 2**40, rf"max_seqlen_k=1099511627776 is not accepted; accepted: 1\.\.{MAX}"),
    ("pages_per_seq", 2**31, r"block_table\.shape\[1\]=2147483648 is not accepted"),
    ("table_stride", 1, r"block_table\.stride\(0\)=1 is not accepted; accepted: 0 \(one row for every sequence\) "
                        rf"or block_table\.shape\[1\]=2\.\.{MAX}"),
    ("table_stride", 2**30, r"block_table\.stride\(0\)\*batch=1073741824\*2 \(batch = len\(cu_seqlens_q\) - 1\) "
                            "is not accepted"),
])
def test_runtime_errors_name_the_callers_arguments(emulated, field, value, pattern):
    """What the runtime refuses (the C ABI, or a caller past the Python checks) is named as the caller
    passed it: a packed call's max_seqlen_q, not the argument block's seq_q."""
    args, keep = _args_block()
    assert dispatch.lib().op_supports("attention_fwd", "baseline", args, "host") is None
    setattr(args, field, value)
    with pytest.raises(ValueError, match=pattern):
        dispatch.lib().op_supports("attention_fwd", "baseline", args, "host")


@pytest.mark.parametrize("value", [[1], 1.0, "1", None, True])
def test_how_v3_bf16_cvt_must_be_0_1_or_2(value):
    q = torch.randn(1, 4, 2, 64).to(BF)
    with pytest.raises(ValueError, match=r"how_v3_bf16_cvt=.* is not supported; accepted: 0 \(RTNE\)"):
        rtcattn.flash_attn_func(q, q, q, how_v3_bf16_cvt=value)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_return_lse_must_be_a_bool(value):
    q = torch.randn(1, 4, 2, 64).to(BF)
    with pytest.raises(TypeError, match=r"return_lse=.* is not supported; accepted: True or False"):
        rtcattn.forward(q, q, q, return_lse=value)


@pytest.mark.parametrize("scale", [1e39, 3e38, 1e-39, -1.0, 0.0, float("inf")])
def test_softmax_scale_must_be_a_normal_float32(scale):
    q = torch.randn(1, 4, 2, 64).to(BF)
    with pytest.raises(ValueError, match=re.escape(f"softmax_scale={scale!r} is not supported")) as e:
        rtcattn.forward(q, q, q, softmax_scale=scale)
    assert "=inf is not accepted" not in str(e.value)


def test_bad_knob_is_named_before_anything_compiles(emulated, monkeypatch):
    monkeypatch.setenv("RTCATTN_NO_TAIL", "maybe")
    q = torch.randn(1, 40, 2, 128).to(BF)
    with pytest.raises(ValueError, match="RTCATTN_NO_TAIL='maybe' is not a boolean"):
        rtcattn.forward(q, q, q)
    assert not emulated.exists() or not list(emulated.glob("*.co"))  # nothing was compiled first


def _warm(cache, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    env["PYTHONPATH"] = str(ROOT / "python")
    return subprocess.run([sys.executable, "-m", "rtcattn", "warm", "--all", "--arch", "gfx942-emu",
                           "--kernels", "baseline", "--round-mode", "rtz", "--mask", "none", "--head-dim", "64",
                           "--score-mod", "plain", "--dropout", "nodrop", "--cache-dir", str(cache), *extra],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def test_warm_into_an_unusable_dir_fails_and_says_why(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    res = _warm(cache)
    assert res.returncode != 0, res.stdout
    assert f"cache dir {cache} is not used because it is writable by" in res.stderr
    assert "nothing was written" in res.stderr
    assert not list(cache.iterdir())
    other = tmp_path / "foreign"
    other.mkdir()
    os.chown(other, 12345, 12345)
    res = _warm(other)
    assert res.returncode != 0 and "owned by uid 12345" in res.stderr, res.stderr


def test_first_call_imports_no_dynamo_and_is_reported(tmp_path):
    """The first eager call no longer imports torch._dynamo (about 2 s); `first-call` reports the figure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    env.update(PYTHONPATH=str(ROOT / "python"), RTCATTN_EMULATE="gfx942", RTCATTN_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "rtcattn", "first-call", "--device", "cpu", "--shape", "1,32,1,64",
                          "--runs", "1", "--steady", "2"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "torch._dynamo imported: False" in res.stdout, res.stdout
    assert re.search(r"first call over steady state, median of 1 fresh processes .*: -?\d+\.\d ms", res.stdout)
