"""A CPU model of how the sm_90a decode kernel feeds mma.sync m16n8k16 from its shared-memory tiles, for a cache in
q's dtype, an FP8 E4M3 cache and an FP4 E2M1 cache with its E8M0 scales (op_sources/attention_fwd/sm90_decode/kv_frag.h,
mainloop.h): TMA's 128-byte swizzle, ldmatrix
(.x4, .trans, b16), PRMT, the MMA's A / B / C fragment ownership per lane (PTX ISA, "Matrix Fragments for mma.m16n8k16
with floating point type"; "Warp-level matrix load instruction: ldmatrix"), and the kernel's index arithmetic on top.
It shows that the permuted fragments give exactly Q K^T and P V (FP4: each key's scale on its scores and on its p),
and that the FP8 bytes and FP4 nibbles expand to their exact values (NaN codes to NaN) in both dtypes.

The hardware models (tma_swizzle, ldmatrix, prmt, mma_16816) follow the ISA's definitions. The kernel's arithmetic
(class Kernel) mirrors kv_frag.h / mainloop.h / loads.h function by function, each method naming the function it
mirrors; test_the_model_reads_the_kernels_constants checks the constants against the header's text."""
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
KV_FRAG = ROOT / "op_sources/attention_fwd/sm90_decode/kv_frag.h"
KV_ELEMS = ROOT / "op_sources/attention_fwd/sm90_kv_elems.h"  # the expansions kv_frag.h takes
M32 = 0xFFFFFFFF

# ---------------------------------------------------------------- element formats (16-bit, and E4M3 bytes)


def elem_value(bits: int, dtype: str) -> float:
    """A bf16 / fp16 element's value (16 bits)."""
    t = torch.tensor([bits & 0xFFFF], dtype=torch.int32).to(torch.int16)
    return float(t.view(torch.bfloat16 if dtype == "bf16" else torch.float16).double())


def elem_bits(x: float, dtype: str) -> int:
    """The 16 bits of x, which must be exact in the dtype."""
    t = torch.tensor([x], dtype=torch.float64).to(torch.bfloat16 if dtype == "bf16" else torch.float16)
    assert np.isnan(x) or float(t.double()) == x, (x, dtype)
    return int(t.view(torch.int16).item()) & 0xFFFF


def e4m3_value(code: int) -> float:
    """An OCP E4M3 byte's value, by torch's float8_e4m3fn (the format's definition, not the kernel's arithmetic)."""
    return float(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).double())


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX E2M1 magnitudes by code & 7; bit 3 is the sign


def e2m1_value(code: int) -> float:
    return -E2M1[code & 7] if code & 8 else E2M1[code & 7]


# ---------------------------------------------------------------- hardware models


def tma_swizzle(offset: int) -> int:
    """Where TMA's 128-byte swizzle puts byte `offset` of a tile (1024-byte aligned): address bits 4-6 XOR bits 7-9."""
    return offset ^ (((offset >> 7) & 7) << 4)


def ldmatrix(smem: np.ndarray, addrs, trans: bool, num: int = 4) -> list:
    """ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 (num matrices): lanes 8i .. 8i + 7 give the 16-byte rows
    of matrix i (the other lanes' addresses are not read). Without .trans, lane l's register i holds row l / 4,
    elements 2 (l % 4), 2 (l % 4) + 1 (low half first); with .trans, element l / 4 of rows 2 (l % 4) (low half) and
    2 (l % 4) + 1 (high half)."""
    assert num in (1, 2, 4)
    regs = [[0] * num for _ in range(32)]
    for i in range(num):
        rows = []
        for r in range(8):
            a = addrs[8 * i + r]
            assert a % 16 == 0, a
            rows.append(smem[a:a + 16])
        for lane in range(32):
            g, t = lane // 4, lane % 4
            if trans:
                lo, hi = rows[2 * t][2 * g:2 * g + 2], rows[2 * t + 1][2 * g:2 * g + 2]
                b = bytes(lo) + bytes(hi)
            else:
                b = bytes(rows[g][4 * t:4 * t + 4])
            regs[lane][i] = int.from_bytes(b, "little")
    return regs


