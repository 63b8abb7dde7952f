"""gfx950's instruction wrappers (isa_gfx950.h) and the low-precision format helpers (fp8_fp4.h) under the wave
emulator, instruction by instruction, against the Python reference (rtcattn.ops.lowp) and, for FP8, torch's casts.

Scaled-MFMA inputs are chosen so that every sum is exact in f32 (each test asserts it of its reference), so the
emulator's accumulation order (csrc_common/emu/isa_host_gfx950.h) cannot change a bit."""
import numpy as np
import pytest
import torch

import emu_harness as h
from rtcattn.ops import lowp

pytestmark = pytest.mark.emu

DECODE, ENCODE, E8M0, FP4_LUT, CVT_F32, CVT_PK_F32, CVT_PK8_F32, MFMA_SCALE, CVT_SCALE_FP4 = range(9)
NAMES = list(lowp.FORMATS)          # e4m3, e5m2, e2m3, e3m2, e2m1: cbsz / blgp 0..4
LANES = np.arange(64)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    program = h.build("isa950_probe.hip", "isa950_probe", "gfx950-emu", str(tmp_path_factory.mktemp("cache")))

    def run(op, inp, arg=0):
        buf = np.zeros(1408, dtype=np.uint32)
        flat = np.ascontiguousarray(inp, dtype=np.uint32).ravel()
        buf[:flat.size] = flat
        out = np.zeros(1024, dtype=np.uint32)
        h.launch(program, (1, 1, 1), (64, 1, 1), h.pack("QQii", buf.ctypes.data, out.ctypes.data, op, arg),
                 h.ranges_of(buf, out))
        return out
    return run


def f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def as_f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def assert_same_f32(got_bits, want):
    """Bit-equal f32 (signed zeros included), any NaN for a NaN."""
    want = np.asarray(want, dtype=np.float64)
    got = as_f32(got_bits).astype(np.float64)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(as_f32(got_bits)[~nan].view(np.uint32), f32_bits(want[~nan]))


# ---- formats: exhaustive decode, encode on every value, tie and overflow ---------------------------------------

@pytest.mark.parametrize("fmt", NAMES)
def test_decode_every_code(probe, fmt):
    codes = np.arange(256)                       # 6- and 4-bit formats: the bits above the width are ignored
    got = probe(DECODE, codes, lowp.FORMATS[fmt].code)[:256]
    assert_same_f32(got, lowp.decode(fmt, codes))
    v = as_f32(got)
    hand = {"e4m3": {0x7E: 448.0, 0x01: 2.0**-9, 0x08: 2.0**-6, 0x38: 1.0, 0xFE: -448.0},
            "e5m2": {0x7B: 57344.0, 0x7C: np.inf, 0xFC: -np.inf, 0x01: 2.0**-16, 0x3C: 1.0},
            "e2m3": {0x1F: 7.5, 0x01: 0.125, 0x08: 1.0, 0x3F: -7.5},
            "e3m2": {0x1F: 28.0, 0x01: 0.0625, 0x0C: 1.0, 0x3F: -28.0},
            "e2m1": {i: x for i, x in enumerate([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])}}
    for code, value in hand[fmt].items():
        assert v[code] == value, (fmt, hex(code), v[code])
    assert f32_bits(v[1 << (lowp.FORMATS[fmt].width - 1)]) == 0x80000000, "the sign-only code is -0"
    if fmt == "e4m3":
        assert np.isnan(v[0x7F]) and np.isnan(v[0xFF]) and np.isfinite(np.delete(v, [0x7F, 0xFF])).all()
    if fmt == "e5m2":
        assert np.isnan(v[[0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]]).all()
    if fmt in ("e4m3", "e5m2"):   # torch's float8 dtypes are the OCP formats
        dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
        want = torch.arange(256, dtype=torch.uint8).view(dt).float().numpy()
        assert_same_f32(got, want)


