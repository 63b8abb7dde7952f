"""fp32 -> bf16 rounding (rtne, rtna, rtz) bit for bit: the Python reference and the C header bf16_round.h."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from rtc_testing import round_modes
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import manifest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# fp32 bits -> expected bf16 bits (rtne, rtna, rtz), worked out by hand from docs/numerics.md.
EDGE = [
    (0x00000000, 0x0000, 0x0000, 0x0000),  # +0
    (0x80000000, 0x8000, 0x8000, 0x8000),  # -0
    (0x3F800000, 0x3F80, 0x3F80, 0x3F80),  # 1.0, exact
    (0x3F808000, 0x3F80, 0x3F81, 0x3F80),  # tie, even upper half: rtne stays
    (0x3F818000, 0x3F82, 0x3F82, 0x3F81),  # tie, odd upper half: rtne goes up
    (0xBF808000, 0xBF80, 0xBF81, 0xBF80),  # negative ties: away from zero grows the magnitude
    (0xBF818000, 0xBF82, 0xBF82, 0xBF81),
    (0x3F807FFF, 0x3F80, 0x3F80, 0x3F80),  # just below a tie
    (0x3F808001, 0x3F81, 0x3F81, 0x3F80),  # just above a tie
    (0xC0490FDB, 0xC049, 0xC049, 0xC049),  # -pi
    (0x00000001, 0x0000, 0x0000, 0x0000),  # smallest subnormal
    (0x00008000, 0x0000, 0x0001, 0x0000),  # subnormal tie, even
    (0x00018000, 0x0002, 0x0002, 0x0001),  # subnormal tie, odd
    (0x80018000, 0x8002, 0x8002, 0x8001),
    (0x007FFFFF, 0x0080, 0x0080, 0x007F),  # largest subnormal rounds up into the normals
    (0x00800000, 0x0080, 0x0080, 0x0080),  # smallest normal
    (0x7F7F0000, 0x7F7F, 0x7F7F, 0x7F7F),  # largest finite bf16
    (0x7F7F7FFF, 0x7F7F, 0x7F7F, 0x7F7F),  # just below the overflow tie
    (0x7F7F8000, 0x7F80, 0x7F80, 0x7F7F),  # overflow tie: Inf, Inf, largest finite
    (0x7F7FFFFF, 0x7F80, 0x7F80, 0x7F7F),  # largest finite fp32
    (0xFF7FFFFF, 0xFF80, 0xFF80, 0xFF7F),
    (0xFF7F7FFF, 0xFF7F, 0xFF7F, 0xFF7F),
    (0x7F800000, 0x7F80, 0x7F80, 0x7F80),  # +Inf
    (0xFF800000, 0xFF80, 0xFF80, 0xFF80),  # -Inf
    (0x7FC00000, 0x7FFF, 0x7FFF, 0x7FFF),  # quiet NaN
    (0x7F800001, 0x7FFF, 0x7FFF, 0x7FFF),  # smallest payload: truncation would give Inf
    (0x7F80FFFF, 0x7FFF, 0x7FFF, 0x7FFF),
    (0x7FBFFFFF, 0x7FFF, 0x7FFF, 0x7FFF),  # signalling NaN
    (0x7FFFFFFF, 0x7FFF, 0x7FFF, 0x7FFF),  # the add would carry out of the sign
    (0xFFC00000, 0x7FFF, 0x7FFF, 0x7FFF),  # negative NaNs become the positive canonical one
    (0xFF800001, 0x7FFF, 0x7FFF, 0x7FFF),
    (0xFFFFFFFF, 0x7FFF, 0x7FFF, 0x7FFF),
]
# The modes the tests cover come from the manifest. EDGE's columns and the C harness's outputs are written by
# hand per mode, so they name their own order; test_every_mode_has_a_column keeps the two in step.
MODES = round_modes()
COLUMNS = ("rtne", "rtna", "rtz")
# RTC_ROUND's value of each mode, as the manifest passes it to the kernels.
DEFINES = dict(manifest.load().op("attention_fwd").axis("round_mode").values)
EDGE_BITS = np.array([e[0] for e in EDGE], dtype=np.uint32)


def _expected(mode):
    return np.array([e[1 + COLUMNS.index(mode)] for e in EDGE], dtype=np.uint16)


def test_every_mode_has_a_column():
    assert sorted(MODES) == sorted(COLUMNS), "a mode without hand-worked EDGE bits and harness output (or a stale one)"


@pytest.mark.parametrize("mode", MODES)
def test_numpy_reference_edge_cases(mode):
    got = ref.f32_to_bf16_bits_np(EDGE_BITS.view(np.float32), mode)
    bad = [(hex(b), hex(g), hex(w)) for b, g, w in zip(EDGE_BITS, got, _expected(mode)) if g != w]
    assert not bad, f"{mode}: (input, got, want) {bad}"


@pytest.mark.parametrize("mode", MODES)
def test_torch_reference_matches_numpy(mode):
    bits = np.concatenate([EDGE_BITS, _random_bits(200_000, seed=1)])
    x = torch.from_numpy(bits.view(np.float32).copy())
    got = ref.bf16_bits(ref.round_to_bf16(x, mode)).numpy()
    want = ref.f32_to_bf16_bits_np(bits.view(np.float32), mode).astype(np.int32)
    assert np.array_equal(got, want)


def test_rtne_matches_torch_cast_on_non_nan():
    bits = _random_bits(200_000, seed=2)
    x = torch.from_numpy(bits.view(np.float32).copy())
    x = x[~torch.isnan(x)]
    assert torch.equal(ref.bf16_bits(ref.round_to_bf16(x, "rtne")), ref.bf16_bits(x.to(torch.bfloat16)))


def test_bf16_to_f32_is_exact():
    b = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    f = ref.bf16_bits_to_f32_np(b)
    assert np.array_equal(f.view(np.uint32) >> 16, b.astype(np.uint32))
    assert np.array_equal(f.view(np.uint32) & 0xFFFF, np.zeros_like(b, dtype=np.uint32))


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="round_mode='rtn'"):
        ref.f32_to_bf16_bits_np(np.zeros(1, np.float32), "rtn")


def _random_bits(n, seed):
    """Uniform 32-bit patterns (about 0.4% NaN) plus values near ties and near bf16 boundaries."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    near_tie = (u & 0xFFFF0000) | (0x8000 + rng.integers(-2, 3, size=n)).astype(np.uint32)
    return np.where(rng.random(n) < 0.25, near_tie, u).astype(np.uint32)


