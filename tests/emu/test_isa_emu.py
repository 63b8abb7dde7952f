"""Each isa_gfx9.h wrapper under the wave emulator against values worked out from the ISA's definition."""
import numpy as np
import pytest

import emu_harness as h

pytestmark = pytest.mark.emu

(MFMA16, MFMA32, EXP2, ROW_SHR, ROW_ROR, QUAD_PERM, ROW_MIRROR, BCAST15, PERM, READFIRST, BPERMUTE,
 SWIZZLE_XOR, SWIZZLE_QUAD, VOTE, BUF_LOAD, BUF_LDS, BUF_STORE, MFMA16_F16, MFMA32_F16, CVT_F16,
 CVT_PK_FNUZ, CVT_PKRTZ, BUF_UBYTE) = range(23)
LANES = np.arange(64)


@pytest.fixture(scope="module", params=["gfx942-emu", "gfx90a-emu"])
def probe(request, tmp_path_factory):
    program = h.build("isa_probe.hip", "isa_probe", request.param, str(tmp_path_factory.mktemp("cache")))

    def run(op, inp, arg=0, out_init=0):
        inp = np.ascontiguousarray(inp, dtype=np.uint32)
        out = np.full(1024, out_init, dtype=np.uint32)
        h.launch(program, (1, 1, 1), (64, 1, 1), h.pack("QQii", inp.ctypes.data, out.ctypes.data, op, arg),
                 h.ranges_of(inp, out))
        return out
    run.arch = request.param
    return run


def bf16_bits(x):
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint32)


def f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint16).astype(np.uint32)


def mfma_inputs(a_lanes, b_lanes, c_lanes, bits=bf16_bits):
    inp = np.zeros(1024 + 512, dtype=np.uint32)
    inp[:256] = bits(a_lanes).ravel()
    inp[256:512] = bits(b_lanes).ravel()
    inp[512:512 + c_lanes.size] = f32_bits(c_lanes).ravel()
    return inp


