"""Loads and launches the sm_90a attention kernel through the CUDA driver (ctypes), for development and
GPU tests: NVRTC text -> cubin -> cuModuleLoadData, tensor maps from cuTensorMapEncodeTiled."""
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import nvrtc_build  # noqa: E402

BLOCK_M, BOX_D, THREADS, STAGES = 128, 64, 384, 2
ROUND = {"rtne": 0, "rtna": 1, "rtz": 2}


class TensorMap(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


class AttnParams(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("o", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_int64)] + \
               [(f"{t}_s{x}", ctypes.c_int64) for t in "qkvo" for x in "bsh"] + \
               [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("seq_q", ctypes.c_int),
                ("seq_k", ctypes.c_int), ("head_dim", ctypes.c_int), ("scale", ctypes.c_float),
                ("scale_log2", ctypes.c_float), ("tail_split", ctypes.c_int),
                ("reserved", ctypes.c_int)]


class Sm90Params(ctypes.Structure):
    _fields_ = [("tmap_q", TensorMap), ("tmap_k", TensorMap), ("tmap_v", TensorMap),
                ("a", AttnParams), ("num_m_blocks", ctypes.c_int), ("num_tiles", ctypes.c_int),
                ("pad", ctypes.c_char * 56)]


assert ctypes.sizeof(AttnParams) == 192 and ctypes.sizeof(Sm90Params) == 640


class Driver:
    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")

    def check(self, rc, what):
        if rc != 0:
            s = ctypes.c_char_p()
            self.cu.cuGetErrorString(rc, ctypes.byref(s))
            raise RuntimeError(f"{what} failed: {rc} {s.value}")

    def tensor_map(self, t, layout, rows):
        """4-D map over (d, s, h, b) of a bshd/bhsd tensor with a contiguous last dim."""
        if layout == "bshd":
            b, s, h, d = t.shape
            sb, ss, sh, _ = t.stride()
        else:
            b, h, s, d = t.shape
            sb, sh, ss, _ = t.stride()
        assert t.stride(-1) == 1 and d == 128
        dims = (ctypes.c_uint64 * 4)(d, s, h, b)
        strides = (ctypes.c_uint64 * 3)(ss * 2, sh * 2, sb * 2)
        box = (ctypes.c_uint32 * 4)(BOX_D, rows, 1, 1)
        estr = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
        m = TensorMap()
        rc = self.cu.cuTensorMapEncodeTiled(ctypes.byref(m), 9, 4, ctypes.c_void_p(t.data_ptr()),
                                            dims, strides, box, estr, 0, 3, 3, 0)
        self.check(rc, f"cuTensorMapEncodeTiled(shape={tuple(t.shape)}, strides={t.stride()})")
        return m, (sb, ss, sh)


class Sm90Kernel:
    def __init__(self, mode="rtne", defines=()):
        torch.cuda.init()
        torch.empty(1, device="cuda")
        self.drv = Driver()
        self.cubin, self.log = nvrtc_build.compile_sm90([f"RTC_ROUND={ROUND[mode]}", *defines])
        self.block_n = int(dict(d.split("=") for d in defines).get("SM90_BLOCK_N", 128))
        stages = int(dict(d.split("=") for d in defines).get("SM90_KV_STAGES", STAGES))
        self.smem = BLOCK_M * 256 + 2 * stages * self.block_n * 256 + 256 + 1024  # SM90_SMEM_BYTES
        self.mod = ctypes.c_void_p()
        self.drv.check(self.drv.cu.cuModuleLoadData(ctypes.byref(self.mod), self.cubin), "load")
        self.fn = ctypes.c_void_p()
        self.drv.check(self.drv.cu.cuModuleGetFunction(ctypes.byref(self.fn), self.mod,
                                                       b"attention_fwd_sm90"), "get function")
        self.drv.check(self.drv.cu.cuFuncSetAttribute(self.fn, 8, self.smem), "smem attribute")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    def prepare(self, q, k, v, layout, scale=None, lse=True, out=None):
        if layout == "bshd":
            B, Sq, H, D = q.shape
            Sk = k.shape[1]
        else:
            B, H, Sq, D = q.shape
            Sk = k.shape[2]
        scale = 1.0 / math.sqrt(D) if scale is None else scale
        o = torch.empty_like(q) if out is None else out
        o.view(torch.int16).fill_(-1)   # poison: 0xFFFF, a NaN nobody writes on purpose
        lse_t = torch.empty(B, H, Sq, device=q.device, dtype=torch.float32) if lse else None
        p = Sm90Params()
        p.tmap_q, qs = self.drv.tensor_map(q, layout, BLOCK_M)
        p.tmap_k, ks = self.drv.tensor_map(k, layout, self.block_n)
        p.tmap_v, vs = self.drv.tensor_map(v, layout, self.block_n)
        if layout == "bshd":
            os_ = (o.stride(0), o.stride(1), o.stride(2))
        else:
            os_ = (o.stride(0), o.stride(2), o.stride(1))
        a = p.a
        a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        a.lse = lse_t.data_ptr() if lse else None
        a.q_sb, a.q_ss, a.q_sh = qs
        a.k_sb, a.k_ss, a.k_sh = ks
        a.v_sb, a.v_ss, a.v_sh = vs
        a.o_sb, a.o_ss, a.o_sh = os_
        a.batch, a.heads, a.seq_q, a.seq_k, a.head_dim = B, H, Sq, Sk, D
        a.scale, a.scale_log2 = scale, scale * math.log2(math.e)
        p.num_m_blocks = (Sq + BLOCK_M - 1) // BLOCK_M
        p.num_tiles = p.num_m_blocks * H * B
        self._keep = (p, q, k, v)
        return p, o, lse_t

    def launch(self, p):
        args = (ctypes.c_void_p * 1)(ctypes.addressof(p))
        grid = min(p.num_tiles, self.sms)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self.drv.cu.cuLaunchKernel(self.fn, grid, 1, 1, THREADS, 1, 1, self.smem, stream,
                                        args, None)
        self.drv.check(rc, "cuLaunchKernel")

    def __call__(self, q, k, v, layout, scale=None, lse=True):
        p, o, lse_t = self.prepare(q, k, v, layout, scale, lse)
        self.launch(p)
        return o, lse_t
