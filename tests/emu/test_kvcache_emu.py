"""rtcattn.flash_attn_with_kvcache on the emulated gfx942 (dispatch's choice, and the baseline pinned for some cases),
against the host reference of flash-attn's semantics (ops/attention_fwd/reference.py: reference_kvcache).

Each case checks the cache after the append (untouched rows and v bit for bit, rotated k within one ulp of the
fp64 rotation: the entry rotates in fp32), the output against the fp64 reference (err <= 2 err(R) + 1e-5, R being
the kernels' algorithm on the reference's own rotated inputs) and the LSE [B, Hq, Sq]. Bad metadata must only
complete (the emulator fails a launch on any access outside the tensors) or, under RTCATTN_CHECK=1, be refused.
"""
import math

import pytest
import torch

import rtcattn
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import kvcache, reference as ref, validate
from rtcattn.runtime import _lib, dispatch

pytestmark = pytest.mark.emu

#  (B, Sq, S_new, (Hq, Hk), S_max or page, paged, batch_idx, leftpad, rotary (interleaved or None), window, dtype)
CASES = [
    (3, 1, 1, (4, 2), 96, False, False, False, True, (-1, 0), torch.bfloat16),
    (2, 4, 4, (8, 1), 64, False, True, True, False, (-1, -1), torch.float16),
    (3, 16, 16, (2, 2), 80, False, False, True, None, (20, 0), torch.bfloat16),
    (2, 5, 3, (4, 1), 16, True, False, False, True, (-1, 0), torch.bfloat16),
    (2, 2, 0, (4, 2), 32, True, False, False, None, (-1, -1), torch.float16),
    (4, 7, 2, (4, 4), 64, False, True, False, False, (3, 2), torch.bfloat16),
]


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def make(case, seed=0):
    b, sq, new, (hq, hk), s, paged, with_idx, with_lp, rotary, window, dtype = case
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(shape, generator=gen).to(dtype)  # noqa: E731
    d = 64
    if paged:
        pages_per_seq = 4
        num_blocks = b * pages_per_seq + 3
        kc, vc = rnd(num_blocks, s, hk, d), rnd(num_blocks, s, hk, d)
        table = torch.randperm(num_blocks, generator=gen)[:b * pages_per_seq].view(b, pages_per_seq).to(torch.int32)
        capacity = pages_per_seq * s
    else:
        kc, vc = rnd(b + 2, s, hk, d), rnd(b + 2, s, hk, d)
        table, capacity = None, s
    seqlens = torch.randint(0, capacity - new + 1, (b,), generator=gen).to(torch.int32)
    args = dict(k=rnd(b, new, hk, d) if new else None, v=rnd(b, new, hk, d) if new else None,
                cache_seqlens=seqlens, block_table=table)
    if with_idx:
        args["cache_batch_idx"] = torch.randperm(b + 2, generator=gen)[:b].to(torch.int32)
    if with_lp:
        args["cache_leftpad"] = (seqlens * torch.rand(b, generator=gen)).to(torch.int32)
    if rotary is not None:
        args.update(rotary_cos=rnd(capacity + 5, 16), rotary_sin=rnd(capacity + 5, 16), rotary_interleaved=rotary)
    return rnd(b, sq, hq, d), kc, vc, args, window


