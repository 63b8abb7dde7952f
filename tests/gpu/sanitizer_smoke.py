"""A few small calls of every CUDA kernel, for compute-sanitizer (memcheck, racecheck, synccheck).

Run: compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/sanitizer_smoke.py
Shapes are small (the sanitizer slows kernels down 10-100x) but cover every tail: Sq, Sk of 1, 17, 300.
"""
import os

import torch

import rtcattn
from rtcattn.ops import attention_fwd
from rtcattn.runtime import manifest

# Every round mode the manifest declares (run as a script, so not through the tests' helpers).
MODES = manifest.load().op("attention_fwd").axis_values("round_mode")
BF16, F16 = torch.bfloat16, torch.float16


def main():
    gen = torch.Generator(device="cuda").manual_seed(11)
    ran = set()
    # sm90 at its buckets (72, 40 and 200 below their buckets 96, 32 and 256: zero-filled columns, nothing stored past
    # D); 64 and 40 take three consumer warpgroups, and with 72 the open variant's wider block (sm90/params.h).
    for d, kernel, dt in ((128, "sm90", BF16), (72, "sm90", F16), (200, "sm90", BF16), (64, "sm90", BF16),
                          (40, "sm90", F16), (64, "baseline", BF16),
                          (96, "baseline", BF16), (128, "baseline", BF16)):
        os.environ["RTCATTN_KERNEL"] = kernel
        for mode in MODES if dt == BF16 else ("rtne",):
            for sq, sk in ((1, 1), (17, 300), (300, 17)):
                q = torch.randn(2, sq, 3, d, generator=gen, device="cuda").to(dt)
                k, v = (torch.randn(2, sk, 3, d, generator=gen, device="cuda").to(dt) for _ in range(2))
                out, lse = rtcattn.forward(q, k, v, round_mode=mode, return_lse=True)
                torch.cuda.synchronize()
                assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
                ran.add(attention_fwd.selection(q, k, v, round_mode=mode).kernel.name)
            # The window variants (the masked sm90 one takes its tiles from a counter through a shared
            # ring), with GQA and with rows and whole tiles that see no key (Sq > Sk, causal).
            for sq, sk, window in ((300, 700, (-1, 0)), (700, 300, (-1, 0)), (260, 260, (17, 3))):
                q = torch.randn(1, sq, 4, d, generator=gen, device="cuda").to(dt)
                k, v = (torch.randn(1, sk, 2, d, generator=gen, device="cuda").to(dt) for _ in range(2))
                out, lse = rtcattn.forward(q, k, v, round_mode=mode, return_lse=True, window_size=window)
                torch.cuda.synchronize()
                assert torch.isfinite(out.float()).all()
                ran.add(attention_fwd.selection(q, k, v, round_mode=mode, window=window).variant.name)
    ran |= packed(gen)
    ran |= decode(gen)
    ran |= backward(gen)
    print("sanitizer smoke ran kernels:", sorted(ran))


def packed(gen) -> set:
    """Packed sequences and paged KV (the sm90 schedule, the producer warp's page gather, zeroed V tails), with
    lengths 0, 1 and past one tile, and with bad metadata: decreasing / out-of-range cu_seqlens, page ids and
    seqused_k out of range must not touch memory outside the tensors."""
    ran = set()
    lens = [1, 0, 130, 17]
    cu = torch.tensor([0, 1, 1, 131, 148], dtype=torch.int32, device="cuda")
    bad_cu = torch.tensor([0, 140, 20, 10_000, -7], dtype=torch.int32, device="cuda")
    used = torch.tensor([148, 0, 1 << 30, 17], dtype=torch.int32, device="cuda")
    # sm90's 64 bucket (96-row blocks: 6 page boxes each) in fp16, and its 256 bucket (80 rows: 20 boxes of 16 x 64).
    for d, kernel, dt in ((128, "sm90", BF16), (40, "sm90", F16), (256, "sm90", BF16), (64, "baseline", BF16)):
        os.environ["RTCATTN_KERNEL"] = kernel
        q = torch.randn(148, 4, d, generator=gen, device="cuda").to(dt)
        k, v = (torch.randn(148, 2, d, generator=gen, device="cuda").to(dt) for _ in range(2))
        pages = [torch.randn(12, 16, 2, d, generator=gen, device="cuda").to(dt) for _ in range(2)]
        table = torch.randint(0, 12, (4, 10), generator=gen, device="cuda", dtype=torch.int32)
        bad_table = table.clone()
        bad_table[2, :3] = torch.tensor([-1, 12, 2**31 - 1], dtype=torch.int32)
        for window in ((-1, -1), (-1, 0)):
            for cq, ck, kk, vv, bt in ((cu, cu, k, v, None), (bad_cu, bad_cu, k, v, None),
                                       (cu, cu, *pages, table), (cu, cu, *pages, bad_table)):
                rtcattn.forward_varlen(q, kk, vv, cq, ck, max(lens), max(lens), return_lse=True,
                                       window_size=window, block_table=bt)
                torch.cuda.synchronize()
                ran.add(attention_fwd.selection_varlen(q, kk, vv, cq, ck, max(lens), max(lens), window=window,
                                     block_table=bt).variant.name)
            # seqused_k past max_seqlen_k and the rows left, 0, and from out-of-range first rows / page ids.
            for kk, vv, bt, ck in ((k, v, None, bad_cu), (*pages, bad_table, cu)):
                torch.ops.rtcattn.fwd_varlen(q, kk, vv, cu, ck, max(lens), max(lens), "rtne", None, True, *window, bt,
                                             used)
                torch.cuda.synchronize()
    return ran