def encode_inputs(fmt, seed):
    """Every value of the format, the midpoints between neighbours (ties) and one f32 step either side, the overflow
    boundary, specials, f32 subnormals, and random f32 of every binade the format covers; both signs."""
    f = lowp.format_of(fmt)
    mags = np.array(sorted({abs(x) for x in lowp.values(fmt) if np.isfinite(x)}))
    mids = (mags[:-1] + mags[1:]) / 2
    step_max = mags[-1] - mags[-2] if fmt != "e4m3" else 32.0   # E4M3: the next code up (480) is its NaN
    over = mags[-1] + step_max / 2                              # the tie between the largest and the next code
    pts = np.concatenate([mags, mids, [over, 2 * mags[-1], 1e30, np.inf, np.nan, 2.0**-130, 2.0**-149, 2.0**-126]])
    pts32 = pts.astype(np.float32)
    near = np.concatenate([np.nextafter(pts32, np.float32(np.inf)), np.nextafter(pts32, np.float32(0))])
    base = np.concatenate([pts32, near[np.isfinite(near)]])
    rng = np.random.default_rng(seed)
    rand = (2.0 ** rng.uniform(np.log2(mags[1]) - 3, np.log2(mags[-1]) + 2, 1024)).astype(np.float32)
    rand[::2] *= -1
    assert f.width in (4, 6, 8)
    return np.concatenate([base, -base, rand])


def encode_all(probe, x, arg):
    """The probe's encode of any number of f32, 1024 a launch."""
    return np.concatenate([probe(ENCODE, f32_bits(x[i:i + 1024]), arg)[:len(x[i:i + 1024])]
                           for i in range(0, len(x), 1024)]).astype(np.int64)


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", NAMES)
def test_encode_round_to_nearest_even(probe, fmt, saturate):
    f = lowp.FORMATS[fmt]
    x = encode_inputs(fmt, f.code)
    got = encode_all(probe, x, f.code | (saturate << 8))
    np.testing.assert_array_equal(got, lowp.encode(fmt, x, saturate))
    # The round trip of every value, and hand-worked ties and overflows.
    finite = np.isfinite(lowp.values(fmt))
    codes = np.arange(1 << f.width)[finite]
    np.testing.assert_array_equal(probe(ENCODE, f32_bits(lowp.values(fmt)[finite]), f.code)[:codes.size], codes)

    def enc(v):
        return int(probe(ENCODE, f32_bits([v]), f.code | (saturate << 8))[0])
    if fmt == "e4m3":
        assert enc(464.0) == 0x7E and enc(-464.0) == 0xFE            # the tie goes to the even 448
        assert enc(465.0) == (0x7E if saturate else 0x7F) and enc(np.inf) == (0x7E if saturate else 0x7F)
        assert enc(np.nan) == 0x7F and enc(2.0**-10) == 0x00 and enc(3 * 2.0**-11) == 0x01
    if fmt == "e5m2":
        assert enc(61439.99) == 0x7B and enc(61440.0) == (0x7B if saturate else 0x7C)
        assert enc(-np.inf) == (0xFB if saturate else 0xFC) and enc(np.nan) == 0x7E
    if fmt == "e2m1":
        assert [enc(v) for v in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e9, -1e9, np.nan)] == \
            [0, 2, 2, 4, 4, 6, 6, 7, 7, 15, 7]
    if fmt in ("e4m3", "e5m2"):
        # torch: float8_e4m3fn casts saturate (Inf too), float8_e5m2 casts do not; NaN payloads aside.
        if (fmt == "e4m3") == saturate:
            dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
            keep = ~np.isnan(x)
            want = torch.from_numpy(x[keep]).to(dt).view(torch.uint8).numpy().astype(np.int64)
            np.testing.assert_array_equal(got[keep], want)


# Scale codes (the E8M0 code in the f32 operand's exponent field): 2^-127 (the f32 +0), the f32 subnormal range's
# edge, 1.0, fp16's rounding region (2^-27 .. 2^-14 times the values 0.5 .. 6), fp16's overflow, bf16's, NaN.
SCALE_CODES = [0, 1, 2, 100, 101, 102, 103, 110, 113, 126, 127, 128, 140, 141, 142, 200, 252, 253, 254, 255]