HARNESS = r"""
#include <cstdio>
#include <vector>
#include "bf16_round.h"
// Reads fp32 bits from stdin; writes rtne, rtna, rtz, the RTC_ROUND-selected mode, then bf16->f32.
int main() {
  std::vector<unsigned int> in;
  unsigned int x;
  while (fread(&x, 4, 1, stdin) == 1) in.push_back(x);
  std::vector<unsigned short> out(in.size() * 4);
  std::vector<unsigned int> back(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const float f = rtc_bits_f32(in[i]);
    out[4 * i] = rtc_f32_to_bf16_rtne(f);
    out[4 * i + 1] = rtc_f32_to_bf16_rtna(f);
    out[4 * i + 2] = rtc_f32_to_bf16_rtz(f);
    out[4 * i + 3] = rtc_f32_to_bf16(f);
    back[i] = rtc_f32_bits(rtc_bf16_to_f32((unsigned short)(in[i] >> 16)));
  }
  fwrite(out.data(), 2, out.size(), stdout);
  fwrite(back.data(), 4, back.size(), stdout);
  return 0;
}
"""


# The pair forms (two fp32 -> one bf16x2 word, lo in bits 0..15). sm90 packs P with the raw ones and O with the
# canonical ones. On NVIDIA devices (sm_80 and later) raw rtne and rtz are one PTX cvt.rn / cvt.rz.bf16x2.f32, which
# cannot run on the host: what runs here is their host form (the single conversion of each half). The device path
# is covered on a Hopper GPU by tests/gpu/test_sm90.py: test_output_rounding_bit_exact (O, bit for bit in each mode,
# through the same raw pair P uses), test_special_values (every NaN 0x7FFF) and test_accuracy_and_lse (P in the mode,
# against the reference that rounds P and O). rtna's bias trick is the same arithmetic on both (a byte permute there).
PAIR_HARNESS = r"""
#include <cstdio>
#include <vector>
#include "bf16_round.h"
// Reads fp32 bits from stdin and packs (in[i], in[n-1-i]): the canonical rtne, rtna, rtz, RTC_ROUND-selected pairs,
// then the raw ones in the same order.
int main() {
  std::vector<unsigned int> in;
  unsigned int x;
  while (fread(&x, 4, 1, stdin) == 1) in.push_back(x);
  const size_t n = in.size();
  std::vector<unsigned int> out(n * 8);
  for (size_t i = 0; i < n; ++i) {
    const float lo = rtc_bits_f32(in[i]), hi = rtc_bits_f32(in[n - 1 - i]);
    unsigned int* o = &out[8 * i];
    o[0] = rtc_f32x2_to_bf16x2_rtne(lo, hi);
    o[1] = rtc_f32x2_to_bf16x2_rtna(lo, hi);
    o[2] = rtc_f32x2_to_bf16x2_rtz(lo, hi);
    o[3] = rtc_f32x2_to_bf16x2(lo, hi);
    o[4] = rtc_f32x2_to_bf16x2_raw_rtne(lo, hi);
    o[5] = rtc_f32x2_to_bf16x2_raw_rtna(lo, hi);
    o[6] = rtc_f32x2_to_bf16x2_raw_rtz(lo, hi);
    o[7] = rtc_f32x2_to_bf16x2_raw(lo, hi);
  }
  fwrite(out.data(), 4, out.size(), stdout);
  return 0;
}
"""