def decode(gen) -> set:
    """The sm90 decode kernel: dense and packed decode calls (1 to 16 query rows, GQA packing with 1, 2 and 4 row
    tiles), split (partials and the merge stage) and not, paged with bad page ids, bad cu_seqlens."""
    from rtcattn.runtime import dispatch
    ran = set()
    os.environ.pop("RTCATTN_KERNEL", None)
    for d, dt, hq, hk, sq in ((128, BF16, 8, 2, 1), (64, F16, 32, 1, 1), (256, BF16, 16, 2, 16), (40, F16, 8, 8, 3)):
        for splits in (0, 3):
            with dispatch.pinned(kernel="sm90_decode", tail_split=splits):
                for sk, window in ((1, (-1, -1)), (17, (-1, 0)), (300, (5, 0))):
                    q = torch.randn(2, sq, hq, d, generator=gen, device="cuda").to(dt)
                    k, v = (torch.randn(2, sk, hk, d, generator=gen, device="cuda").to(dt) for _ in range(2))
                    rtcattn.forward(q, k, v, return_lse=True, window_size=window)
                    torch.cuda.synchronize()
                    ran.add(attention_fwd.selection(q, k, v, window=window).variant.name)
                lens = [1, 0, 130, 17]
                cu_q = torch.tensor([0, 1, 1, 2, 3], dtype=torch.int32, device="cuda")
                cu_k = torch.tensor([0, 1, 1, 131, 148], dtype=torch.int32, device="cuda")
                bad_k = torch.tensor([0, 140, 20, 10_000, -7], dtype=torch.int32, device="cuda")
                q = torch.randn(3, hq, d, generator=gen, device="cuda").to(dt)
                k, v = (torch.randn(148, hk, d, generator=gen, device="cuda").to(dt) for _ in range(2))
                pages = [torch.randn(12, 16, hk, d, generator=gen, device="cuda").to(dt) for _ in range(2)]
                table = torch.randint(0, 12, (4, 10), generator=gen, device="cuda", dtype=torch.int32)
                table[2, :3] = torch.tensor([-1, 12, 2**31 - 1], dtype=torch.int32)
                for kk, vv, ck, bt in ((k, v, cu_k, None), (k, v, bad_k, None), (*pages, cu_k, table)):
                    rtcattn.forward_varlen(q, kk, vv, cu_q, ck, 1, max(lens), return_lse=True, window_size=(-1, 0),
                                           block_table=bt)
                    torch.cuda.synchronize()
    return ran | decode_quantized(gen)


