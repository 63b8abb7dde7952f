"""The packed-sequence calls' surface: AITER's flash_attn_varlen_func signature, the errors bad input gets
before anything launches (each naming the argument, its value and what is accepted), the CHECK knob,
the torch ops' fakes and the aiter registration. Runs on the CPU emulator (small calls)."""
import inspect

import pytest
import torch

import rtcattn
from rtcattn import api

BF = torch.bfloat16
I32 = torch.int32


@pytest.fixture(autouse=True)
def emulated(monkeypatch, tmp_path):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CACHE_DIR", str(tmp_path / "cache"))


def _batch(lens=(5, 0, 9), hq=4, hk=2, d=64):
    total = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=I32)
    q = torch.randn(total, hq, d).to(BF)
    k, v = (torch.randn(total, hk, d).to(BF) for _ in range(2))
    return q, k, v, cu, cu.clone(), max(lens), max(lens)


def test_aiter_signature_and_order():
    # amd-aiter 0.1.7's flash_attn_varlen_func, parameter for parameter.
    names = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "min_seqlen_q",
             "dropout_p", "softmax_scale", "logits_soft_cap", "causal", "window_size", "bias", "alibi_slopes",
             "deterministic", "return_lse", "return_attn_probs", "how_v3_bf16_cvt", "block_table", "out",
             "cu_seqlens_q_padded", "cu_seqlens_k_padded"]
    sig = inspect.signature(rtcattn.flash_attn_varlen_func)
    # a quantized cache's, then flash-attn's name of the soft cap: keyword only, after AITER's parameters
    quant = ["k_descale", "v_descale", "kv_cache_dtype", "k_scale", "v_scale", "softcap"]
    assert list(sig.parameters) == names + quant
    assert all(sig.parameters[n].kind == inspect.Parameter.KEYWORD_ONLY for n in quant)
    assert {n: sig.parameters[n].default for n in quant} == dict(k_descale=None, v_descale=None, kv_cache_dtype="auto",
                                                                 k_scale=None, v_scale=None, softcap=0.0)
    defaults = {n: p.default for n, p in sig.parameters.items()
                if p.default is not inspect.Parameter.empty and n not in quant}
    assert defaults == dict(min_seqlen_q=0, dropout_p=0.0, softmax_scale=None, logits_soft_cap=0.0, causal=False,
                            window_size=(-1, -1), bias=None, alibi_slopes=None, deterministic=False,
                            return_lse=False, return_attn_probs=False, how_v3_bf16_cvt=1, block_table=None, out=None,
                            cu_seqlens_q_padded=None, cu_seqlens_k_padded=None)


def test_aiter_call_matches_forward_varlen_and_returns_lse_as_aiter_does():
    q, k, v, cq, ck, mq, mk = _batch()
    out, lse = rtcattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True, return_lse=True,
                                              how_v3_bf16_cvt=0)
    ref = rtcattn.forward_varlen(q, k, v, cq, ck, mq, mk, causal=True, round_mode="rtne")
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    assert torch.isinf(lse[:, 5:5]).all()  # the zero-length sequence owns no row


# dropout_p, logits_soft_cap, alibi_slopes and return_attn_probs are served (tests/emu/test_dropout_emu.py,
# test_score_mod_emu.py, tests/cpu/test_score_mod_args.py).
@pytest.mark.parametrize("name,value,accepted", [
    ("bias", torch.zeros(1), "None"),
    ("cu_seqlens_q_padded", torch.zeros(4, dtype=I32), "None"),
    ("cu_seqlens_k_padded", torch.zeros(4, dtype=I32), "None"),
])
def test_unsupported_aiter_arguments_raise_not_implemented_naming_them(name, value, accepted):
    q, k, v, cq, ck, mq, mk = _batch()
    with pytest.raises(NotImplementedError, match=rf"{name}=.* is not supported; accepted: {accepted}"):
        rtcattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, **{name: value})


def _bad(what):
    q, k, v, cq, ck, mq, mk = _batch()
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk)
    what(args)
    return args