@pytest.mark.parametrize("f16", [False, True], ids=["bf16", "f16"])
@pytest.mark.parametrize("byte", range(4))
def test_cvt_scalef32_pk_fp4(probe, byte, f16):
    """v_cvt_scalef32_pk_{bf16,f16}_fp4: every value of the selected byte (the other bytes random) at each scale code:
    the low nibble's element in the low half, each the E2M1 value times 2^(code - 127) rounded to nearest even by
    torch's cast from the exact float64 product (bf16: exact or Inf; fp16: subnormals rounded, ties included, Inf
    past 65504), a NaN for code 0xFF."""
    rng = np.random.default_rng(byte + 4 * f16)
    vals = np.arange(256, dtype=np.uint32)
    words = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
    words = (words & ~np.uint32(0xFF << (8 * byte))) | (vals << np.uint32(8 * byte))
    dt = torch.float16 if f16 else torch.bfloat16
    seen_round = seen_inf = False
    for code in SCALE_CODES:
        scale = np.full(256, code << 23, dtype=np.uint32)
        got = probe(CVT_SCALE_FP4, np.concatenate([words, scale]), byte | (int(f16) << 2))[:256]
        for half, nib in ((0, vals & 0xF), (1, vals >> 4)):
            exact = lowp.decode("e2m1", nib).astype(np.float64) * 2.0 ** (code - 127)
            elem = (got >> np.uint32(16 * half)) & np.uint32(0xFFFF)
            gv = torch.from_numpy(elem.astype(np.int16)).view(dt).double().numpy()
            if code == 0xFF:
                assert np.isnan(gv).all(), (code, half)
                assert ((elem >> 15) == (nib >> 3)).all(), "the NaN keeps the code's sign"
                continue
            want = torch.from_numpy(exact).to(dt)
            np.testing.assert_array_equal(elem.astype(np.int16), want.view(torch.int16).numpy(), err_msg=str(code))
            w = want.double().numpy()
            rounded = (w != exact) & np.isfinite(w)
            assert f16 or not rounded.any(), "bf16 holds every product or overflows"
            seen_round |= bool(rounded.any())
            seen_inf |= bool(np.isinf(w).any())
    assert seen_inf and (seen_round or not f16), "the codes reach the overflow (and fp16's rounding)"


@pytest.mark.parametrize("saturate", [False, True])
def test_e4m3fnuz(probe, saturate):
    """MI300X's FP8 (torch.float8_e4m3fnuz; fp8_fp4.h's RTC_LP_E4M3FNUZ, not a scaled-MFMA format): every code's value
    against lowp and torch, bias 8 (half an OCP E4M3 code's value), 0x80 its only NaN, no -0, 240 its largest; encode
    against lowp in both saturation modes and against torch's (non-saturating) cast."""
    f = lowp.E4M3FNUZ
    codes = np.arange(256)
    got = probe(DECODE, codes, f.code)[:256]
    assert_same_f32(got, lowp.decode("e4m3fnuz", codes))
    assert_same_f32(got, torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fnuz).float().numpy())
    v = as_f32(got)
    ocp = lowp.values("e4m3")
    finite = (codes != 0x80) & (codes != 0x7F) & (codes != 0xFF)
    assert np.isnan(v[0x80]) and np.isfinite(np.delete(v, 0x80)).all() and v[0x7F] == 240.0 and v[0xFF] == -240.0
    assert (v[finite] == ocp[finite] / 2).all() and f32_bits(v[0]) == 0
    x = encode_inputs("e4m3fnuz", f.code)
    enc = encode_all(probe, x, f.code | (saturate << 8))
    np.testing.assert_array_equal(enc, lowp.encode("e4m3fnuz", x, saturate))
    assert not (enc[np.isfinite(x) & (np.abs(x) <= 240)] == 0x80).any()  # -0 and tiny negatives: 0x00, never NaN
    if not saturate:
        keep = ~np.isnan(x)
        want = torch.from_numpy(x[keep]).to(torch.float8_e4m3fnuz).view(torch.uint8).numpy().astype(np.int64)
        np.testing.assert_array_equal(enc[keep], want)