def test_mfma_16x16x16_lane_mapping(probe):
    # A[m][k] = 16m + k and B = I, so D = A + C shows where every element travels.
    A = np.arange(256, dtype=np.float32).reshape(16, 16)
    B = np.eye(16, dtype=np.float32)
    C = 1000 + np.arange(256, dtype=np.float32).reshape(16, 16)
    a = np.array([[A[lane % 16][4 * (lane // 16) + i] for i in range(4)] for lane in LANES])
    b = np.array([[B[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    c = np.array([[C[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    d = probe(MFMA16, mfma_inputs(a, b, c))[:256].view(np.float32).reshape(64, 4)
    # Hand-worked: lane 17 (column 1, row group 1) element 2 is D[6][1] = 16*6 + 1 + 1000 + 16*6 + 1.
    assert d[17][2] == 97 + 1097
    assert d[0][0] == 0 + 1000 and d[63][3] == 255 + 1255
    want = A @ B + C
    for lane in LANES:
        for i in range(4):
            assert d[lane][i] == want[4 * (lane // 16) + i][lane % 16], (lane, i)


def test_mfma_16x16x16_integer_products(probe):
    rng = np.random.default_rng(1)
    A, B = (rng.integers(-4, 5, (16, 16)).astype(np.float32) for _ in range(2))
    C = rng.integers(-8, 9, (16, 16)).astype(np.float32)
    a = np.array([[A[lane % 16][4 * (lane // 16) + i] for i in range(4)] for lane in LANES])
    b = np.array([[B[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    c = np.array([[C[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    d = probe(MFMA16, mfma_inputs(a, b, c))[:256].view(np.float32).reshape(64, 4)
    want = A @ B + C
    got = np.zeros((16, 16), dtype=np.float32)
    for lane in LANES:
        for i in range(4):
            got[4 * (lane // 16) + i][lane % 16] = d[lane][i]
    np.testing.assert_array_equal(got, want)


def test_mfma_32x32x8_lane_mapping(probe):
    rng = np.random.default_rng(2)
    A = np.arange(256, dtype=np.float32).reshape(32, 8)           # 8m + k: exact in bf16
    B = rng.integers(-3, 4, (8, 32)).astype(np.float32)
    B[:, :8] = np.eye(8)                                          # columns 0..7 copy A
    C = rng.integers(-8, 9, (32, 32)).astype(np.float32)
    a = np.array([[A[lane % 32][4 * (lane // 32) + i] for i in range(4)] for lane in LANES])
    b = np.array([[B[4 * (lane // 32) + i][lane % 32] for i in range(4)] for lane in LANES])
    def row(lane, r):
        return 8 * (r // 4) + 4 * (lane // 32) + r % 4
    c = np.array([[C[row(lane, r)][lane % 32] for r in range(16)] for lane in LANES])
    d = probe(MFMA32, mfma_inputs(a, b, c))[:1024].view(np.float32).reshape(64, 16)
    # Hand-worked: lane 33 holds column 1; its register 5 is row 8*1 + 4*1 + 1 = 13: A[13][1] = 105.
    assert d[33][5] == 105 + C[13][1]
    want = A @ B + C
    for lane in LANES:
        for r in range(16):
            assert d[lane][r] == want[row(lane, r)][lane % 32], (lane, r)


def test_mfma_16x16x16_f16_products_bf16_cannot_hold(probe):
    """fp16 operands: 11-bit significands (1 + 2^-10 is exact in fp16, not in bf16), subnormals and fp16's largest
    value; the products of exact fp16 values and their sums are exact in fp32 here, so D must equal A @ B + C."""
    rng = np.random.default_rng(3)
    A = (1 + rng.integers(0, 1024, (16, 16)) * 2.0**-10) * rng.choice([-1.0, 1.0], (16, 16))
    B = rng.integers(-8, 9, (16, 16)).astype(np.float64)
    A[0, :] = A[1, :] = 0.0
    A[0, :2] = [2.0**-24, 3 * 2.0**-24]                         # subnormals
    A[1, 2:4] = [65504.0, -65504.0]                              # the largest finite, both signs
    B[:2, 0], B[:2, 1:] = 1024.0, 0.0                            # so that every sum below is exact in fp32
    C = rng.integers(-8, 9, (16, 16)).astype(np.float64)
    assert (A.astype(np.float16).astype(np.float64) == A).all()
    a = np.array([[A[lane % 16][4 * (lane // 16) + i] for i in range(4)] for lane in LANES])
    b = np.array([[B[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    c = np.array([[C[4 * (lane // 16) + i][lane % 16] for i in range(4)] for lane in LANES])
    d = probe(MFMA16_F16, mfma_inputs(a, b, c, f16_bits))[:256].view(np.float32).reshape(64, 4)
    want = A @ B + C
    # D[0][0] (lane 0, element 0): 2^-24 * 1024 + 3 * 2^-24 * 1024 = 2^-12 from the subnormals alone.
    assert d[0][0] == np.float32(C[0][0] + 2.0**-12)
    assert d[1][1] == np.float32(C[1][1] + 65504.0 * (B[2][1] - B[3][1]))   # D[1][1]: lane 1, element 1
    for lane in LANES:
        for i in range(4):
            assert d[lane][i] == np.float32(want[4 * (lane // 16) + i][lane % 16]), (lane, i)
    # The same bits read as bf16 give other values: the instruction really reads fp16.
    d_bf16 = probe(MFMA16, mfma_inputs(a, b, c, f16_bits))[:256].view(np.float32).reshape(64, 4)
    assert not np.array_equal(d, d_bf16)


def test_mfma_32x32x8_f16_lane_mapping(probe):
    rng = np.random.default_rng(4)
    A = (np.arange(256).reshape(32, 8) + 0.5) * 2.0**-3        # 11 significant bits at most: exact in fp16
    B = rng.integers(-3, 4, (8, 32)).astype(np.float64)
    B[:, :8] = np.eye(8)                                          # columns 0..7 copy A
    C = rng.integers(-8, 9, (32, 32)).astype(np.float64)
    a = np.array([[A[lane % 32][4 * (lane // 32) + i] for i in range(4)] for lane in LANES])
    b = np.array([[B[4 * (lane // 32) + i][lane % 32] for i in range(4)] for lane in LANES])

    def row(lane, r):
        return 8 * (r // 4) + 4 * (lane // 32) + r % 4
    c = np.array([[C[row(lane, r)][lane % 32] for r in range(16)] for lane in LANES])
    d = probe(MFMA32_F16, mfma_inputs(a, b, c, f16_bits))[:1024].view(np.float32).reshape(64, 16)
    # Lane 33 holds column 1; its register 5 is row 13: A[13][1] = (105 + 0.5) / 8.
    assert d[33][5] == 105.5 / 8 + C[13][1]
    want = A @ B + C
    for lane in LANES:
        for r in range(16):
            assert d[lane][r] == np.float32(want[row(lane, r)][lane % 32]), (lane, r)


def test_cvt_f16_f32(probe):
    """v_cvt_f16_f32: nearest even (ties both ways), subnormals kept, 65520 and above to Inf; NaN quiet."""
    x = np.array([1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 65504.0, 65519.99, 65520.0, -1e30, 2.0**-24, 2.0**-25,
                  1.5 * 2.0**-25, -0.0, np.inf, np.nan, 2.0**-14 - 2.0**-25, 1e-45] + [0.5] * 49, dtype=np.float32)
    got = probe(CVT_F16, f32_bits(x))[:64]
    assert (got >> 16 == 0).all(), "the high half is zero"
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    assert got[1] == 0x3C00 and got[2] == 0x3C02 and got[5] == 0x7C00 and got[6] == 0xFC00 and got[7] == 0x0001
    assert got[8] == 0x0000 and got[9] == 0x0001 and got[10] == 0x8000 and got[13] == 0x0400
    assert got[12] & 0x7C00 == 0x7C00 and got[12] & 0x03FF, "a NaN stays a NaN"
    keep = ~np.isnan(x)
    np.testing.assert_array_equal(got[keep], want[keep])


def test_exp2(probe):
    x = np.array([0.0, 1.0, -1.0, 10.5, -126.0, -149.0, -200.0, 127.9, 128.0, np.inf, -np.inf, np.nan] + [0.25] * 52,
                 dtype=np.float32)
    got = probe(EXP2, f32_bits(x))[:64].view(np.float32)
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    assert got[0] == 1 and got[1] == 2 and got[2] == 0.5 and got[6] == 0 and got[8] == np.inf
    assert got[9] == np.inf and got[10] == 0 and np.isnan(got[11])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-7)


def dpp_inputs():
    inp = np.zeros(1024, dtype=np.uint32)
    inp[:64] = 1000 + LANES          # src
    inp[64:128] = 5000 + LANES       # old
    return inp


def test_dpp_row_shr_ror_quad_mirror(probe):
    x, old = 1000 + LANES, 5000 + LANES
    row = LANES & ~15
    shr = probe(ROW_SHR, dpp_inputs())[:64]
    assert shr[16] == 0 and shr[17] == 1016      # lane 16 starts a row: bound_ctrl gives 0
    np.testing.assert_array_equal(shr, np.where(LANES % 16 == 0, 0, x - 1))
    np.testing.assert_array_equal(probe(ROW_ROR, dpp_inputs())[:64], x[row + (LANES % 16 - 3) % 16])
    np.testing.assert_array_equal(probe(QUAD_PERM, dpp_inputs())[:64], x[(LANES & ~3) | (3 - (LANES & 3))])
    np.testing.assert_array_equal(probe(ROW_MIRROR, dpp_inputs())[:64], x[row + 15 - LANES % 16])
    # row_bcast:15 with row_mask 0xA: rows 1 and 3 get the last lane of the row before; rows 0 and
    # 2 are masked off and keep `old`.
    want = np.where(LANES // 16 == 1, 1015, np.where(LANES // 16 == 3, 1047, old))
    np.testing.assert_array_equal(probe(BCAST15, dpp_inputs())[:64], want)


def test_cvt_pkrtz_f16_f32(probe):
    """v_cvt_pkrtz_f16_f32: both halves toward zero (ties and subnormals truncated, past 65504 to 65504, Inf kept),
    a in the low half; NaN quiet."""
    x = np.array([1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 3 * 2.0**-11), 65504.0, 65519.99, 70000.0, -1e30,
                  np.inf, -np.inf, 2.0**-24, 2.0**-25, 1.5 * 2.0**-24, -1.5 * 2.0**-24, 2.0**-14 - 2.0**-25, -0.0,
                  1e-45, 3.14159, -2.71828, 240.0, 2.0**-10, np.nan] + [0.75] * 42, dtype=np.float32)
    y = -x[::-1].copy()
    inp = np.zeros(1024, dtype=np.uint32)
    inp[:64], inp[64:128] = f32_bits(x), f32_bits(y)
    got = probe(CVT_PKRTZ, inp)[:64]

    def rtz(v):  # nearest even, then one step toward zero where that rounded away from zero
        with np.errstate(over="ignore"):
            h = v.astype(np.float16)
        bits = h.view(np.uint16).astype(np.int64)
        away = np.abs(h.astype(np.float64)) > np.abs(v.astype(np.float64))
        return np.where(away & np.isfinite(v), bits - 1, bits).astype(np.uint32)
    lo, hi = got & 0xFFFF, got >> 16
    assert lo[1] == 0x3C00 and lo[2] == 0x3C01 and lo[3] == 0xBC01 and lo[5] == 0x7BFF and lo[6] == 0x7BFF
    assert lo[7] == 0xFBFF and lo[8] == 0x7C00 and lo[10] == 0x0001 and lo[11] == 0 and lo[12] == 0x0001
    assert lo[13] == 0x8001 and lo[14] == 0x03FF and lo[15] == 0x8000 and lo[16] == 0
    for half, v in ((lo, x), (hi, y)):
        nan = np.isnan(v)
        assert ((half[nan] & 0x7C00) == 0x7C00).all() and (half[nan] & 0x3FF).all(), "a NaN stays a NaN"
        np.testing.assert_array_equal(half[~nan], rtz(v)[~nan])


def test_cvt_pk_f32_fp8_fnuz(probe):
    """gfx942's v_cvt_pk_f32_fp8 reads E4M3 FNUZ (bias 8, no Inf, no -0, 0x80 its only NaN): every code against
    torch's float8_e4m3fnuz, the word select picking bytes 0, 1 or 2, 3. gfx90a has no FP8 converts: the probe
    built for it has no such instruction and writes nothing."""
    import torch
    codes = np.arange(256, dtype=np.uint32)
    words = codes[0::4] | codes[1::4] << 8 | codes[2::4] << 16 | codes[3::4] << 24   # lane l: codes 4l .. 4l + 3
    inp = np.zeros(1024, dtype=np.uint32)
    inp[:64] = words
    lo, hi = probe(CVT_PK_FNUZ, inp, arg=0, out_init=0xDEADBEEF), probe(CVT_PK_FNUZ, inp, arg=1, out_init=0xDEADBEEF)
    if probe.arch == "gfx90a-emu":
        assert (lo == 0xDEADBEEF).all() and (hi == 0xDEADBEEF).all()
        return
    got = np.empty(256, dtype=np.uint32)
    got[0::4], got[1::4], got[2::4], got[3::4] = lo[:64], lo[64:128], hi[:64], hi[64:128]
    want = torch.from_numpy(codes.astype(np.uint8)).view(torch.float8_e4m3fnuz).float().numpy()
    nan = np.isnan(want)
    assert nan.tolist() == [c == 0x80 for c in range(256)]
    assert np.isnan(got.view(np.float32)[0x80]), "0x80 is a NaN"
    np.testing.assert_array_equal(got[~nan], want[~nan].view(np.uint32))
    # hand-worked: 0x01 the smallest subnormal 2^-10, 0x08 the smallest normal 2^-7, 0x40 one, 0x7F 240, 0x81 -2^-10
    f = got.view(np.float32)
    assert f[0x01] == 2.0**-10 and f[0x08] == 2.0**-7 and f[0x40] == 1.0 and f[0x7F] == 240.0 and f[0x81] == -2.0**-10
    assert got[0x00] == 0, "+0 (FNUZ has no -0)"


def test_perm_b32(probe):
    inp = np.zeros(1024, dtype=np.uint32)
    inp[:64], inp[64:128], inp[128:192] = 0x11223344, 0x55667788, 0x07060302
    inp[1], inp[65], inp[129] = 0x11223344, 0x8000F000, 0x0C0D0809
    inp[2], inp[66], inp[130] = 0xAABBCCDD, 0x01020304, 0x00010405
    out = probe(PERM, inp)[:64]
    assert out[0] == 0x11225566           # bytes 2,3 of src1 then 6,7 (= 2,3 of src0): bf16 packing
    assert out[1] == 0x00FFFFFF           # 9,8: sign of src1 bits 31 and 15; 13: 0xFF; 12: 0x00
    assert out[2] == 0x0403DDCC           # selectors 5,4,1,0 from byte 0 up: CC, DD, 03, 04


def test_readfirstlane_bpermute_swizzle(probe):
    inp = np.zeros(1024, dtype=np.uint32)
    inp[:64] = 7000 + LANES
    inp[64:128] = ((LANES * 7) % 64) * 4 + 256   # byte addresses; +256 wraps to the same lane
    assert (probe(READFIRST, inp)[:64] == 7000).all()
    np.testing.assert_array_equal(probe(BPERMUTE, inp)[:64], 7000 + (LANES * 7) % 64)
    np.testing.assert_array_equal(probe(SWIZZLE_XOR, inp)[:64], 7000 + (LANES ^ 16))
    np.testing.assert_array_equal(probe(SWIZZLE_QUAD, inp)[:64], 7000 + ((LANES & ~3) | (3 - (LANES & 3))))


def test_ballot_all_any(probe):
    inp = np.zeros(1024, dtype=np.uint32)
    inp[:64] = LANES * 3
    out = probe(VOTE, inp, arg=190)
    mask = sum(1 << int(lane) for lane in LANES if (lane * 3) & 1)
    assert (out[:64] == (mask & 0xFFFFFFFF)).all() and (out[64:128] == mask >> 32).all()
    assert (out[128:192] == 1).all()             # every lane below 190 (max 189), none equal
    assert (probe(VOTE, inp, arg=189)[128:192] == 2).all()   # lane 63 equals 189: any, not all
    assert (probe(VOTE, inp, arg=100)[128:192] == 0).all()   # not a multiple of 3, some above


def test_buffer_load_past_num_records_reads_zero(probe):
    inp = np.arange(1024, dtype=np.uint32) + 1
    out = probe(BUF_LOAD, inp, arg=402)[:256]
    # dword j at byte 4j is in range when 4j + 4 <= 402: j <= 99 (the 2-byte tail is not enough).
    want = np.where(np.arange(256) <= 99, inp[:256], 0)
    np.testing.assert_array_equal(out, want)


def test_buffer_load_ubyte(probe):
    """One byte zero-extended, at odd offsets: byte 7l in range when 7l + 1 <= num_records, else 0."""
    inp = (np.arange(1024, dtype=np.uint32) * 0x01020304 + 0x8081F0FF).astype(np.uint32)
    out = probe(BUF_UBYTE, inp, arg=300)[:64]
    raw = inp.view(np.uint8)
    want = np.where(7 * LANES + 1 <= 300, raw[7 * LANES], 0)
    assert (want[:43] != 0).any() and want[43:].sum() == 0  # lanes 0..42 in range (7 * 42 + 1 = 295)
    np.testing.assert_array_equal(out, want)


def test_buffer_store_past_num_records_is_dropped(probe):
    inp = np.arange(1024, dtype=np.uint32) + 1
    out = probe(BUF_STORE, inp, arg=100, out_init=0xDEAD)[:64]
    np.testing.assert_array_equal(out, np.where(LANES < 25, inp[:64], 0xDEAD))


def test_buffer_load_dword_lds(probe):
    inp = np.arange(1024, dtype=np.uint32) + 1
    out = probe(BUF_LDS, inp, arg=100)[:64]
    # lane l copies the dword at 4l + 4 (soffset 4) to LDS word l; then reads word 63 - l.
    src = np.where(LANES * 4 + 8 <= 100, inp[LANES + 1], 0)
    np.testing.assert_array_equal(out, src[63 - LANES])
