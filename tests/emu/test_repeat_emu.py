"""A repeat of a dense call (attention_fwd's stub keeps the selection and argument block of a call's first run under
its signature, and a repeat only patches the addresses): on the emulated gfx942, a repeat with new data gives the bits
a first run gives; every part of the signature (strides, dtype, alignment, scalars, knobs, pins) makes a new entry,
and each such call is right; out=, dropout and padded head dims never take the shortcut."""
import pytest
import torch

import rtcattn
from rtcattn.ops.attention_fwd import stub
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu


@pytest.fixture(autouse=True)
def emulate(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    stub._REPEATS.kept.clear()


def qkv(seed, shape_q=(2, 1, 4, 64), shape_k=(2, 40, 2, 64), dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape_q, generator=g).to(dtype), torch.randn(shape_k, generator=g).to(dtype),
            torch.randn(shape_k, generator=g).to(dtype))


def fresh(*args, **kw):
    """The call with nothing kept: the whole path (the entries kept before are back after it)."""
    kept = dict(stub._REPEATS.kept)
    stub._REPEATS.kept.clear()
    try:
        return rtcattn.forward(*args, **kw)
    finally:
        stub._REPEATS.kept.clear()
        stub._REPEATS.kept.update(kept)


def kernels_run(monkeypatch):
    ran = []
    real = dispatch.launch
    monkeypatch.setattr(dispatch, "launch", lambda op, dev, sel, args, *rest: ran.append(sel.kernel.name) or
                        real(op, dev, sel, args, *rest))
    return ran


@pytest.mark.parametrize("sq", [1, 33], ids=["decode", "prefill"])
def test_repeat_gives_the_first_runs_bits(sq):
    first = qkv(1, (2, sq, 4, 64))
    rtcattn.forward(*first, causal=True, return_lse=True)
    assert len(stub._REPEATS.kept) == 1
    for seed in (2, 3):
        data = qkv(seed, (2, sq, 4, 64))
        out, lse = rtcattn.forward(*data, causal=True, return_lse=True)
        assert len(stub._REPEATS.kept) == 1          # a hit: nothing new kept
        want, want_lse = fresh(*data, causal=True, return_lse=True)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)) and torch.equal(lse, want_lse)


def test_each_part_of_the_signature_is_a_new_entry(monkeypatch):
    q, k, v = qkv(4)
    base = dict(causal=True)
    rtcattn.forward(q, k, v, **base)
    storage = torch.zeros(q.numel() + 4, dtype=q.dtype)
    shifted = storage[4:].view(q.shape)                  # 8 bytes off: no longer 16-byte aligned
    shifted.copy_(q)
    wide = torch.zeros(2, 1, 4, 128, dtype=q.dtype)[..., :64]   # q's values, rows 256 bytes apart
    wide.copy_(q)
    variants = [
        ((q, k, v), dict(causal=False)),                                                  # window
        ((q, k, v), dict(causal=True, softmax_scale=0.2)),                                # scale
        ((q, k, v), dict(causal=True, round_mode="rtz")),                                 # round mode
        ((q, k, v), dict(causal=True, return_lse=True)),                                  # lse
        ((q, k, v), dict(causal=True, softcap=5.0)),                                      # soft cap
        ((wide, k, v), base),                                                             # strides
        ((shifted, k, v), base),                                                          # alignment
        ((q.half(), k.half(), v.half()), base),                                           # dtype
        ((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), dict(causal=True, layout="bhsd")),  # layout
    ]
    for n, (tensors, kw) in enumerate(variants, 2):
        got = rtcattn.forward(*tensors, **kw)
        assert len(stub._REPEATS.kept) == n, (n, kw)
        want = fresh(*tensors, **kw)
        got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
        assert torch.equal(got.float(), want.float()), (n, kw)
        rtcattn.forward(*tensors, **kw)                  # and the variant itself repeats from its entry
    ran = kernels_run(monkeypatch)
    monkeypatch.setenv("RTCATTN_KERNEL", "baseline")     # the knobs' environment
    rtcattn.forward(q, k, v, **base)
    monkeypatch.delenv("RTCATTN_KERNEL")
    with dispatch.pinned(kernel="baseline"):             # the pins
        rtcattn.forward(q, k, v, **base)
    rtcattn.forward(q, k, v, **base)
    assert ran == ["baseline", "baseline", "gfx942_decode"], ran


