"""References for the sm_90a kernel checks: fp64 attention and the same-precision algorithm R of numerics.md."""
import torch

MODES = ("rtne", "rtna", "rtz")


def round_bf16(x, mode):
    """fp32 -> bf16 with the project's bit-exact rules (NaN -> 0x7FFF), returned as bf16."""
    u = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if mode == "rtne":
        u = u + 0x7FFF + ((u >> 16) & 1)
    elif mode == "rtna":
        u = u + 0x8000
    r = (u >> 16) & 0xFFFF
    r = torch.where(torch.isnan(x), torch.full_like(r, 0x7FFF), r)
    r = torch.where(r >= 0x8000, r - 0x10000, r)
    return r.to(torch.int16).view(torch.bfloat16)


def to_bhsd(t, layout):
    return t.transpose(1, 2) if layout == "bshd" else t


def ref64(q, k, v, layout, scale):
    """fp64 output [B,H,Sq,D] and LSE [B,H,Sq]."""
    q, k, v = (to_bhsd(t, layout).double() for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.softmax(s, dim=-1), v), lse


def ref_same_precision(q, k, v, layout, scale, mode):
    """R: fp32 scores, P rounded with the mode, fp32 P V, divided by the fp32 row sum, rounded."""
    q, k, v = (to_bhsd(t, layout).float() for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    l = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(round_bf16(p, mode).float(), v) / l
    return round_bf16(o, mode)


def errors(x, o64):
    """(max abs error over finite elements, normwise error)."""
    x = x.double()
    fin = torch.isfinite(o64)
    d = (x - o64)[fin]
    return d.abs().max().item(), (d.norm() / o64[fin].norm()).item()