@pytest.mark.parametrize("edit,pattern", [
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].long()),
     r"cu_seqlens_q\.dtype=torch\.int64 .*accepted: torch\.int32"),
    (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"].float()), r"cu_seqlens_k\.dtype=torch\.float32"),
    (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"][:-1]), r"len\(cu_seqlens_q\)=4 != len\(cu_seqlens_k\)=3"),
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"][None]), r"cu_seqlens_q\.ndim=2"),
    (lambda a: a.update(max_seqlen_q=0), r"max_seqlen_q=0 is not supported; accepted: an int >= 1"),
    (lambda a: a.update(max_seqlen_k=-3), r"max_seqlen_k=-3 is not supported"),
    (lambda a: a.update(max_seqlen_k=2.0), r"max_seqlen_k=2\.0 is not supported"),
    (lambda a: a.update(q=a["q"].float()), r"q\.dtype=torch\.float32"),
    (lambda a: a.update(q=a["q"][None]), r"q\.ndim=4 .*accepted: 3 dims, \[total_q, Hq, D\]"),
    (lambda a: a.update(k=a["k"][:, :1]), r"mismatched k and v shapes"),
    (lambda a: a.update(k=a["k"][:, :, :32], v=a["v"][:, :, :32]), r"mismatched head dim"),
    (lambda a: a.update(k=a["k"][:, :1].repeat(1, 3, 1), v=a["v"][:, :1].repeat(1, 3, 1)),
     r"mismatched number of heads"),
    (lambda a: a.update(block_table=torch.zeros(3, 2, dtype=torch.int64)),
     r"k\.ndim=3 .*\[num_pages, page_size, Hk, D\]"),
])
def test_bad_input_raises_naming_the_argument_before_launch(edit, pattern):
    args = _bad(edit)
    with pytest.raises((ValueError, TypeError), match=pattern):
        rtcattn.forward_varlen(**args)


def _paged(page=16, pages=6, width=2):
    q, k, v, cq, ck, mq, mk = _batch()
    kp, vp = (torch.randn(pages, page, 2, 64).to(BF) for _ in range(2))
    table = torch.arange(3 * width, dtype=I32).reshape(3, width) % pages
    return dict(q=q, k=kp, v=vp, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk,
                block_table=table)


@pytest.mark.parametrize("edit,pattern", [
    (lambda a: a.update(block_table=a["block_table"].long()), r"block_table\.dtype=torch\.int64 .*torch\.int32"),
    (lambda a: a.update(block_table=a["block_table"][:2]), r"block_table\.shape=\(2, 2\) .*\[batch=3, pages >= 1\]"),
    (lambda a: a.update(block_table=a["block_table"][:, 0]), r"block_table\.ndim=1"),
    (lambda a: a.update(k=a["k"][:, :8], v=a["v"][:, :8]),
     r"page_size=8 is not accepted; accepted: a power of two >= 16"),
    (lambda a: a.update(k=torch.randn(4, 24, 2, 64).to(BF), v=torch.randn(4, 24, 2, 64).to(BF)),
     r"page_size=24 is not accepted; accepted: a power of two >= 16"),
])
def test_bad_paged_input_raises_naming_the_argument(edit, pattern):
    args = _paged()
    edit(args)
    with pytest.raises((ValueError, TypeError), match=pattern):
        rtcattn.forward_varlen(**args)