def prmt(a: int, b: int, sel: int) -> int:
    """prmt.b32 (default mode): result byte n is byte (sel >> 4n) & 7 of {b, a} (a: bytes 0-3), or with bit 3 of that
    nibble set, the selected byte's bit 7 replicated."""
    src = (a & M32).to_bytes(4, "little") + (b & M32).to_bytes(4, "little")
    out = 0
    for n in range(4):
        nib = (sel >> (4 * n)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * n)
    return out


def mma_16816(acc, a_regs, b_regs, dtype: str):
    """mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: the fragments of every lane as the ISA assigns them (g = lane
    >> 2, t = lane % 4): A element i (register i / 2, half i % 2) at row g + 8 ((i / 2) % 2), column 2t + (i & 1) +
    8 (i >= 4); B element i at row (k) 2t + (i & 1) + 8 (i >= 2), column g; C element i at row g + 8 (i >= 2),
    column 2t + (i & 1). The product in float64 (exact for the test's values)."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(8):
            a = elem_value(a_regs[lane][i // 2] >> (16 * (i % 2)), dtype)
            A[g + 8 * ((i // 2) % 2), 2 * t + (i & 1) + 8 * (i >= 4)] = a
        for i in range(4):
            B[2 * t + (i & 1) + 8 * (i >= 2), g] = elem_value(b_regs[lane][i // 2] >> (16 * (i % 2)), dtype)
    D = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            acc[lane][i] += D[g + 8 * (i >= 2), 2 * t + (i & 1)]


# ---------------------------------------------------------------- the kernel's arithmetic, mirrored


class Kernel:
    """One variant's index arithmetic (bucket, column split, dtype, FP8 or not), as the kernel's functions do it."""

    def __init__(self, bucket: int, col_split: int, dtype: str, kv: str, keys: int = 16):
        self.bucket, self.col_split, self.dtype, self.keys = bucket, col_split, dtype, keys
        self.fp8, self.fp4 = kv == "fp8", kv == "fp4"
        bits = {"same": 16, "fp8": 8, "fp4": 4}[kv]  # params.h Sm90DecodePlan::kv_bits
        self.col_blocks = -(-bucket * bits // 8 // 128)  # params.h sm90_decode_col_blocks
        self.block_bytes = keys * 128  # params.h sm90_decode_block_bytes
        self.row_bytes = 2 * bucket + 16  # params.h sm90_decode_row_bytes
        self.k_steps = bucket // 16  # kv_frag.h kKSteps
        self.warp_cols = bucket // col_split  # kWarpCols
        self.k_group = 16 // bits  # kKGroup
        self.v_tiles = 2 * self.k_group  # kVTiles
        self.k_loads = -(-self.k_steps // self.k_group)  # kKLoads
        self.v_loads = -(-self.warp_cols // (8 * self.v_tiles))  # kVLoads

    # loads.h kv_piece
    def kv_piece(self, tile: int, col_block: int, key: int, c: int) -> int:
        return tile + col_block * self.block_bytes + key * 128 + ((c ^ (key & 7)) << 4)

    # kv_frag.h sel_sext, sel_mask
    @staticmethod
    def sel_sext(i, j):
        return i | (i | 8) << 4 | j << 8 | (j | 8) << 12

    @staticmethod
    def sel_mask(i, j):
        return (i | 8) | (i | 8) << 4 | (j | 8) << 8 | (j | 8) << 12

    # kv_frag.h fp8_pair: fp16 through cvt.rn.f16x2.e4m3x2 (modelled by the format's values, the low byte in the low
    # half); bf16 by the bits (x << 4) & 0x87F087F0 of the sign-extended bytes, times 2^120 by fma.rn.bf16x2 (+ -0).
    def fp8_pair(self, w: int, i: int, j: int) -> int:
        if self.dtype == "fp16":
            lo, hi = (w >> (8 * i)) & 0xFF, (w >> (8 * j)) & 0xFF
            return elem_bits(e4m3_value(lo), "fp16") | elem_bits(e4m3_value(hi), "fp16") << 16
        x = prmt(w, 0, self.sel_sext(i, j))
        h = (x << 4) & 0x87F087F0
        out = 0
        for half in range(2):
            v = elem_value(h >> (16 * half), "bf16") * 2.0 ** 120 + (-0.0)  # exact: elem_bits asserts it
            out |= elem_bits(v, "bf16") << (16 * half)
        return out

    # kv_frag.h fp8x4_elems
    def fp8x4_elems(self, w: int, i0, j0, i1, j1):
        p0, p1 = self.fp8_pair(w, i0, j0), self.fp8_pair(w, i1, j1)
        if self.dtype == "bf16":
            nan = ((w & 0x7F7F7F7F) + 0x01010101) & M32
            p0 |= prmt(nan, 0, self.sel_mask(i0, j0)) & 0x7FFF7FFF
            p1 |= prmt(nan, 0, self.sel_mask(i1, j1)) & 0x7FFF7FFF
        return p0, p1

    # kv_frag.h fp4_pair: bytes A, B of {o, e} sign-extended by PRMT; bf16 (x << 2) & 0x81C081C0 times 2^126, fp16
    # (x << 5) & 0x8E008E00 times 2^14, by one FMA (+ -0).
    def fp4_pair(self, e: int, o: int, a: int, b: int) -> int:
        x = prmt(e, o, self.sel_sext(a, b))
        h, scale = ((x << 5) & 0x8E008E00, 2.0 ** 14) if self.dtype == "fp16" else ((x << 2) & 0x81C081C0, 2.0 ** 126)
        out = 0
        for half in range(2):
            v = elem_value(h >> (16 * half), self.dtype) * scale + (-0.0)
            out |= elem_bits(v, self.dtype) << (16 * half)
        return out

    # kv_frag.h fp4x8_elems
    def fp4x8_elems(self, w: int, pairs) -> list:
        e, o = (w << 4) & 0xF0F0F0F0, w & 0xF0F0F0F0
        return [self.fp4_pair(e, o, a, b) for a, b in pairs]

    # kv_frag.h q_col
    def q_col(self, ks: int, t: int) -> int:
        return 32 * (ks // 2) + 8 * t + 4 * (ks % 2) if self.fp4 else 16 * ks + 4 * t

    # kv_frag.h q_frag (row tile 0)
    def q_frag(self, smem, q, ks: int) -> list:
        if self.fp8 or self.fp4:
            a = []
            for lane in range(32):
                at = q + (lane // 4) * self.row_bytes + 2 * self.q_col(ks, lane % 4)
                w = [int.from_bytes(bytes(smem[x:x + 4]), "little") for x in (at, at + 4, at + 8 * self.row_bytes,
                                                                             at + 8 * self.row_bytes + 4)]
                a.append([w[0], w[2], w[1], w[3]])  # ld_shared_v2_u32(a[0], a[2]), then (a[1], a[3]) 8 rows down
            return a
        addrs = [q + ((lane & 7) + ((lane >> 3) & 1) * 8) * self.row_bytes + 2 * (16 * ks + (lane >> 4) * 8)
                 for lane in range(32)]
        return ldmatrix(smem, addrs, False)

    # kv_frag.h k_frags: b[lane][h][j] = (b0, b1)
    def k_frags(self, smem, tile: int, block: int, kq: int) -> list:
        addrs = []
        for lane in range(32):
            key = 16 * block + (lane & 7) + ((lane >> 4) << 3)  # mainloop.h scores: key[nb]
            piece = 2 * kq + ((lane >> 3) & 1)
            addrs.append(self.kv_piece(tile, piece // 8, key, piece % 8))
        r = ldmatrix(smem, addrs, False)
        out = []
        for lane in range(32):
            b = [[None, None] for _ in range(self.k_group)]
            for j in range(2):
                if self.fp4:
                    for h in range(2):
                        x = self.fp4x8_elems(r[lane][2 * j + h], ((0, 4), (1, 5), (2, 6), (3, 7)))
                        for e in range(2):
                            b[2 * h + e][j] = (x[2 * e], x[2 * e + 1])
                elif self.fp8:
                    for h in range(self.k_group):
                        b[h][j] = self.fp8x4_elems(r[lane][2 * j + h], 0, 1, 2, 3)
                else:
                    b[0][j] = (r[lane][2 * j], r[lane][2 * j + 1])
            out.append(b)
        return out

    # kv_frag.h v_frags: b[lane][j] = (b0, b1)
    def v_frags(self, smem, tile: int, block: int, piece0: int) -> list:
        addrs = []
        for lane in range(32):
            key = 16 * block + (lane & 7) + ((lane >> 3) & 1) * 8  # mainloop.h accumulate: key[nb]
            piece = piece0 + (lane >> 4)
            addrs.append(self.kv_piece(tile, piece // 8, key, piece % 8))
        r = ldmatrix(smem, addrs, True)
        out = []
        for lane in range(32):
            b = [[None, None] for _ in range(self.v_tiles)]
            for m in range(4):
                if self.fp4:
                    x = self.fp4x8_elems(r[lane][m], ((0, 2), (4, 6), (1, 3), (5, 7)))
                    for qq in range(4):
                        b[4 * (m // 2) + qq][m % 2] = x[qq]
                elif self.fp8:
                    e, o = self.fp8x4_elems(r[lane][m], 0, 2, 1, 3)
                    b[2 * (m // 2)][m % 2], b[2 * (m // 2) + 1][m % 2] = e, o
                else:
                    b[m // 2][m % 2] = r[lane][m]
            out.append(b)
        return out

    # kv_frag.h o_col
    def o_col(self, j: int, c: int, lane: int) -> int:
        if self.fp4:
            return 32 * (j // 4) + 8 * (lane % 4) + 4 * c + (j % 4)
        if self.fp8:
            return 16 * (j // 2) + 4 * (lane % 4) + 2 * c + (j % 2)
        return 8 * j + 2 * (lane % 4) + c

    # mainloop.h row_scales (NB = 1): the scales of thread lane's keys, index 2 j + c: key 16 block + 8 j + 2t + c,
    # from the slot's scale bytes (scales[key]: a 16-bit load at the pair's first key)
    def row_scales(self, scales, block, lane) -> list:
        out = [0.0] * 4
        for j in range(2):
            key = 16 * block + 8 * j + 2 * (lane % 4)
            for c in range(2):
                out[2 * j + c] = 2.0 ** (int(scales[key + c]) - 127)
        return out

    # mainloop.h scores (one block, NB = 1): s[lane][4 j + 2 i + c]; then step's FP4 K scale on each score
    def scores(self, smem, q, ktile, block, kscales=None) -> list:
        s = [[0.0] * 8 for _ in range(32)]
        for kq in range(self.k_loads):
            b = self.k_frags(smem, ktile, block, kq)
            for h in range(self.k_group):
                if self.k_group * kq + h >= self.k_steps:
                    break
                a = self.q_frag(smem, q, self.k_group * kq + h)
                for j in range(2):
                    acc = [[0.0] * 4 for _ in range(32)]
                    mma_16816(acc, a, [b[lane][h][j] for lane in range(32)], self.dtype)
                    for lane in range(32):
                        for x in range(4):
                            s[lane][4 * j + x] += acc[lane][x]
        if self.fp4:
            for lane in range(32):
                ks = self.row_scales(kscales, block, lane)
                for x in range(8):
                    s[lane][x] *= ks[4 * (x // 8) + 2 * ((x // 4) % 2) + x % 2]
        return s

    # mainloop.h accumulate's P A fragment (NB = 1): a[x] = p[2x], p[2x + 1], FP4 each times its key's V scale
    def p_frag(self, p, vscales, block, lane) -> list:
        vs = self.row_scales(vscales, block, lane) if self.fp4 else None
        out = []
        for x in range(4):
            p0, p1 = p[2 * x], p[2 * x + 1]
            if self.fp4:
                p0, p1 = p0 * vs[2 * (x // 2)], p1 * vs[2 * (x // 2) + 1]
            out.append(elem_bits(p0, self.dtype) | elem_bits(p1, self.dtype) << 16)
        return out

    # mainloop.h accumulate (one block, NB = 1, share ch): o[lane][4 n + 2 i + c]; a: P's A fragment per lane
    def accumulate(self, smem, a, vtile, block, ch) -> list:
        o = [[0.0] * (self.warp_cols // 2) for _ in range(32)]
        for dp in range(self.v_loads):
            piece = 2 * (ch * self.v_loads + dp)
            b = self.v_frags(smem, vtile, block, piece)
            for j in range(self.v_tiles):
                if self.v_tiles * dp + j >= self.warp_cols // 8:
                    break
                acc = [[0.0] * 4 for _ in range(32)]
                mma_16816(acc, a, [b[lane][j] for lane in range(32)], self.dtype)
                for lane in range(32):
                    for x in range(4):
                        o[lane][4 * (self.v_tiles * dp + j) + x] += acc[lane][x]
        return o


# ---------------------------------------------------------------- tiles as TMA and load_q write them


def write_kv_tile(smem, tile: int, kern: Kernel, rows: np.ndarray):
    """rows [keys][bytes of a row]: column block cb holds bytes [128 cb, 128 cb + 128) of each row, swizzled."""
    for key in range(rows.shape[0]):
        for x in range(rows.shape[1]):
            cb, off = divmod(x, 128)
            smem[tile + cb * kern.block_bytes + tma_swizzle(key * 128 + off)] = rows[key, x]


def write_q(smem, q: int, kern: Kernel, vals: np.ndarray):
    """Q [16][bucket] as load_q writes it: row r at r * row_bytes, 2 bytes an element, unswizzled."""
    for r in range(16):
        for c in range(kern.bucket):
            bits = elem_bits(float(vals[r, c]), kern.dtype)
            smem[q + r * kern.row_bytes + 2 * c:q + r * kern.row_bytes + 2 * c + 2] = list(bits.to_bytes(2, "little"))


def cache_rows(rng, kern: Kernel, keys: int):
    """Random K / V rows in the cache's storage (FP8 codes, finite; FP4 codes two a byte, element 2i in the low
    nibble; or bf16 / fp16 elements) and their values (FP4: unscaled)."""
    if kern.fp8:
        codes = rng.integers(0, 256, size=(keys, kern.bucket))
        codes[(codes & 0x7F) == 0x7F] = 0x3C  # finite values here; NaN codes are test_fp8_expansion's
        vals = np.vectorize(e4m3_value)(codes)
        return codes.astype(np.uint8), vals
    if kern.fp4:
        codes = rng.integers(0, 16, size=(keys, kern.bucket))
        raw = (codes[:, 0::2] | codes[:, 1::2] << 4).astype(np.uint8)
        return raw, np.vectorize(e2m1_value)(codes)
    vals = rng.integers(-16, 17, size=(keys, kern.bucket)) / 8.0
    raw = np.array([[b for c in row for b in elem_bits(float(c), kern.dtype).to_bytes(2, "little")] for row in vals],
                   dtype=np.uint8)
    return raw, vals


# (bucket, column split): every column-block count and both splits; FP8 at 256 takes its k-steps from two column
# blocks; FP4 at 32 and 96 has loads half past the row (skipped k-steps and n-tiles).
VARIANTS = [(32, 1), (64, 1), (128, 1), (256, 2), (96, 1)]


@pytest.mark.parametrize("kv", ["fp8", "fp4", "same"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("bucket,col_split", VARIANTS)
def test_fragments_give_q_kt_and_p_v(bucket, col_split, dtype, kv):
    rng = np.random.default_rng(bucket + 7 * col_split + 3 * len(kv) + (dtype == "fp16"))
    kern = Kernel(bucket, col_split, dtype, kv, keys=32)
    ktile, vtile = 0, kern.col_blocks * kern.block_bytes
    q = 2 * vtile
    smem = np.zeros(q + 16 * kern.row_bytes, dtype=np.uint8)
    kraw, kvals = cache_rows(rng, kern, 32)
    vraw, vvals = cache_rows(rng, kern, 32)
    write_kv_tile(smem, ktile, kern, kraw)
    write_kv_tile(smem, vtile, kern, vraw)
    qvals = rng.integers(-8, 9, size=(16, bucket)) / 4.0
    write_q(smem, q, kern, qvals)
    # FP4: E8M0 scales per key (2^-6 .. 2^6), applied to the dequantized rows for the expected results
    kscales, vscales = (rng.integers(121, 134, size=32).astype(np.uint8) for _ in range(2))
    if kern.fp4:
        kvals, vvals = kvals * 2.0 ** (kscales[:, None] - 127.0), vvals * 2.0 ** (vscales[:, None] - 127.0)
    for block in (0, 1):
        # S: thread (g, t)'s s[4 j + 2 i + c] is row g + 8 i, key 16 block + 8 j + 2 t + c (mask.h's layout).
        s = kern.scores(smem, q, ktile, block, kscales)
        want = qvals @ kvals[16 * block:16 * block + 16].T
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for j in range(2):
                for i in range(2):
                    for c in range(2):
                        assert s[lane][4 * j + 2 * i + c] == want[g + 8 * i, 8 * j + 2 * t + c], (block, lane, j, i, c)
        # P V: P's A fragment from the score registers (a[x] = s[2x], s[2x + 1]), as accumulate packs it.
        pvals = rng.integers(0, 9, size=(16, 16)) / 8.0
        a = []
        for lane in range(32):
            g, t = lane // 4, lane % 4
            sv = [pvals[g + 8 * ((x // 2) % 2), 8 * (x // 4) + 2 * t + (x % 2)] for x in range(8)]
            a.append(kern.p_frag(sv, vscales, block, lane))
        want = pvals @ vvals[16 * block:16 * block + 16]
        for ch in range(col_split):
            o = kern.accumulate(smem, a, vtile, block, ch)
            seen = set()
            for lane in range(32):
                g = lane // 4
                for n in range(kern.warp_cols // 8):
                    for i in range(2):
                        for c in range(2):
                            col = ch * kern.warp_cols + kern.o_col(n, c, lane)
                            seen.add((g + 8 * i, col))
                            assert o[lane][4 * n + 2 * i + c] == want[g + 8 * i, col], (block, ch, lane, n, i, c)
            assert len(seen) == 16 * kern.warp_cols  # o_col covers each of the share's columns once per row


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp4_expansion_is_exact_for_every_code_in_every_nibble(dtype):
    """Every E2M1 code in each nibble of a word, beside random neighbours, gives its exact value (-0 keeps its sign)
    in both groupings the kernel uses (K: byte i's nibbles; V: byte 0 with 2, 1 with 3); the FMA never rounds."""
    kern = Kernel(128, 1, dtype, "fp4")
    rng = np.random.default_rng(2)
    groupings = (((0, 4), (1, 5), (2, 6), (3, 7)), ((0, 2), (4, 6), (1, 3), (5, 7)))
    for code in range(16):
        for pos in range(8):
            w = int(rng.integers(0, 1 << 32)) & ~(0xF << (4 * pos)) | code << (4 * pos)
            for pairs in groupings:
                words = kern.fp4x8_elems(w, pairs)
                for word, (a, b) in zip(words, pairs):
                    for half, sel in enumerate((a, b)):
                        byte, nib = sel % 4, sel // 4  # {o, e}: e bytes 0-3 (low nibbles), o bytes 4-7 (high)
                        c = (w >> (8 * byte + 4 * nib)) & 0xF
                        got = elem_value(word >> (16 * half), dtype)
                        assert got == e2m1_value(c) and np.signbit(got) == bool(c & 8), (hex(w), sel, got)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp8_expansion_is_exact_for_every_code_in_every_byte(dtype):
    """Every E4M3 code in each byte of a word, beside random neighbours, gives its exact value in both pairings the
    kernel uses (K: bytes (0, 1), (2, 3); V: (0, 2), (1, 3)); NaN codes give NaN, -0 keeps its sign; the 2^120
    product never rounds (elem_bits asserts it)."""
    kern = Kernel(128, 1, dtype, "fp8")
    rng = np.random.default_rng(1)
    for code in range(256):
        for pos in range(4):
            w = int(rng.integers(0, 1 << 32)) & ~(0xFF << (8 * pos)) | code << (8 * pos)
            for pairing in ((0, 1, 2, 3), (0, 2, 1, 3)):
                p0, p1 = kern.fp8x4_elems(w, *pairing)
                for byte, bits in zip(pairing, (p0, p0 >> 16, p1, p1 >> 16)):
                    c = (w >> (8 * byte)) & 0xFF
                    got, want = elem_value(bits, dtype), e4m3_value(c)
                    if np.isnan(want):
                        assert np.isnan(got), (hex(w), byte)
                    else:
                        assert got == want and np.signbit(got) == np.signbit(want), (hex(w), byte, got, want)


def test_ldmatrix_model_x1_x2_match_x4():
    """The model's .x1 and .x2 are the first one and two matrices of .x4 (the kernel issues .x4 only)."""
    rng = np.random.default_rng(3)
    smem = rng.integers(0, 256, size=4096).astype(np.uint8)
    addrs = [16 * int(a) for a in rng.permutation(256)[:32]]
    for trans in (False, True):
        x4 = ldmatrix(smem, addrs, trans)
        for num in (1, 2):
            assert ldmatrix(smem, addrs, trans, num) == [r[:num] for r in x4]
    # .trans is the transpose of the plain load's 8 x 8 matrix of 16-bit elements
    plain, tr = ldmatrix(smem, addrs, False, 1), ldmatrix(smem, addrs, True, 1)
    m = [[(plain[4 * r + c // 2][0] >> (16 * (c % 2))) & 0xFFFF for c in range(8)] for r in range(8)]
    mt = [[(tr[4 * r + c // 2][0] >> (16 * (c % 2))) & 0xFFFF for c in range(8)] for r in range(8)]
    assert mt == [list(col) for col in zip(*m)]


def test_the_model_reads_the_kernels_constants():
    """The model's constants are kv_frag.h's (with the expansions of sm90_kv_elems.h) and mainloop.h's: the placement
    masks, 2^120, 2^126, 2^14 and -0, the NaN test, the selectors' formulas, the fragment groupings, the loads' counts
    and the scales' indices."""
    text = KV_FRAG.read_text() + KV_ELEMS.read_text()
    for literal in ("(x << 4) & 0x87F087F0u", "0x7B807B80u, 0x80008000u", "(w & 0x7F7F7F7Fu) + 0x01010101u",
                    "& 0x7FFF7FFFu", "fp8x4_elems<0, 1, 2, 3>", "fp8x4_elems<0, 2, 1, 3>",
                    "(x << 5) & 0x8E008E00u, 0x74007400u, 0x80008000u", "(x << 2) & 0x81C081C0u, 0x7E807E80u",
                    "(w << 4) & 0xF0F0F0F0u, o = w & 0xF0F0F0F0u", "fp4x8_elems<0, 4, 1, 5, 2, 6, 3, 7>",
                    "fp4x8_elems<0, 2, 4, 6, 1, 3, 5, 7>", "kKGroup = 16 / kPlan.kv_bits", "kVTiles = 2 * kKGroup",
                    "kVLoads = (kWarpCols + 8 * kVTiles - 1) / (8 * kVTiles)",
                    "kKLoads = (kKSteps + kKGroup - 1) / kKGroup",
                    "32 * (j / 4) + 8 * (lane % 4) + 4 * c + (j % 4)",
                    "16 * (j / 2) + 4 * (lane % 4) + 2 * c + (j % 2)",
                    "kKvFp4 ? 32 * (ks / 2) + 8 * t + 4 * (ks % 2) : 16 * ks + 4 * t"):
        assert literal in text, literal
    main = (ROOT / "op_sources/attention_fwd/sm90_decode/mainloop.h").read_text()
    for literal in ("4 * (x / 8) + 2 * ((x / 4) % 2) + x % 2", "4 * nb + 2 * (x / 2)",
                    "16 * bl.block(nb) + 8 * j + 2 * (lane % 4)"):
        assert literal in main, literal
    assert re.search(r"rtc_u32\(i\) \| rtc_u32\(i \| 8\) << 4 \| rtc_u32\(j\) << 8 \| rtc_u32\(j \| 8\) << 12", text)
    assert elem_value(0x7B80, "bf16") == 2.0 ** 120