def test_e8m0(probe):
    codes = np.arange(256)
    x = np.array([1.0, 3.0, 0.75, 2.0**127, 1.5 * 2.0**127, 2.0**-126, 2.0**-127, 1.5 * 2.0**-127, 2.0**-140, 0.0,
                  -0.0, -6.0, np.inf, -np.inf, np.nan, np.nextafter(np.float32(4.0), np.float32(0))], np.float32)
    rng = np.random.default_rng(5)
    y = np.concatenate([x, (2.0 ** rng.uniform(-130, 128, 256 - x.size)).astype(np.float32)])
    out = probe(E8M0, np.concatenate([codes, f32_bits(y)]))
    want = lowp.e8m0_value(codes)
    assert_same_f32(out[:256], want)
    assert out[127] == f32_bits(1.0) and out[0] == 0x00400000 and np.isnan(as_f32(out[255]))
    enc = out[256:512].astype(np.int64)
    np.testing.assert_array_equal(enc, lowp.e8m0_encode(y))
    assert list(enc[:x.size]) == [127, 128, 126, 254, 254, 1, 0, 0, 0, 0, 0, 129, 255, 255, 255, 128]


def test_fp4_lut(probe):
    """The table-driven E2M1 -> E4M3 / bf16 decode: every code, and the packed forms."""
    codes = np.arange(256) % 16
    rng = np.random.default_rng(6)
    x4 = rng.integers(0, 1 << 16, 256)
    x2 = rng.integers(0, 1 << 8, 256)
    out = probe(FP4_LUT, np.concatenate([codes, x4, x2]))
    e4m3, bf16 = out[:16] & 0xFF, out[:16] >> 16
    value = lowp.decode("e2m1", np.arange(16))
    np.testing.assert_array_equal(e4m3, lowp.encode("e4m3", value))
    np.testing.assert_array_equal(lowp.decode("e4m3", e4m3), value)       # exact: 0, 0.5, ..., 6 and negatives
    bf16_of_value = torch.tensor(value, dtype=torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    np.testing.assert_array_equal(bf16, bf16_of_value)
    assert list(e4m3[:8]) == [0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C] and e4m3[9] == 0xB0
    assert list(bf16[:8]) == [0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0] and bf16[8] == 0x8000
    lut8, lut16 = out[:16] & 0xFF, out[:16] >> 16
    want4 = sum(lut8[(x4 >> (4 * i)) & 15].astype(np.int64) << (8 * i) for i in range(4))
    want2 = lut16[x2 & 15].astype(np.int64) | (lut16[x2 >> 4].astype(np.int64) << 16)
    np.testing.assert_array_equal(out[256:512], want4)
    np.testing.assert_array_equal(out[512:768], want2)


# ---- the OCP FP8 converts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("byte", range(4))
@pytest.mark.parametrize("bf8", [False, True])
def test_cvt_f32_fp8(probe, bf8, byte):
    rng = np.random.default_rng(10 + byte)
    words = rng.integers(0, 1 << 32, 256, dtype=np.uint64)
    words = (words & ~np.uint64(0xFF << (8 * byte))) | (np.arange(256, dtype=np.uint64) << np.uint64(8 * byte))
    got = probe(CVT_F32, words.astype(np.uint32), int(bf8) | (byte << 1))[:256]
    assert_same_f32(got, lowp.decode("e5m2" if bf8 else "e4m3", np.arange(256)))


@pytest.mark.parametrize("hi", [False, True])
@pytest.mark.parametrize("bf8", [False, True])
def test_cvt_pk_f32_fp8(probe, bf8, hi):
    rng = np.random.default_rng(20 + 2 * bf8 + hi)
    words = rng.integers(0, 1 << 32, 256, dtype=np.uint64).astype(np.uint32)
    out = probe(CVT_PK_F32, words, int(bf8) | (hi << 1))
    half = (words >> 16) if hi else words & 0xFFFF
    fmt = "e5m2" if bf8 else "e4m3"
    assert_same_f32(out[:256], lowp.decode(fmt, half & 0xFF))
    assert_same_f32(out[512:768], lowp.decode(fmt, half >> 8))


@pytest.mark.parametrize("hi", [False, True])
@pytest.mark.parametrize("bf8", [False, True])
def test_cvt_pk_fp8_f32(probe, bf8, hi):
    """Round to nearest even, not saturating; the other half of `old` kept."""
    fmt = "e5m2" if bf8 else "e4m3"
    x = encode_inputs(fmt, 30 + bf8)
    rng = np.random.default_rng(40 + hi)
    x = x[:len(x) // 256 * 256]
    y = rng.permutation(x)
    for i in range(0, len(x), 256):
        xs, ys = x[i:i + 256], y[i:i + 256]
        old = rng.integers(0, 1 << 32, 256, dtype=np.uint64).astype(np.uint32)
        got = probe(CVT_PK8_F32, np.concatenate([f32_bits(xs), f32_bits(ys), old]), int(bf8) | (hi << 1))[:256]
        pk = (lowp.encode(fmt, xs) | (lowp.encode(fmt, ys) << 8)).astype(np.uint32)
        want = (old & 0xFFFF) | (pk << 16) if hi else (old & 0xFFFF0000) | pk
        np.testing.assert_array_equal(got, want)


# ---- v_mfma_scale_f32_16x16x128_f8f6f4 ----------------------------------------------------------------------------

def pack_lanes(codes, fmt, rng=None):
    """A [16][128] (or B^T [16][128]: column n's k-run) of codes -> the 64 lanes' 8 dwords: lane l holds k = 32 (l / 16)
    + e of row l % 16 at bits [w e, w e + w). Dwords past the format's 32 w bits get random garbage when rng is given
    (the instruction must not read them)."""
    w = lowp.FORMATS[fmt].width
    out = np.zeros((64, 8), dtype=np.uint32)
    for lane in LANES:
        word = 0
        for e in range(32):
            word |= int(codes[lane % 16][32 * (lane // 16) + e]) << (w * e)
        if rng is not None and w < 8:
            word |= int.from_bytes(rng.bytes(32), "little") >> (32 * w) << (32 * w)
        out[lane] = [(word >> (32 * i)) & 0xFFFFFFFF for i in range(8)]
    return out


def unpack_lanes(words, fmt):
    """The reference's own reading of the operand: element e of lane l, as [16][128] values."""
    w = lowp.FORMATS[fmt].width
    vals = np.zeros((16, 128))
    for lane in LANES:
        word = sum(int(words[lane][i]) << (32 * i) for i in range(8))
        for e in range(32):
            vals[lane % 16][32 * (lane // 16) + e] = lowp.decode(fmt, (word >> (w * e)) & ((1 << w) - 1))
    return vals


def mfma_scale_reference(a, b, c, sa, sb, cbsz, blgp, opsel_a=0, opsel_b=0):
    """D (lane-major [64][4], float64) = C + sum over k-blocks g of 2^(sa - 127) 2^(sb - 127) A_g B_g; the scale of
    row m (column n) and block g is byte op_sel of lane 16 g + m (n); 0xFF is NaN."""
    A, Bt = unpack_lanes(a, NAMES[cbsz]), unpack_lanes(b, NAMES[blgp])
    ea = (np.asarray(sa, np.uint64) >> np.uint64(8 * opsel_a)) & np.uint64(0xFF)
    eb = (np.asarray(sb, np.uint64) >> np.uint64(8 * opsel_b)) & np.uint64(0xFF)
    D = np.zeros((16, 16))
    with np.errstate(invalid="ignore"):
        for g in range(4):
            blk = A[:, 32 * g:32 * g + 32] @ Bt[:, 32 * g:32 * g + 32].T
            scale = np.outer(lowp.e8m0_value(ea[16 * g:16 * g + 16]), lowp.e8m0_value(eb[16 * g:16 * g + 16]))
            D += blk * scale
    out = np.array([[D[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    return out + c


def mfma_inputs(a, b, c, sa, sb):
    return np.concatenate([a.ravel(), b.ravel(), f32_bits(c).ravel(), np.asarray(sa, np.uint32),
                           np.asarray(sb, np.uint32)])


def small_codes(fmt, rng, shape, max_abs=4.0, min_abs=0.25):
    """Random codes of values 0 or min_abs <= |v| < max_abs: their products and sums stay exact in f32 below."""
    v = lowp.values(fmt)
    ok = np.flatnonzero(np.isfinite(v) & ((v == 0) | ((np.abs(v) >= min_abs) & (np.abs(v) < max_abs))))
    return rng.choice(ok, size=shape)


def run_mfma(probe, arg, a, b, c, sa, sb):
    return probe(MFMA_SCALE, mfma_inputs(a, b, c, sa, sb), arg)[:256].reshape(64, 4)


def assert_exact_f32(want):
    finite = want[np.isfinite(want)]
    np.testing.assert_array_equal(finite.astype(np.float32).astype(np.float64), finite)


@pytest.mark.parametrize("blgp", range(5), ids=NAMES)
@pytest.mark.parametrize("cbsz", range(5), ids=NAMES)
def test_mfma_scale_formats(probe, cbsz, blgp):
    """Every (cbsz, blgp) pair on random codes and per-lane scales; FP6 / FP4 operands carry garbage in the dwords
    the instruction does not read."""
    rng = np.random.default_rng(100 + 5 * cbsz + blgp)
    a = pack_lanes(small_codes(NAMES[cbsz], rng, (16, 128)), NAMES[cbsz], rng)
    b = pack_lanes(small_codes(NAMES[blgp], rng, (16, 128)), NAMES[blgp], rng)
    c = rng.integers(-8, 9, (64, 4)) * 0.25
    sa, sb = rng.integers(126, 129, 64), rng.integers(126, 129, 64)
    want = mfma_scale_reference(a, b, c, sa, sb, cbsz, blgp)
    assert_exact_f32(want)
    assert_same_f32(run_mfma(probe, 5 * cbsz + blgp, a, b, c, sa, sb).ravel(), want.ravel())


def test_mfma_scale_lane_mapping(probe):
    """A[m][k] = 1 only at k = 7m + 5, B[k][n] = (k + n) % 7 + 1, A's scales 2^g for k-block g: D[m][n] =
    2^g(7m+5) * ((7m + 5 + n) % 7 + 1) shows where every k and every scale travels (E4M3 x E4M3)."""
    A = np.zeros((16, 128), dtype=np.int64)
    A[np.arange(16), 7 * np.arange(16) + 5] = lowp.encode("e4m3", 1.0)
    Bt = lowp.encode("e4m3", (np.arange(128)[None, :] + np.arange(16)[:, None]) % 7 + 1.0)
    sa = 127 + LANES // 16                       # lane 16 g + m: row m, block g
    sb = np.full(64, 127)
    c = np.zeros((64, 4))
    d = run_mfma(probe, 0, pack_lanes(A, "e4m3"), pack_lanes(Bt, "e4m3"), c, sa, sb).view(np.float32)
    # Hand-worked: row 5 reads k = 40 (block 1, scale 2), column 0: 2 * (40 % 7 + 1) = 12; row 5 lives in lane
    # 16 * (5 // 4) + 0 = 16, element 1.
    assert d[16][1] == 12.0
    for lane in LANES:
        for i in range(4):
            m, n = 4 * (lane // 16) + i, lane % 16
            k = 7 * m + 5
            assert d[lane][i] == 2.0 ** (k // 32) * ((k + n) % 7 + 1), (lane, i)


@pytest.mark.parametrize("opsel_b", range(4))
@pytest.mark.parametrize("opsel_a", range(4))
def test_mfma_scale_op_sel(probe, opsel_a, opsel_b):
    """op_sel picks one byte of each lane's scale word (FP8 E4M3 A x FP4 E2M1 B, the FP4-cache QK product)."""
    rng = np.random.default_rng(200 + 4 * opsel_a + opsel_b)
    a = pack_lanes(small_codes("e4m3", rng, (16, 128)), "e4m3")
    b = pack_lanes(small_codes("e2m1", rng, (16, 128)), "e2m1", rng)
    c = rng.integers(-8, 9, (64, 4)) * 1.0
    sa = sum(rng.integers(126, 129, 64) << (8 * i) for i in range(4))
    sb = sum(rng.integers(126, 129, 64) << (8 * i) for i in range(4))
    want = mfma_scale_reference(a, b, c, sa, sb, 0, 4, opsel_a, opsel_b)
    assert_exact_f32(want)
    got = run_mfma(probe, 25 + 4 * opsel_a + opsel_b, a, b, c, sa, sb)
    assert_same_f32(got.ravel(), want.ravel())
    for other in range(4):                       # the other bytes give other results
        if other != opsel_a:
            assert not np.array_equal(mfma_scale_reference(a, b, c, sa, sb, 0, 4, other, opsel_b), want)


def test_mfma_scale_nan_and_zero_scales(probe):
    rng = np.random.default_rng(300)
    A = small_codes("e4m3", rng, (16, 128), min_abs=0.5)
    a, b = pack_lanes(A, "e4m3"), pack_lanes(small_codes("e2m1", rng, (16, 128)), "e2m1")
    c = np.ones((64, 4))
    # 0xFF in A's lane 16 * 2 + 3 (row 3, block 2) and B's lane 9 (column 9, block 0): row 3 and column 9 are NaN.
    sa, sb = np.full(64, 127), np.full(64, 127)
    sa[35], sb[9] = 0xFF, 0xFF
    got = run_mfma(probe, 4, a, b, c, sa, sb)
    want = mfma_scale_reference(a, b, c, sa, sb, 0, 4)
    rows, cols = 4 * (LANES[:, None] // 16) + np.arange(4)[None, :], (LANES % 16)[:, None] + 0 * np.arange(4)
    assert np.array_equal(np.isnan(want), (rows == 3) | (cols == 9)) and np.isnan(want).sum() == 31
    assert_same_f32(got.ravel(), want.ravel())
    # E8M0 0x00 is 2^-127, not 0: both scales 0 leave C (2^-254 is below f32); one at 0 gives dot * 2^-127.
    zero = run_mfma(probe, 4, a, b, c, np.zeros(64), np.zeros(64))
    assert (zero.view(np.float32) == 1.0).all()
    c0 = np.zeros((64, 4))
    tiny = run_mfma(probe, 4, a, b, c0, np.zeros(64), np.full(64, 127)).view(np.float32)
    dot = mfma_scale_reference(a, b, c0, np.full(64, 127), np.full(64, 127), 0, 4)
    assert_exact_f32(dot * 2.0**-127)
    np.testing.assert_array_equal(tiny, (dot * 2.0**-127).astype(np.float32))
    assert (tiny != 0).any()


def test_mfma_scale_nan_inf_elements(probe):
    """E4M3's NaN code in A makes its row NaN; E5M2's Inf in B gives Inf against non-zero A, NaN against zeros."""
    rng = np.random.default_rng(400)
    A = small_codes("e4m3", rng, (16, 128), min_abs=0.5)
    A[6, 3] = 0x7F                               # NaN
    A[:8, 100] = 0                               # rows 0..7 multiply B's k = 100 by zero
    A[8:, 100] = lowp.encode("e4m3", 2.0)
    Bt = small_codes("e5m2", rng, (16, 128))
    Bt[11, 100] = 0x7C                           # +Inf at k = 100 of column 11
    c = np.zeros((64, 4))
    s = np.full(64, 127)
    a, b = pack_lanes(A, "e4m3"), pack_lanes(Bt, "e5m2")
    want = mfma_scale_reference(a, b, c, s, s, 0, 1)
    got = run_mfma(probe, 1, a, b, c, s, s)
    assert_same_f32(got.ravel(), want.ravel())
    d = np.zeros((16, 16))
    for lane in LANES:
        for i in range(4):
            d[4 * (lane // 16) + i][lane % 16] = got.view(np.float32)[lane][i]
    assert np.isnan(d[6]).all() and np.isnan(d[:8, 11][np.arange(8) != 6]).all()
    assert (d[8:, 11] == np.inf).all() and np.isfinite(np.delete(np.delete(d, 6, 0), 11, 1)).all()