def run_case(case, seed=0, mode="rtne"):
    q, kc, vc, args, window = make(case, seed)
    causal = window == (-1, 0)
    rargs = {n: a for n, a in args.items() if n != "rotary_interleaved"}
    interleaved = args.get("rotary_interleaved", True)
    (kr, vr), (o64, lse64) = ref.reference_kvcache(q, kc, vc, **rargs, window=window, rotary_interleaved=interleaved)
    r = ref.reference_kvcache(q, kc, vc, **rargs, window=window, rotary_interleaved=interleaved, round_mode=mode)[1]
    cvt = {"rtne": 0, "rtna": 1, "rtz": 2}[mode]
    ws = (-1, -1) if causal else window
    out, lse = rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, causal=causal, window_size=ws,
                                               return_softmax_lse=True, how_v3_bf16_cvt=cvt)
    tag = f"case={case} mode={mode}"
    assert torch.equal(vc.view(torch.int16), vr.view(torch.int16)), f"v_cache after the append: {tag}"
    assert ref.share_within_ulp(kc, kr) == 1.0, f"k_cache after the append beyond one ulp: {tag}"
    if args.get("rotary_cos") is None:
        assert torch.equal(kc.view(torch.int16), kr.view(torch.int16)), f"k_cache after the append: {tag}"
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    err, _ = ref.errors(out, o64)
    err_r, _ = ref.errors(r, o64)
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2 err(R) {err_r:.3g} + 1e-5: {tag}"
    assert bool(ref.lse_close(lse, lse64).all()), f"LSE: {tag}"
    return q, kc, vc, args, out, lse


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kvcache_against_reference(monkeypatch, case):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    run_case(CASES[case], seed=case, mode=("rtne", "rtna", "rtz")[case % 3])


@pytest.mark.parametrize("case", [0, 3])
def test_kvcache_on_the_baseline(monkeypatch, case):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    with dispatch.pinned(kernel="baseline"):
        run_case(CASES[case], seed=10 + case)


def test_kvcache_equals_the_packed_call(monkeypatch):
    """The attention is the packed form's, bit for bit: the same keys gathered into a varlen call."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, kc, vc, args, window = make(CASES[1], seed=3)
    for name in ("rotary_cos", "rotary_sin", "rotary_interleaved"):  # q as given
        args.pop(name)
    out, lse = rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, return_softmax_lse=True, how_v3_bf16_cvt=0)
    seqlens, idx, lp = (args[n].tolist() for n in ("cache_seqlens", "cache_batch_idx", "cache_leftpad"))
    new = args["k"].shape[1]
    keys = [(idx[b], lp[b], seqlens[b] + new) for b in range(q.shape[0])]
    k = torch.cat([kc[c, lo:hi] for c, lo, hi in keys])
    v = torch.cat([vc[c, lo:hi] for c, lo, hi in keys])
    cu_k = torch.tensor([0] + [hi - lo for _, lo, hi in keys], dtype=torch.int32).cumsum(0).to(torch.int32)
    sq = q.shape[1]
    cu_q = torch.arange(q.shape[0] + 1, dtype=torch.int32) * sq
    o2, l2 = rtcattn.forward_varlen(q.flatten(0, 1), k, v, cu_q, cu_k, sq, kc.shape[1], return_lse=True)
    assert torch.equal(out.flatten(0, 1).view(torch.int16), o2.view(torch.int16))
    assert torch.equal(lse.permute(1, 0, 2).flatten(1).view(torch.int32), l2.view(torch.int32))


def test_out_and_a_strided_cache(monkeypatch):
    """out= written in place (a strided one through a copy), and a cache sliced along S (batch stride > S_max rows)
    give the contiguous call's result bit for bit."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, kc, vc, args, window = make(CASES[0], seed=4)
    big_k, big_v = (torch.zeros(kc.shape[0], kc.shape[1] + 9, *kc.shape[2:], dtype=kc.dtype) for _ in range(2))
    big_k[:, :kc.shape[1]], big_v[:, :kc.shape[1]] = kc, vc
    want = rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, causal=True)
    out = torch.full_like(q, float("nan"))
    got = rtcattn.flash_attn_with_kvcache(q, big_k[:, :kc.shape[1]], big_v[:, :kc.shape[1]], **args, causal=True,
                                          out=out)
    assert got is out and torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(big_k[:, :kc.shape[1]].view(torch.int16), kc.view(torch.int16))
    no_append = dict(args, k=None, v=None, rotary_cos=None, rotary_sin=None)
    strided = torch.full((q.shape[0], q.shape[2], q.shape[1], q.shape[3]), float("nan"), dtype=q.dtype).transpose(1, 2)
    rtcattn.flash_attn_with_kvcache(q, big_k[:, :kc.shape[1]], big_v[:, :kc.shape[1]],
                                    **no_append, causal=True, out=strided)
    again = rtcattn.flash_attn_with_kvcache(q, kc, vc, **no_append, causal=True)
    assert torch.equal(strided.contiguous().view(torch.int16), again.view(torch.int16))


