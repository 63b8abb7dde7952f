"""Exhaustive device check that ex2.approx.ftz(x) >= 1 for every fp32 x in [+0, 1]: the sm90 softmax relies
on it to give the row-max element p = 1 exactly in every rounding mode (sm90/softmax.h, scale_max).
The probe kernel (sm90::ex2 of csrc_common/ptx_sm90.h) is built and launched by the product's runtime, as a
kernel outside the manifest. `--build` only compiles it (no GPU needed)."""
import struct
import sys

from rtcattn.runtime import dispatch, manifest, paths

SRC = r'''
#include "ptx_sm90.h"
struct ProbeArgs { unsigned n; unsigned* bad; };
extern "C" __global__ void ex2_probe(ProbeArgs a) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += gridDim.x * blockDim.x) {
    const float y = sm90::ex2(__uint_as_float(i));
    if (!(y >= 1.0f)) atomicAdd(a.bad, 1u);
  }
}
'''


def build():
    headers = manifest.read_headers(paths.csrc_common_dir(), False)
    flags = manifest.load().arch_options["sm_90a"]["flags"]
    return dispatch.lib().build("lab", "ex2_probe", "sm_90a", "ex2_probe", ("ex2_probe.cu", SRC), headers, flags,
                                compiler="nvrtc", package_version=dispatch.package_version())


def count_below_one(last_bits=0x3F800000):
    """Number of x with bits in [0, last_bits] whose ex2 is below 1 (or NaN)."""
    import torch
    program = build().program
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    params = struct.pack("<I4xQ", last_bits + 1, bad.data_ptr())
    dispatch.lib().launch(program, "cuda", torch.cuda.current_device(), (132 * 8, 1, 1), (256, 1, 1), params,
                          stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return int(bad.item())


if __name__ == "__main__":
    if "--build" in sys.argv:
        res = build()
        print(f"ex2_probe built: {len(res.code())} bytes ({res.origin})")
        sys.exit(0)
    n = count_below_one()
    print(f"{'ok ' if n == 0 else 'BAD'} ex2.approx(x) >= 1 for all x in [0, 1]: {n} below")
    sys.exit(0 if n == 0 else 1)