def test_check_knob_reads_metadata_back_and_refuses_bad_values(monkeypatch):
    """Without RTCATTN_CHECK the kernels survive bad metadata (no host sync, nothing read outside the
    tensors: the emulator's range checks); with it, the call refuses it and names the entry."""
    q, k, v, cq, ck, mq, mk = _batch()
    decreasing = torch.tensor([0, 9, 5, 14], dtype=I32)
    rtcattn.forward_varlen(q, k, v, decreasing, ck, mq, mk)  # runs: clamped, memory-safe
    monkeypatch.setenv("RTCATTN_CHECK", "1")
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\]=5 < cu_seqlens_q\[1\]=9; accepted: non-decreasing"):
        rtcattn.forward_varlen(q, k, v, decreasing, ck, mq, mk)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\]=13 is not supported; accepted: the packed rows, 14"):
        rtcattn.forward_varlen(q, k, v, cq, torch.tensor([0, 5, 5, 13], dtype=I32), mq, mk)
    with pytest.raises(ValueError, match=r"sequence 2 has length 9 > max_seqlen_q=5"):
        rtcattn.forward_varlen(q, k, v, cq, ck, 5, mk)
    args = _paged()
    args["block_table"][1, 0] = 99
    args["cu_seqlens_k"] = torch.tensor([0, 5, 6, 15], dtype=I32)
    with pytest.raises(ValueError, match=r"block_table\[1, 0\]=99 is not supported; accepted: a page id in \[0, 6\)"):
        rtcattn.forward_varlen(**args)
    monkeypatch.delenv("RTCATTN_CHECK")
    rtcattn.forward_varlen(**args)  # out-of-range page ids read zeros


def test_check_knob_accepts_kv_lengths_past_max_seqlen_k(monkeypatch):
    """max_seqlen_k only sizes the launch (FlashAttention's contract): a longer KV sequence is valid."""
    q, k, v, cq, ck, mq, mk = _batch()
    monkeypatch.setenv("RTCATTN_CHECK", "1")
    out = rtcattn.forward_varlen(q, k, v, cq, ck, mq, 1)
    monkeypatch.delenv("RTCATTN_CHECK")
    assert torch.equal(out.view(torch.int16), rtcattn.forward_varlen(q, k, v, cq, ck, mq, mk).view(torch.int16))


def test_empty_batch_and_no_query_rows_launch_nothing():
    q, k, v, cq, ck, mq, mk = _batch()
    one = torch.zeros(1, dtype=I32)
    out, lse = rtcattn.forward_varlen(q[:0], k, v, one, one, 1, 1, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)


def _poisoned_heap(nbytes):
    """Frees NaN-filled memory of nbytes, which the next allocation of that size tends to reuse: an output
    left uninitialised then shows NaN rather than the zeros of a fresh page."""
    junk = torch.full((nbytes // 4,), float("nan"))
    del junk


def test_check_knob_runs_for_calls_without_sequences_or_query_rows(monkeypatch):
    """RTCATTN_CHECK=1 checks every call, an empty one too: cu_seqlens=[0] with 120 q rows claims no row."""
    monkeypatch.setenv("RTCATTN_CHECK", "1")
    q, k, v, cq, ck, mq, mk = _batch()
    one = torch.zeros(1, dtype=I32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\]=0 is not supported; accepted: the packed rows, 120"):
        rtcattn.forward_varlen(torch.randn(120, 4, 64).to(BF), k, v, one, one, 1, 1)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\]=3 is not supported; accepted: the packed rows, 0"):
        rtcattn.forward_varlen(q[:0], k, v, torch.tensor([0, 3], dtype=I32), torch.tensor([0, 14], dtype=I32), 3, 14)
    out, lse = rtcattn.forward_varlen(q[:0], k, v, torch.tensor([0, 0], dtype=I32), torch.tensor([0, 14], dtype=I32),
                                      1, 14, return_lse=True)  # consistent metadata: accepted
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)


def test_no_sequence_gives_zero_rows_and_launches_nothing(monkeypatch):
    """batch = 0 with query rows (no CHECK): no sequence owns a row, so every row reads as a row that sees
    no key (O = 0, LSE = -inf), not as the stale memory of an unwritten torch.empty."""
    from rtcattn.runtime import dispatch
    monkeypatch.setattr(dispatch, "launch", lambda *a: pytest.fail("launched"))
    q = torch.randn(120, 4, 64).to(BF)
    k = torch.randn(14, 2, 64).to(BF)
    one = torch.zeros(1, dtype=I32)
    _poisoned_heap(q.numel() * 2)
    out, lse = rtcattn.forward_varlen(q, k, k, one, one, 1, 1, return_lse=True)
    assert out.shape == q.shape and not out.any() and not out.isnan().any()
    assert lse.shape == (4, 120) and bool((lse == -torch.inf).all())
    given = torch.full_like(q, 7.0)
    assert rtcattn.forward_varlen(q, k, k, one, one, 1, 1, out=given) is given and bool((given == 7.0).all())


