"""Exhaustive device check that ex2.approx.ftz(x) >= 1 for every fp32 x in [+0, 1]: the softmax relies
on it to give the row-max element p = 1 exactly in every rounding mode (softmax.h, scale_max)."""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import nvrtc_build  # noqa: E402
from sm90_driver import Driver  # noqa: E402

SRC = rb'''
#include "sm90/ptx.h"
extern "C" __global__ void ex2_probe(unsigned n, unsigned* bad) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float y = sm90::ex2(__uint_as_float(i));
    if (!(y >= 1.0f)) atomicAdd(bad, 1u);
  }
}
'''


def count_below_one(last_bits=0x3F800000):
    """Number of x with bits in [0, last_bits] whose ex2 is below 1 (or NaN)."""
    torch.empty(1, device="cuda")
    drv = Driver()
    cubin, _ = nvrtc_build.compile_sm90([], src=SRC, name=b"ex2_probe.cu")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    drv.check(drv.cu.cuModuleLoadData(ctypes.byref(mod), cubin), "load probe")
    drv.check(drv.cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"ex2_probe"), "get probe")
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    n = ctypes.c_uint32(last_bits + 1)
    ptr = ctypes.c_void_p(bad.data_ptr())
    args = (ctypes.c_void_p * 2)(ctypes.addressof(n), ctypes.addressof(ptr))
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    drv.check(drv.cu.cuLaunchKernel(fn, 132 * 8, 1, 1, 256, 1, 1, 0, stream, args, None), "launch")
    torch.cuda.synchronize()
    return int(bad.item())


if __name__ == "__main__":
    n = count_below_one()
    print(f"{'ok ' if n == 0 else 'BAD'} ex2.approx(x) >= 1 for all x in [0, 1]: {n} below")
    sys.exit(0 if n == 0 else 1)
