"""The backward's numerics checks (docs/numerics.md, the backward), shared by the emulator and GPU tests: each call's
gradients against the fp64 autograd reference within FlashAttention's rule (2x the plain-torch algorithm's error at
the kernel's precision, + 1e-5), dense and packed, windows, GQA, head dims, dtypes, modes; rows that see no key and
keys no row sees give zeros; the same bits run to run."""
import torch

import rtcattn
from rtcattn.ops.attention_bwd import reference as bref

BF16 = torch.bfloat16


def _randn(shape, gen, device, dtype):
    return torch.randn(shape, generator=gen).to(dtype).to(device)


def dense_inputs(layout, b, hq, hk, sq, sk, d, device, dtype=BF16, seed=0):
    """q, k, v and dout in `layout` ("bshd" [B, S, H, D] or "bhsd")."""
    gen = torch.Generator().manual_seed(seed)

    def shape(h, s):
        return (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    q, k, v = (_randn(shape(h, s), gen, device, dtype) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
    return q, k, v, _randn(shape(hq, sq), gen, device, dtype)


def dense_grads(q, k, v, dout, layout="bshd", mode="rtne", window=(-1, -1), scale=None, deterministic=False):
    """(out, lse, dq, dk, dv) of rtcattn.forward's backward for dout (autograd)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, window_size=window,
                               return_lse=True, deterministic=deterministic)
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def check_dense(device, layout, b, hq, hk, sq, sk, d, mode="rtne", window=(-1, -1), dtype=BF16, seed=0, what="",
                deterministic=False):
    q, k, v, dout = dense_inputs(layout, b, hq, hk, sq, sk, d, device, dtype, seed)
    out, lse, *grads = dense_grads(q, k, v, dout, layout, mode, window, deterministic=deterministic)
    cpu = [t.cpu() for t in (q, k, v, out, lse, dout)]
    g64 = bref.grads_fp64(*cpu[:3], cpu[5], layout, None, window)
    gr = bref.grads_r(*cpu, layout, mode, None, window)
    for name, x, xr, x64 in zip("qkv", grads, gr, g64):
        assert x.shape == x64.shape and x.dtype == dtype
        ok, err, err_r = bref.within_rule(x.cpu(), xr, x64)
        assert ok, f"{what} d{name}: max |d{name} - fp64| {err} > 2 x {err_r} + 1e-5 (R's)"
    return grads


def packed_inputs(lens_q, lens_k, hq, hk, d, device, dtype=BF16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = _randn((sum(lens_q), hq, d), gen, device, dtype)
    k, v = (_randn((sum(lens_k), hk, d), gen, device, dtype) for _ in range(2))
    dout = _randn((sum(lens_q), hq, d), gen, device, dtype)

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, dout, cu(lens_q), cu(lens_k)


def check_packed(device, lens_q, lens_k, hq, hk, d, mode="rtne", window=(-1, -1), dtype=BF16, seed=0,
                 deterministic=False):
    """flash_attn_varlen_func's backward, each sequence against its own dense references (rows of a sequence without
    rows or keys: zeros)."""
    q, k, v, dout, cu_q, cu_k = packed_inputs(lens_q, lens_k, hq, hk, d, device, dtype, seed)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = rtcattn.forward_varlen(qg, kg, vg, cu_q, cu_k, max(lens_q), max(lens_k), round_mode=mode,
                                      window_size=window, return_lse=True, deterministic=deterministic)
    out.backward(dout)
    grads = [t.grad.cpu() for t in (qg, kg, vg)]
    q, k, v, dout, out, lse = (t.detach().cpu() for t in (q, k, v, dout, out, lse))
    oq = ok = 0
    for lq, lk in zip(lens_q, lens_k):
        rq, rk = slice(oq, oq + lq), slice(ok, ok + lk)
        if lq and lk:
            one = [t[None] for t in (q[rq], k[rk], v[rk], out[rq])]
            g64 = bref.grads_fp64(*one[:3], dout[rq][None], "bshd", None, window)
            gr = bref.grads_r(*one, lse[:, rq][None], dout[rq][None], "bshd", mode, None, window)
            for name, x, xr, x64 in zip("qkv", (grads[0][rq], grads[1][rk], grads[2][rk]), gr, g64):
                ok_, err, err_r = bref.within_rule(x[None], xr, x64)
                assert ok_, f"sequence ({lq}, {lk}) d{name}: {err} > 2 x {err_r} + 1e-5"
        else:  # no rows: its keys get zeros; no keys: its rows get zeros
            assert not grads[0][rq].any() and not grads[1][rk].any() and not grads[2][rk].any()
        oq, ok = oq + lq, ok + lk
    return grads


def check_empty_rows_and_unseen_keys(device, dtype=BF16):
    """Rows that see no key (causal with Sq > Sk: rows i < Sq - Sk) get dq = 0 exactly; keys no row sees (window
    (1, 0), the diagonal and the key before it, with Sq < Sk: keys j < Sk - Sq - 1) get dk = dv = 0 exactly; the
    rest within the rule. (With one key a row, P = 1 and dS = dP - delta = 0: hence two keys.)"""
    dq = check_dense(device, "bshd", 1, 2, 1, 30, 12, 64, window=(-1, 0), dtype=dtype, seed=5, what="Sq > Sk causal")[0]
    assert not dq[:, :18].any() and dq[:, 18:].any()
    _, dk, dv = check_dense(device, "bshd", 1, 2, 1, 12, 30, 64, window=(1, 0), dtype=dtype, seed=6,
                            what="Sq < Sk, two keys a row")
    assert not dk[:, :17].any() and not dv[:, :17].any() and dk[:, 17:].all(-1).any() and dv[:, 17:].any()


def check_determinism(device, repeats=3, dtype=BF16, d=64, sk=90):
    """With deterministic=True, the same call's gradients bit for bit run to run (on the GPU with many key blocks a
    row, so that a kernel adding dQ up in any order would show it)."""
    q, k, v, dout = dense_inputs("bshd", 2, 4, 2, 70, sk, d, device, dtype, seed=7)
    first = dense_grads(q, k, v, dout, "bshd", "rtne", (-1, 0), deterministic=True)[2:]
    for _ in range(repeats - 1):
        again = dense_grads(q, k, v, dout, "bshd", "rtne", (-1, 0), deterministic=True)[2:]
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(first, again))


class _Block(torch.nn.Module):
    """One pre-norm causal attention block (q, k, v and output projections, GQA 4/2) and an MLP."""

    def __init__(self, dim, heads, heads_k, attend):
        super().__init__()
        self.heads, self.heads_k, self.d, self.attend = heads, heads_k, dim // heads, attend
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * heads_k) * self.d, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).split([self.heads * self.d, self.heads_k * self.d,
                                                self.heads_k * self.d], dim=-1)
        o = self.attend(q.view(b, s, self.heads, self.d), k.view(b, s, self.heads_k, self.d),
                        v.view(b, s, self.heads_k, self.d))
        x = x + self.proj(o.reshape(b, s, -1))
        return x + self.mlp(x)


def _rtcattn_attend(q, k, v):
    return rtcattn.flash_attn_func(q, k, v, causal=True, how_v3_bf16_cvt=0)


def _sdpa_attend(q, k, v):
    rep = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(rep, 2).transpose(1, 2) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True).transpose(1, 2)


def train_losses(attend, device, steps=20, dim=64, heads=4, heads_k=2, vocab=48, b=4, s=24, seed=0):
    """Losses of 20 steps of a two-block bf16 language model (next token of a fixed random sequence) with attend as
    its attention; the same initial weights and data for every attend."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), _Block(dim, heads, heads_k, attend),
                                _Block(dim, heads, heads_k, attend), torch.nn.LayerNorm(dim),
                                torch.nn.Linear(dim, vocab)).to(device=device, dtype=BF16)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (b, s + 1), generator=gen).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_training(device, steps=20):
    """The model's loss goes down the same with rtcattn's attention as with torch SDPA's: each step within 3% (bf16
    weights: the two attentions' roundings differ), and down by a third or more over the steps."""
    ours, sdpa = (train_losses(a, device, steps) for a in (_rtcattn_attend, _sdpa_attend))
    assert ours[-1] < 0.67 * ours[0], ours
    for i, (a, b) in enumerate(zip(ours, sdpa)):
        assert abs(a - b) <= 0.03 * b, f"step {i}: loss {a} with rtcattn, {b} with SDPA\n{ours}\n{sdpa}"
    return ours, sdpa
