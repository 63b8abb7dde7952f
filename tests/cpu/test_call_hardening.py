"""Calls that gave a wrong answer or an unclear error: sizes past 32 bits, out overlapping an input (packed
metadata included), loose argument types, a bad knob noticed late, and warm that wrote nothing. Each raises
before any launch."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rtcattn

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


@pytest.mark.parametrize("scale", [1e39, 1e-39, -1.0, 0.0, float("inf")])
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
    return subprocess.run([sys.executable, "-m", "rtcattn", "warm", "--arch", "gfx942-emu", "--kernels", "baseline",
                           "--layout", "bshd", "--round-mode", "rtz", "--mask", "none", "--head-dim", "64", "--cache-dir", str(cache),
                           *extra], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def test_warm_into_an_unusable_dir_fails_and_says_why(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    res = _warm(cache)
    assert res.returncode != 0, res.stdout
    assert f"cache dir {cache} is not used because it is writable by" in res.stderr and "nothing was written" in res.stderr
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
