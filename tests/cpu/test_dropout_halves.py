"""csrc_common/dropout.h states the keep rule twice: one half at a time (dropout_kept, the portable kernels' form and
the host twin's) and both halves of a draw word at once (KeepHalves, the sm_90a kernels' form). The two agree on every
threshold (0 .. 65536, the last keeping nothing) for the draws at and around it and random ones, built on the host
with g++ from the header itself. (The PRMT of KeepHalves::mask runs on the device only: tests/gpu/test_dropout_gpu.py
reads the sm_90a kernels' masks bit for bit against the host Philox.)"""
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

PROGRAM = r"""
#include "platform.h"
#include "dropout.h"
#include <cstdio>
static rtc_u32 x = 2463534242u;
static rtc_u32 next() { x ^= x << 13; x ^= x >> 17; x ^= x << 5; return x; }
int main() {
  long checked = 0, bad = 0;
  for (rtc_u32 thr = 0; thr <= 65536; ++thr) {
    const KeepHalves kh = KeepHalves::of(thr);
    const rtc_u32 t = thr & 0xFFFFu, below = (thr - 1) & 0xFFFFu, edges[] = {t, below, (t + 1) & 0xFFFFu, 0u, 0xFFFFu,
                                                                             0x7FFFu, 0x8000u};
    rtc_u32 draws[7 * 7 + 8];
    int n = 0;
    for (rtc_u32 lo : edges)
      for (rtc_u32 hi : edges) draws[n++] = lo | (hi << 16);
    for (int i = 0; i < 8; ++i) draws[n++] = next();
    for (int i = 0; i < n; ++i) {
      const rtc_u32 d = draws[i], m = kh.mask(d), k = kh.kept_bits(d);
      const Philox4 w{{d, 0u, 0u, 0u}};
      const bool lo = dropout_kept(w, 0, thr), hi = dropout_kept(w, 1, thr);
      const rtc_u32 want = (lo ? 0xFFFFu : 0u) | (hi ? 0xFFFF0000u : 0u);
      ++checked;
      if (m != want || ((k >> 15) & 1u) != lo || (k >> 31) != hi) {
        if (bad++ < 5) printf("threshold %u draw %08x: mask %08x kept_bits %08x, want %08x\n", thr, d, m, k, want);
      }
    }
  }
  printf("checked %ld bad %ld\n", checked, bad);
  return bad != 0;
}
"""


def test_keep_halves_is_dropout_kept_for_every_threshold(tmp_path):
    gxx = shutil.which("g++") or shutil.which("c++")
    assert gxx, "g++ (a dependency of the emulator, .ci/setup) not found"
    src, exe = tmp_path / "halves.cc", tmp_path / "halves"
    src.write_text(PROGRAM)
    include = f"-I{ROOT / 'csrc_common'}"
    subprocess.run([gxx, "-std=c++17", "-O1", "-Wall", "-Werror", include, str(src), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert "checked 3735609 bad 0" in run.stdout, run.stdout