def test_rows_past_the_last_sequence_are_zero_without_the_check_knob():
    """Rows past cu_seqlens_q[-1] (as a captured graph's padding leaves them) are no sequence's: O = 0 and
    LSE = -inf; the sequences' rows equal the call without the padding, bit for bit."""
    q, k, v, cq, ck, mq, mk = _batch()
    padded = torch.cat([q, torch.randn(6, 4, 64).to(BF)])
    _poisoned_heap(padded.numel() * 2)
    out, lse = rtcattn.forward_varlen(padded, k, v, cq, ck, mq, mk, causal=True, return_lse=True)
    want, want_lse = rtcattn.forward_varlen(q, k, v, cq, ck, mq, mk, causal=True, return_lse=True)
    assert torch.equal(out[:14].view(torch.int16), want.view(torch.int16)) and torch.equal(lse[:, :14], want_lse)
    assert not out[14:].any() and not out[14:].isnan().any() and bool((lse[:, 14:] == -torch.inf).all())


def test_fake_gives_shapes_under_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v, cq, ck, mq, mk = _batch()
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.rtcattn.fwd_varlen(q, k, v, cq, ck, mq, mk, "rtne", None, True)
        assert out.shape == q.shape and lse.shape == (4, 14)
        with pytest.raises(ValueError, match="max_seqlen_q=0"):
            torch.ops.rtcattn.fwd_varlen(q, k, v, cq, ck, 0, mk, "rtne", None, True)


def test_signature_helper_is_the_api_one():
    assert rtcattn.flash_attn_varlen_func is api.flash_attn_varlen_func
    assert rtcattn.forward_varlen is api.forward_varlen


HEAD_DIM_RULE = r"accepted: a head dim in 8\.\.256; one that is not a multiple of 8 is padded to the next multiple of 8"


@pytest.mark.parametrize("d", [0, 4, 264])
@pytest.mark.parametrize("paged", [False, True], ids=["varlen", "paged"])
def test_bad_head_dim_raises_on_every_packed_entry(d, paged):
    q, k, v, cq, ck, mq, mk = _batch(d=d)
    table = None
    if paged:
        k, v = (torch.randn(4, 16, 2, d).to(BF) for _ in range(2))
        table = torch.zeros(3, 1, dtype=I32)
    pattern = rf"head dim D={d} \(q\.shape=\(14, 4, {d}\)\) is not supported; {HEAD_DIM_RULE}"
    with pytest.raises(ValueError, match=pattern):
        rtcattn.forward_varlen(q, k, v, cq, ck, mq, mk, block_table=table)
    with pytest.raises(ValueError, match=pattern):
        rtcattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, block_table=table, out=torch.empty_like(q))
    with pytest.raises(ValueError, match=pattern):
        torch.ops.rtcattn.fwd_varlen(q, k, v, cq, ck, mq, mk, "rtne", None, False, block_table=table)


def test_padded_out_keeps_rows_no_sequence_owns():
    """D = 59 runs padded to 64 on a copy of out: rows past cu_seqlens_q[-1] keep out's values, the sequences'
    rows equal the call without out, bit for bit."""
    q, k, v, cq, ck, mq, mk = _batch(d=59)
    padded = torch.cat([q, torch.randn(6, 4, 59).to(BF)])
    given = torch.full_like(padded, 7.0)
    res, lse = rtcattn.forward_varlen(padded, k, v, cq, ck, mq, mk, causal=True, return_lse=True, out=given)
    want, want_lse = rtcattn.forward_varlen(q, k, v, cq, ck, mq, mk, causal=True, return_lse=True)
    assert res is given and want.shape == q.shape and want.is_contiguous()
    assert torch.equal(given[:14].view(torch.int16), want.view(torch.int16)) and torch.equal(lse[:, :14], want_lse)
    assert bool((given[14:] == 7.0).all()) and bool((lse[:, 14:] == -torch.inf).all())