def decode_quantized(gen) -> set:
    """The sm90 decode kernel over an FP8 E4M3 cache (byte tensor maps, the expansion in registers): packed and
    paged, split and not, with bad cu_seqlens and page ids; and over an FP4 cache (its scales gathered by the threads
    through the block table), paged, with bad page ids."""
    from rtcattn.ops.attention_fwd import kvquant, validate
    from rtcattn.runtime import dispatch
    ran = set()
    cu_q = torch.tensor([0, 1, 1, 3, 4], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 1, 1, 131, 148], dtype=torch.int32, device="cuda")
    bad_k = torch.tensor([0, 140, 20, 10_000, -7], dtype=torch.int32, device="cuda")
    one = torch.ones((), device="cuda")
    for d, dt, hq, hk in ((128, BF16, 8, 2), (64, F16, 32, 1)):
        q = torch.randn(4, hq, d, generator=gen, device="cuda").to(dt)
        k, v = (kvquant.quantize_fp8(torch.randn(148, hk, d, generator=gen, device="cuda"), one) for _ in range(2))
        pages = [kvquant.quantize_fp8(torch.randn(12, 16, hk, d, generator=gen, device="cuda"), one) for _ in range(2)]
        table = torch.randint(0, 12, (4, 10), generator=gen, device="cuda", dtype=torch.int32)
        table[2, :3] = torch.tensor([-1, 12, 2**31 - 1], dtype=torch.int32)
        descales = dict(k_descale=torch.full((4, hk), 0.5, device="cuda"),
                        v_descale=torch.full((1,), 2.0, device="cuda"))
        for splits in (0, 3):
            with dispatch.pinned(kernel="sm90_decode", tail_split=splits):
                for kk, vv, ck, bt in ((k, v, cu_k, None), (k, v, bad_k, None), (*pages, cu_k, table)):
                    rtcattn.forward_varlen(q, kk, vv, cu_q, ck, 2, 147, return_lse=True, window_size=(-1, 0),
                                           block_table=bt, **descales)
                    torch.cuda.synchronize()
                    quant = validate.KvQuant(k_descale=descales["k_descale"], v_descale=descales["v_descale"])
                    ran.add(attention_fwd.selection_varlen(q, kk, vv, cu_q, ck, 2, 147, window=(-1, 0), block_table=bt,
                                                           quant=quant).variant.name)
        (kp, ks), (vp, vs) = (kvquant.quantize_fp4(torch.randn(12, 16, hk, d, generator=gen, device="cuda").to(dt))
                              for _ in range(2))
        kp, vp = (t.permute(0, 2, 1, 3).contiguous() for t in (kp, vp))  # [num_blocks, Hk, page, D / 2]
        fp4 = dict(kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs)
        for splits in (0, 3):
            with dispatch.pinned(kernel="sm90_decode", tail_split=splits):
                for bt in (table.abs() % 12, table):
                    rtcattn.forward_varlen(q, kp, vp, cu_q, cu_k, 2, 147, return_lse=True, window_size=(-1, 0),
                                           block_table=bt, **fp4)
                    torch.cuda.synchronize()
                    quant = validate.KvQuant("fp4_e2m1", k_scale=ks, v_scale=vs)
                    ran.add(attention_fwd.selection_varlen(q, kp, vp, cu_q, cu_k, 2, 147, window=(-1, 0),
                                                           block_table=bt, quant=quant).variant.name)
    return ran


def backward(gen) -> set:
    """The backward (attention_bwd: the sm90 kernel on sm_90a, its three stages; up to head dim 128 the fused dQ, or
    with deterministic the DQ stage) through autograd: dense with GQA, rows that see no key and Sq, Sk of 1, 17, 300,
    D 64 (both dQ paths) and 200 (the 256 bucket's split key blocks); packed with lengths 0, 1, past a tile, and with
    decreasing / out-of-range cu_seqlens (nothing outside the tensors), both dQ paths."""
    ran = set()
    os.environ.pop("RTCATTN_KERNEL", None)
    for d, dt, det in ((64, BF16, False), (64, F16, True), (200, F16, False)):
        for sq, sk, window in ((1, 1, (-1, -1)), (17, 300, (-1, 0)), (300, 17, (-1, 0)), (33, 60, (5, 2))):
            q = torch.randn(2, sq, 4, d, generator=gen, device="cuda").to(dt).requires_grad_()
            k, v = (torch.randn(2, sk, 2, d, generator=gen, device="cuda").to(dt).requires_grad_() for _ in range(2))
            rtcattn.forward(q, k, v, window_size=window, deterministic=det).float().square().sum().backward()
            torch.cuda.synchronize()
            assert all(torch.isfinite(t.grad.float()).all() for t in (q, k, v))
    cu = torch.tensor([0, 1, 1, 131, 148], dtype=torch.int32, device="cuda")
    bad_cu = torch.tensor([0, 140, 20, 10_000, -7], dtype=torch.int32, device="cuda")
    for cq, det in ((cu, False), (bad_cu, False), (bad_cu, True)):
        q = torch.randn(148, 4, 64, generator=gen, device="cuda").to(BF16).requires_grad_()
        k, v = (torch.randn(148, 2, 64, generator=gen, device="cuda").to(BF16).requires_grad_() for _ in range(2))
        rtcattn.forward_varlen(q, k, v, cq, cq, 130, 130, causal=True, deterministic=det).float().sum().backward()
        torch.cuda.synchronize()
    from rtcattn.ops.attention_bwd import selection
    out, lse = rtcattn.forward(q[None, :20], k[None, :20], v[None, :20], return_lse=True)
    ran.add(selection(out, q[None, :20], k[None, :20], v[None, :20], out, lse).variant.name)
    return ran


if __name__ == "__main__":
    main()