def test_out_dropout_and_padded_head_dims_take_the_whole_path():
    q, k, v = qkv(5)
    out = torch.empty_like(q)
    rtcattn.forward(q, k, v, out=out)
    rtcattn.forward(q, k, v, dropout_p=0.1)
    rtcattn.forward(*qkv(6, (2, 1, 4, 60), (2, 40, 2, 60)))
    assert len(stub._REPEATS.kept) == 1   # the padded call's inner call (head dim 64) only
    rtcattn.forward(q, k, v)
    assert len(stub._REPEATS.kept) == 2


@pytest.mark.parametrize("paged", [False, True], ids=["varlen", "paged"])
def test_packed_repeat_reads_the_new_offsets_and_table(paged):
    """The offsets, the block table and the data change between calls of one signature (the device holds them; the
    signature does not): each repeat gives the bits of a first run over the same values."""
    g = torch.Generator().manual_seed(9)
    bf = torch.bfloat16
    q = torch.randn(3, 4, 64, generator=g).to(bf)                     # 3 sequences, one decode row each
    cu_q = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    if paged:
        pool = torch.randn(2, 12, 16, 2, 64, generator=g).to(bf)      # k / v pools of 12 pages of 16 rows
        k, v = pool[0], pool[1]
    else:
        k, v = (torch.randn(90, 2, 64, generator=g).to(bf) for _ in range(2))
    for lengths, seed in (((30, 20, 40), 1), ((5, 45, 40), 2), ((16, 16, 58), 3)):
        cu_k = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        table = torch.randperm(12, generator=torch.Generator().manual_seed(seed)).int().view(3, 4)
        kw = dict(causal=True, block_table=table if paged else None, return_lse=True)
        out, lse = rtcattn.forward_varlen(q, k, v, cu_q, cu_k, 1, 64, **kw)
        want, want_lse = fresh_varlen(q, k, v, cu_q, cu_k, 1, 64, **kw)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)) and torch.equal(lse, want_lse)
    assert len(stub._REPEATS.kept) == 1


def fresh_varlen(*args, **kw):
    kept = dict(stub._REPEATS.kept)
    stub._REPEATS.kept.clear()
    try:
        return rtcattn.forward_varlen(*args, **kw)
    finally:
        stub._REPEATS.kept.clear()
        stub._REPEATS.kept.update(kept)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_backward_repeat_gives_the_first_runs_gradients(packed):
    """The backward op's repeats (attention_bwd's stub): new data through a kept signature gives the gradients a
    first run gives, bit for bit."""
    from rtcattn.ops.attention_bwd import stub as bwd_stub

    def grads(seed):
        q, k, v = (t.requires_grad_() for t in qkv(seed, (2, 9, 4, 64), (2, 20, 2, 64)))
        if packed:
            cu_q, cu_k = (torch.tensor([0, n, 2 * n], dtype=torch.int32) for n in (9, 20))
            out = rtcattn.forward_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 9, 20,
                                         causal=True)
        else:
            out = rtcattn.forward(q, k, v, causal=True)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype))
        return [t.grad for t in (q, k, v)]

    def fresh(seed):
        kept = dict(bwd_stub._REPEATS.kept)
        bwd_stub._REPEATS.kept.clear()
        try:
            return grads(seed)
        finally:
            bwd_stub._REPEATS.kept.clear()
            bwd_stub._REPEATS.kept.update(kept)

    bwd_stub._REPEATS.kept.clear()
    grads(1)
    assert len(bwd_stub._REPEATS.kept) == 1
    for seed in (2, 3):
        got = grads(seed)
        assert len(bwd_stub._REPEATS.kept) == 1
        for a, b in zip(got, fresh(seed)):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