def test_bad_metadata_is_clamped_inside_the_tensors(monkeypatch):
    """cache_seqlens past the cache, an append that would overflow it, leftpad past the length, cache_batch_idx and
    block ids out of range: the call completes (the emulator's range check saw no access outside the tensors), and
    the clamped rows are inside the caches."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    q, kc, vc, args, _ = make(CASES[1], seed=5)
    args.update(rotary_cos=None, rotary_sin=None)  # k written as given
    before = kc.clone()
    args.update(cache_seqlens=i32([1 << 30, -5]), cache_leftpad=i32([1 << 30, 7]), cache_batch_idx=i32([-3, 99]))
    out, lse = rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, return_softmax_lse=True)
    new = args["k"].shape[1]
    assert torch.equal(kc[0, -new:], args["k"][0]) and torch.equal(kc[-1, :new], args["k"][1])  # clamped rows
    assert torch.equal(kc[1:-1], before[1:-1])
    assert bool((lse[0] == -math.inf).all()) and bool((out[0] == 0).all())  # leftpad clamped to the end: no key
    q, kc, vc, args, _ = make(CASES[3], seed=6)
    args["block_table"][0, :] = i32([-1, 1 << 20, 2, 3])
    args.update(cache_seqlens=i32([0, 1 << 30]))
    rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, causal=True)


@pytest.mark.parametrize("field,value,message", [
    ("cache_seqlens", [3, 96, 0], r"cache_seqlens\[1\]=96 with k.shape\[1\]=1 new rows .*accepted: 0..95"),
    ("cache_batch_idx", [0, 9, 1], r"cache_batch_idx\[1\]=9 .*accepted: 0..4"),
    ("cache_leftpad", [0, 0, 99], r"cache_leftpad\[2\]=99 .*accepted: 0..cache_seqlens\[2\]"),
])
def test_check_knob_refuses_device_values_before_writing(monkeypatch, field, value, message):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CHECK", "1")
    q, kc, vc, args, _ = make(CASES[0], seed=7)
    args[field] = i32(value)
    before = kc.clone()
    with pytest.raises(ValueError, match=message):
        rtcattn.flash_attn_with_kvcache(q, kc, vc, **args)
    assert torch.equal(kc, before)


def test_check_knob_refuses_block_ids(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_CHECK", "1")
    q, kc, vc, args, _ = make(CASES[3], seed=8)
    args["cache_seqlens"] = i32([20, 5])
    args["block_table"][0, 1] = kc.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[0, 1\]=11 .*accepted: a block id in \[0, 11\)"):
        rtcattn.flash_attn_with_kvcache(q, kc, vc, **args)


def test_aiter_registry_entry(monkeypatch):
    """rtcattn.aiter.register() adds aiter::rtcattn_kvcache_fwd (the caches declared written) and
    aiter.rtcattn_kvcache_fwd, which runs flash_attn_with_kvcache bit for bit, an int cache_seqlens included."""
    import sys
    import types
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setitem(sys.modules, "aiter", types.ModuleType("aiter"))
    module = rtcattn.aiter.register() and sys.modules["aiter"]
    schema = str(torch.ops.aiter.rtcattn_kvcache_fwd.default._schema)
    assert "Tensor(a!) k_cache, Tensor(b!) v_cache" in schema and "Tensor? cache_seqlens" in schema
    q, kc, vc, args, _ = make(CASES[0], seed=9)
    args["cache_seqlens"] = 17
    kc2, vc2 = kc.clone(), vc.clone()
    want, lse = rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, causal=True, return_softmax_lse=True,
                                                how_v3_bf16_cvt=2)
    got, lse2 = module.rtcattn_kvcache_fwd(q, kc2, vc2, **args, causal=True, return_softmax_lse=True,
                                           how_v3_bf16_cvt=2)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and torch.equal(lse, lse2)
    assert torch.equal(kc2.view(torch.int16), kc.view(torch.int16)) and torch.equal(vc2, vc)
    out = torch.zeros_like(q)
    assert module.rtcattn_kvcache_fwd(q, kc2, vc2, causal=True, how_v3_bf16_cvt=2, out=out,
                                      cache_seqlens=18) is out


def _decode_plan(q, kc, vc, seqlens, num_splits):
    """The gfx942 decode kernel's plan of a kvcache call (its packed form, as the entry builds it) and the kernel
    dispatch picks for it."""
    p = validate.check_kvcache_inputs(q, kc, vc, cache_seqlens=seqlens)
    packed = kvcache.plan(q, kc, vc, seqlens, None, None, p)
    pk = (packed.q, packed.k, packed.v, packed.cu_q, packed.cu_k, p.seq_q, packed.max_seqlen_k)
    vp = validate.check_varlen_inputs(*pk, seqused_k=packed.seqused_k)
    args = attention_fwd.args_block_varlen(*pk[:3], None, *pk[3:5], None, vp,
                                           dispatch.arch_fields("gfx942-emu", dispatch.emulated_cus("gfx942-emu")),
                                           packed.seqused_k, num_splits)
    kernel = attention_fwd.selection_varlen(*pk, seqused_k=packed.seqused_k, num_splits=num_splits).kernel.name
    return _lib.op_plan(attention_fwd.OP, "gfx942_decode", args), kernel


def test_num_splits_steers_the_decode_split(monkeypatch):
    """num_splits (flash-attn's: 0 heuristic, 1 no split, n at most n parts) reaches the gfx942 decode kernel's
    planner: 2 sequences x 2 K/V heads of a 700-key cache (22 steps), where the heuristic takes more than 3 parts,
    run with 1, 2 and 3 parts and the heuristic's. Each meets the numerics contract, repeats bit for bit, and gives
    the bits of the same call with its split forced to the plan's count; the counts give different output bits (the
    parts' partials are merged in another grouping), so a num_splits that steered nothing would fail."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    gen = torch.Generator().manual_seed(21)
    q, kc, vc = (torch.randn(shape, generator=gen).to(torch.bfloat16)
                 for shape in ((2, 1, 8, 128), (2, 700, 2, 128), (2, 700, 2, 128)))
    seqlens = i32([699, 650])
    k, v = (torch.randn((2, 1, 2, 128), generator=gen).to(torch.bfloat16) for _ in range(2))
    args = dict(k=k, v=v, cache_seqlens=seqlens, causal=True, return_softmax_lse=True, how_v3_bf16_cvt=0)
    (_, _), (o64, lse64) = ref.reference_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, window=(-1, 0))
    r = ref.reference_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, window=(-1, 0), round_mode="rtne")[1]
    err_r, _ = ref.errors(r, o64)
    heuristic = _decode_plan(q, kc, vc, seqlens, 0)[0]["splits"]
    assert heuristic > 3, heuristic
    out_bits = {}
    for n, want in ((0, heuristic), (1, 1), (2, 2), (3, 3)):
        plan, kernel = _decode_plan(q, kc, vc, seqlens, n)
        assert kernel == "gfx942_decode" and plan["splits"] == want, (n, kernel, plan)
        runs = [rtcattn.flash_attn_with_kvcache(q, kc, vc, **args, num_splits=n) for _ in range(2)]
        with dispatch.pinned(tail_split=want):
            runs.append(rtcattn.flash_attn_with_kvcache(q, kc, vc, **args))
        for out, lse in runs[1:]:
            assert torch.equal(out.view(torch.int16), runs[0][0].view(torch.int16)), n
            assert torch.equal(lse.view(torch.int32), runs[0][1].view(torch.int32)), n
        err, _ = ref.errors(runs[0][0], o64)
        assert err <= 2 * err_r + 1e-5, f"num_splits={n}: err {err:.3g} > 2 err(R) {err_r:.3g} + 1e-5"
        assert bool(ref.lse_close(runs[0][1], lse64).all()), f"num_splits={n}: LSE"
        out_bits[n] = runs[0][0].view(torch.int16)
    for a, b in ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)):
        assert not torch.equal(out_bits[a], out_bits[b]), f"num_splits {a} and {b} gave the same output bits"
