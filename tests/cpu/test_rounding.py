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
