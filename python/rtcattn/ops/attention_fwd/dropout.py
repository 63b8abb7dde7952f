"""Dropout's host side (docs/numerics.md, "Dropout"): the generator state a call draws, and the keep mask as a
function of it (the same Philox4x32-10 mapping as csrc_common/dropout.h, in numpy). FlashAttention's S_dmask, formed
from it in torch, is reference.s_dmask.

The kernels draw nothing: each call's Philox key and counter offset are one torch.randint on the call's device
(draw_rng_state), so the ops stay functions of their inputs, a seeded run repeats, and a captured CUDA graph
replays the draw with the generator's advancing state as torch's own random ops do. The backward takes the forward's
rng_state and regenerates the same mask."""
from __future__ import annotations

import math

import numpy as np
import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57       # Random123's Philox4x32 multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85       # and its key's Weyl increments
_U32 = np.uint64(0xFFFFFFFF)


def draw_rng_state(p: float, device: torch.device) -> torch.Tensor | None:
    """A call's Philox key and counter offset (int64 [2]) from torch's default generator of the device (the CPU's
    for the emulator); None without dropout."""
    if p == 0:
        return None
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=device)


def philox4x32_10(c0, c1, c2, c3, k0: int, k1: int) -> tuple:
    """Philox4x32-10 of the counters (numpy uint64 arrays holding 32-bit words, broadcast together) under key
    (k0, k1): the four output words."""
    c = [np.asarray(x, dtype=np.uint64) & _U32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0 & 0xFFFFFFFF), np.uint64(k1 & 0xFFFFFFFF)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & _U32, (k1 + np.uint64(W1)) & _U32
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _U32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _U32]
    return tuple(c)


def threshold(p: float) -> int:
    """The 16-bit threshold of p as the kernels get it: round(p * 65536) of p as a float32 (the argument block's)."""
    return math.floor(float(np.float32(p)) * 65536.0 + 0.5)


def drop_scale(p: float) -> float:
    """1 / (1 - p) as the kernels apply it (float32 of the double quotient)."""
    return float(np.float32(1.0 / (1.0 - float(np.float32(p)))))


def keep_mask(rng_state: torch.Tensor, p: float, b: int, heads: int, sq: int, sk: int) -> torch.Tensor:
    """bool [heads, sq, sk]: which elements (row i, key j of sequence or batch row b, each query head) the kernels
    keep (csrc_common/dropout.h's mapping)."""
    seed, offset = (int(x) & 0xFFFFFFFFFFFFFFFF for x in rng_state.cpu().tolist())
    h = np.arange(heads, dtype=np.uint64)[:, None, None]
    i = np.arange(sq, dtype=np.uint64)[None, :, None]
    j = np.arange(sk, dtype=np.uint64)[None, None, :]
    u = lambda x: np.uint64(x)  # noqa: E731
    # one Philox call per 2 rows x 4 keys: rows {i, i + 8} (i % 16 < 8), keys {j, j + 1, j + 8, j + 9} (j % 16 even < 8)
    ctr = (u(offset) + u(4) * (j >> u(4)) + ((j & u(7)) >> u(1))) & u(0xFFFFFFFFFFFFFFFF)
    row = u(8) * (i >> u(4)) + (i & u(7))
    words = philox4x32_10(ctr & _U32, ctr >> u(32), row, (u(b * heads) + h) & _U32, seed & 0xFFFFFFFF, seed >> 32)
    pick = u(2) * ((j >> u(3)) & u(1)) + ((i >> u(3)) & u(1))  # the output word; the half: j's parity
    w = np.where(pick == 0, words[0], np.where(pick == 1, words[1], np.where(pick == 2, words[2], words[3])))
    half = np.where((j & u(1)) == 1, w >> u(16), w & u(0xFFFF))
    keep = np.broadcast_to(half >= np.uint64(threshold(p)), (heads, sq, sk))
    return torch.from_numpy(np.array(keep))  # a writable copy of the broadcast view


def dense_keep_mask(rng_state: torch.Tensor, p: float, batch: int, heads: int, sq: int, sk: int) -> torch.Tensor:
    """bool [B, H, Sq, Sk] of a dense call."""
    return torch.stack([keep_mask(rng_state, p, b, heads, sq, sk) for b in range(batch)])


def attn_probs(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """FlashAttention's S_dmask from the softmax probabilities [.., Sq, Sk] (fp32) and the keep mask: each
    probability, negated where its element is dropped (the sign is the mask; abs() gives the probabilities)."""
    return torch.where(keep.to(probs.device), probs, -probs)