def _build_and_run(cxx, tmp_path, harness, flags, round_define, bits):
    src = tmp_path / "h.cpp"
    exe = tmp_path / "h"
    src.write_text(harness)
    inc = os.path.join(ROOT, "csrc_common")
    subprocess.run([cxx, *flags, f"-DRTC_ROUND={round_define}", "-I", inc, str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    return subprocess.run([str(exe)], input=bits.tobytes(), capture_output=True, check=True).stdout


@pytest.fixture(scope="module")
def cxx():
    c = shutil.which("g++") or shutil.which("c++")
    if c is None:
        pytest.skip("no host C++ compiler (g++ / c++)")
    return c


@pytest.mark.parametrize("flags", [["-O2"], ["-O2", "-ffast-math"]], ids=["O2", "O2-fast-math"])
@pytest.mark.parametrize("round_define", sorted(DEFINES.values()))
def test_c_header_matches_reference(cxx, tmp_path, flags, round_define):
    bits = np.concatenate([EDGE_BITS, _random_bits(1_000_000, seed=3)])
    stdout = _build_and_run(cxx, tmp_path, HARNESS, flags, round_define, bits)
    n = bits.size
    out = np.frombuffer(stdout[: 8 * n], dtype=np.uint16).reshape(n, 4)
    back = np.frombuffer(stdout[8 * n:], dtype=np.uint32)
    for mode in MODES:
        col = COLUMNS.index(mode)
        want = ref.f32_to_bf16_bits_np(bits.view(np.float32), mode)
        bad = np.nonzero(out[:, col] != want)[0]
        assert bad.size == 0, f"{mode} {flags}: first mismatch input {bits[bad[0]]:#010x} " \
                              f"got {out[bad[0], col]:#06x} want {want[bad[0]]:#06x}"
        assert np.array_equal(out[: len(EDGE), col], _expected(mode))
    selected = next(m for m, n in DEFINES.items() if n == round_define)
    assert np.array_equal(out[:, 3], out[:, COLUMNS.index(selected)]), f"RTC_ROUND={round_define} is not {selected}"
    assert np.array_equal(back, bits & 0xFFFF0000), "bf16 -> f32 is not exact"


@pytest.mark.parametrize("flags", [["-O2"], ["-O2", "-ffast-math"]], ids=["O2", "O2-fast-math"])
@pytest.mark.parametrize("round_define", sorted(DEFINES.values()))
def test_c_header_pairs_match_reference(cxx, tmp_path, flags, round_define):
    """Canonical pairs: both halves bit for bit the single conversion, NaN included. Raw pairs: the same bits for
    every non-NaN half (a NaN half is left unspecified); the halves do not interact."""
    # The EDGE patterns twice, in two orders, so that every hand-worked pattern meets others, NaNs included.
    bits = np.concatenate([EDGE_BITS, EDGE_BITS[::-1], EDGE_BITS[5:], _random_bits(1_000_000, seed=4)])
    stdout = _build_and_run(cxx, tmp_path, PAIR_HARNESS, flags, round_define, bits)
    out = np.frombuffer(stdout, dtype=np.uint32).reshape(bits.size, 8)
    lo, hi = bits, bits[::-1]
    lo_nan = (lo & 0x7FFFFFFF) > 0x7F800000
    hi_nan = (hi & 0x7FFFFFFF) > 0x7F800000
    for mode in MODES:
        col = COLUMNS.index(mode)
        want_lo = ref.f32_to_bf16_bits_np(lo.view(np.float32), mode).astype(np.uint32)
        want_hi = ref.f32_to_bf16_bits_np(hi.view(np.float32), mode).astype(np.uint32)
        want = want_lo | (want_hi << 16)
        bad = np.nonzero(out[:, col] != want)[0]
        assert bad.size == 0, f"{mode} {flags}: first mismatch ({lo[bad[0]]:#010x}, {hi[bad[0]]:#010x}) " \
                              f"got {out[bad[0], col]:#010x} want {want[bad[0]]:#010x}"
        raw = out[:, 4 + col]
        assert np.array_equal((raw & 0xFFFF)[~lo_nan], want_lo[~lo_nan]), f"{mode} {flags}: raw low half"
        assert np.array_equal((raw >> 16)[~hi_nan], want_hi[~hi_nan]), f"{mode} {flags}: raw high half"
    selected = COLUMNS.index(next(m for m, n in DEFINES.items() if n == round_define))
    assert np.array_equal(out[:, 3], out[:, selected]), f"RTC_ROUND={round_define}: canonical pair"
    assert np.array_equal(out[:, 7], out[:, 4 + selected]), f"RTC_ROUND={round_define}: raw pair"


# ---- fp16: round to nearest even only (csrc_common/fp16_round.h; docs/numerics.md, fp16) ------------------------
# fp32 bits -> expected fp16 bits, worked out by hand: numpy's float16 cast is the reference (it rounds to nearest
# even, keeps subnormals, gives +-Inf from 65520 on) except that every NaN becomes the canonical 0x7E00.
FP16_EDGE = [
    (0x00000000, 0x0000),  # +0
    (0x80000000, 0x8000),  # -0
    (0x3F800000, 0x3C00),  # 1.0, exact
    (0x3F801000, 0x3C00),  # 1 + 2^-11: tie, even mantissa stays
    (0x3F803000, 0x3C02),  # 1 + 3 * 2^-11: tie, odd mantissa goes up
    (0xBF801000, 0xBC00),  # negative tie: to even as well (no bias away from zero)
    (0x3F800FFF, 0x3C00),  # just below a tie
    (0x3F801001, 0x3C01),  # just above a tie
    (0x40490FDB, 0x4248),  # pi -> 3.140625
    (0x477FE000, 0x7BFF),  # 65504, the largest finite fp16
    (0x477FEFFF, 0x7BFF),  # just below 65520: stays finite
    (0x477FF000, 0x7C00),  # 65520, the overflow tie: +Inf (0x7BFF is odd)
    (0xC77FF000, 0xFC00),  # -65520: -Inf
    (0x47800000, 0x7C00),  # 65536
    (0x7F7FFFFF, 0x7C00),  # the largest finite fp32
    (0x7F800000, 0x7C00),  # +Inf
    (0xFF800000, 0xFC00),  # -Inf
    (0x38800000, 0x0400),  # 2^-14, the smallest normal fp16
    (0x387FC000, 0x03FF),  # 1023 * 2^-24, the largest subnormal
    (0x387FE000, 0x0400),  # 2^-14 - 2^-25: a subnormal tie rounding up into the normals
    (0x33800000, 0x0001),  # 2^-24, the smallest subnormal
    (0x33000000, 0x0000),  # 2^-25: the tie below it goes to the even 0
    (0x33000001, 0x0001),  # just above it
    (0xB3000000, 0x8000),  # -2^-25: -0
    (0x33C00000, 0x0002),  # 3 * 2^-25: tie between 1 and 2 subnormal units -> 2
    (0x34200000, 0x0002),  # 5 * 2^-25: tie between 2 and 3 -> 2
    (0x32800000, 0x0000),  # 2^-26
    (0x00000001, 0x0000),  # the smallest fp32 subnormal
    (0x807FFFFF, 0x8000),  # the largest negative fp32 subnormal
    (0x7FC00000, 0x7E00),  # quiet NaN
    (0x7F800001, 0x7E00),  # the smallest payload: dropping the low bits would give Inf
    (0x7FBFFFFF, 0x7E00),  # signalling NaN
    (0x7FFFFFFF, 0x7E00),
    (0xFFC00000, 0x7E00),  # negative NaNs become the positive canonical one
    (0xFF800001, 0x7E00),
]
FP16_EDGE_BITS = np.array([e[0] for e in FP16_EDGE], dtype=np.uint32)
FP16_EDGE_WANT = np.array([e[1] for e in FP16_EDGE], dtype=np.uint16)


def _fp16_random_bits(n, seed):
    """Uniform 32-bit patterns plus values spread over fp16's range (subnormals to overflow) and near its ties."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    spread = (rng.standard_normal(n) * np.exp2(rng.uniform(-27, 17, n))).astype(np.float32).view(np.uint32)
    near_tie = (spread & 0xFFFFE000) | (0x1000 + rng.integers(-2, 3, size=n)).astype(np.uint32)
    pick = rng.random(n)
    return np.where(pick < 0.3, u, np.where(pick < 0.65, spread, near_tie)).astype(np.uint32)


def test_fp16_numpy_reference_edge_cases():
    got = ref.f32_to_fp16_bits_np(FP16_EDGE_BITS.view(np.float32))
    bad = [(hex(b), hex(g), hex(w)) for b, g, w in zip(FP16_EDGE_BITS, got, FP16_EDGE_WANT) if g != w]
    assert not bad, f"(input, got, want) {bad}"


def test_fp16_torch_reference_matches_numpy_and_torch_cast():
    bits = np.concatenate([FP16_EDGE_BITS, _fp16_random_bits(400_000, seed=5)])
    x = torch.from_numpy(bits.view(np.float32).copy())
    got = ref.bf16_bits(ref.round_to_fp16(x))
    want = ref.f32_to_fp16_bits_np(bits.view(np.float32)).astype(np.int32)
    assert np.array_equal(got.numpy(), want)
    assert np.array_equal(got[: len(FP16_EDGE)].numpy(), FP16_EDGE_WANT.astype(np.int32))
    fin = ~torch.isnan(x)  # torch's own cast (nearest even) keeps NaN payloads; ours makes them 0x7E00
    assert torch.equal(got[fin], ref.bf16_bits(x[fin].to(torch.float16)))


def test_round_to_picks_the_dtype_rounding():
    x = torch.tensor([1 + 2**-9 + 2**-11], dtype=torch.float32)   # a bf16 non-tie, an fp16 tie (to even: down)
    assert ref.round_to(x, torch.float16, "rtz").item() == 1 + 2**-9  # fp16: nearest even, whatever the mode
    assert ref.round_to(x, torch.bfloat16, "rtz").item() == 1.0       # bf16: the mode
    with pytest.raises(ValueError, match="round_mode='rtn'"):
        ref.round_to(x, torch.float16, "rtn")


FP16_HARNESS = r"""
#include <cstdio>
#include <vector>
#include "fp16_round.h"
// Reads fp32 bits from stdin. Writes rtc_f32_to_fp16_rtne of each; the pair (in[i], in[n-1-i]); then, for every
// fp16 pattern h, the fp32 bits of rtc_fp16_to_f32(h), of rtc_fp16_lo_f32 and of rtc_fp16_hi_f32 of the word
// h | (65535 - h) << 16.
int main() {
  std::vector<unsigned int> in;
  unsigned int x;
  while (fread(&x, 4, 1, stdin) == 1) in.push_back(x);
  const size_t n = in.size();
  std::vector<unsigned short> one(n);
  std::vector<unsigned int> pair(n), back(3 * 65536);
  for (size_t i = 0; i < n; ++i) {
    one[i] = rtc_f32_to_fp16_rtne(rtc_bits_f32(in[i]));
    pair[i] = rtc_f32x2_to_fp16x2_rtne(rtc_bits_f32(in[i]), rtc_bits_f32(in[n - 1 - i]));
  }
  for (unsigned int h = 0; h < 65536; ++h) {
    const unsigned int w = h | ((65535u - h) << 16);
    back[3 * h] = rtc_f32_bits(rtc_fp16_to_f32((unsigned short)h));
    back[3 * h + 1] = rtc_f32_bits(rtc_fp16_lo_f32(w));
    back[3 * h + 2] = rtc_f32_bits(rtc_fp16_hi_f32(w));
  }
  fwrite(one.data(), 2, n, stdout);
  fwrite(pair.data(), 4, n, stdout);
  fwrite(back.data(), 4, back.size(), stdout);
  return 0;
}
"""


@pytest.mark.parametrize("flags", [["-O2"], ["-O2", "-ffast-math"]], ids=["O2", "O2-fast-math"])
def test_fp16_c_header_matches_reference(cxx, tmp_path, flags):
    """fp16_round.h bit for bit: fp32 -> fp16 against numpy's cast (NaN: 0x7E00) on the hand-worked patterns and a
    large random sample, the pair form's halves, and fp16 -> fp32 exact for all 65536 patterns (NaN payloads
    included, as numpy widens them). -ffast-math (which also sets flush-to-zero) changes nothing."""
    bits = np.concatenate([FP16_EDGE_BITS, FP16_EDGE_BITS[::-1], _fp16_random_bits(1_000_000, seed=6)])
    stdout = _build_and_run(cxx, tmp_path, FP16_HARNESS, flags, 0, bits)
    n = bits.size
    one = np.frombuffer(stdout[: 2 * n], dtype=np.uint16)
    pair = np.frombuffer(stdout[2 * n: 6 * n], dtype=np.uint32)
    back = np.frombuffer(stdout[6 * n:], dtype=np.uint32).reshape(65536, 3)
    want = ref.f32_to_fp16_bits_np(bits.view(np.float32))
    bad = np.nonzero(one != want)[0]
    assert bad.size == 0, f"{flags}: first mismatch input {bits[bad[0]]:#010x} got {one[bad[0]]:#06x} " \
                          f"want {want[bad[0]]:#06x}"
    assert np.array_equal(one[: len(FP16_EDGE)], FP16_EDGE_WANT)
    assert np.array_equal(pair, want.astype(np.uint32) | (want[::-1].astype(np.uint32) << 16)), "pair halves"
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    exact = h.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(back[:, 0], exact), "fp16 -> f32 is not exact"
    assert np.array_equal(back[:, 1], exact) and np.array_equal(back[:, 2], exact[::-1]), "lo / hi halves"
