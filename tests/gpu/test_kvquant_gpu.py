"""Quantized KV caches (FP8 E4M3 with descales, FP4 E2M1 + E8M0) on a GPU: the baseline kernel serves these calls
(more than 16 query rows, or FNUZ / FP4 on sm_90a; dispatch's pick is asserted; the decode kernels' own calls are in
test_sm90_decode_kvquant_gpu.py), through forward_varlen and flash_attn_with_kvcache,
against the fp64 reference over the exactly dequantized cache with the accuracy rule of the other tests
(err <= 2 err(R) + 1e-5, R on the dequantized cache; normwise bound; LSE within 1e-4); NaN codes reach the rows that
read them; the append writes quantize_kv's bytes on the device and nothing else."""
import pytest
import torch

import rtcattn
import varlen_suite as vs
from numerics_suite import NORMWISE_BOUND
from rtcattn.ops.attention_fwd import kvquant, reference as ref, validate

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _hnd(t):
    return t.permute(0, 2, 1, 3).contiguous()


def _check(out, lse, q, kdq, vdq, cu_q, cu_k, table, window, kd, vd, tag):
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    args = (q.cpu(), kdq.cpu(), vdq.cpu(), cu_q.cpu(), cu_k.cpu())
    o64, lse64 = ref.reference_varlen(*args, None, None, window, cpu(table), cpu(kd), cpu(vd))
    r = ref.reference_varlen(*args, "rtne", None, window, cpu(table), cpu(kd), cpu(vd))
    err, nrm = ref.errors(out.cpu(), o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all(), tag
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    assert nrm < NORMWISE_BOUND[q.dtype], f"normwise error {nrm:.3g}: {tag}"
    assert bool(ref.lse_close(lse.cpu(), lse64).all()), tag


# (kv_dtype, paged, (Hq, Hk), lens_q, lens_k, window, per-(b, h) descales, dtype): decode-style and prefill-style rows.
CASES = [
    ("fp8_e4m3", True, (8, 2), [1, 40, 3], [300, 129, 17], (-1, 0), True, torch.bfloat16),
    ("fp8_e4m3", False, (4, 4), [17, 1], [64, 1000], (-1, -1), False, torch.float16),
    ("fp8_e4m3fnuz", True, (4, 1), [1, 20], [77, 256], (30, 0), True, torch.bfloat16),
    ("fp4_e2m1", True, (8, 2), [1, 40, 3], [300, 129, 17], (-1, 0), False, torch.bfloat16),
    ("fp4_e2m1", True, (2, 1), [19, 1], [64, 21], (10, 3), False, torch.float16),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{'paged' if c[1] else 'varlen'}-{c[7]}" for c in CASES])
def test_quantized_cache_on_the_device(case):
    kv_dtype, paged, (hq, hk), lens_q, lens_k, window, per_head, dtype = case
    b = vs.make_batch(lens_q, lens_k, hq, hk, 128, DEV, seed=hq + len(lens_q), dtype=dtype)
    if paged:
        b = vs.to_paged(b, 16, seed=hk)
    kd = vd = None
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(b.k), kvquant.quantize_fp4(b.v)
        k, v = _hnd(kp), _hnd(vp)
        kw = dict(kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs_)
        kdq, vdq = ref.dequantize_cache(k, "fp4_e2m1", ks), ref.dequantize_cache(v, "fp4_e2m1", vs_)
    else:
        fmt = kvquant.FP8_DTYPES[kv_dtype]
        k, v = (kvquant.quantize_fp8(t, torch.ones((), device=DEV), fmt) for t in (b.k, b.v))
        gen = torch.Generator().manual_seed(hk)
        shape = (len(lens_q), hk) if per_head else (1,)
        kd, vd = ((torch.rand(shape, generator=gen) * 1.75 + 0.25).to(DEV) for _ in range(2))
        kw = dict(k_descale=kd, v_descale=vd)
        kdq, vdq = ref.dequantize_cache(k), ref.dequantize_cache(v)
    assert k.is_cuda and v.is_cuda
    out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                      window_size=window, block_table=b.block_table, **kw)
    torch.cuda.synchronize()
    _check(out, lse, b.q, kdq, vdq, b.cu_q, b.cu_k, b.block_table, window, kd, vd, str(case))
    quant = validate.KvQuant(kw.get("kv_cache_dtype", "auto"), kw.get("k_descale"), kw.get("v_descale"),
                             kw.get("k_scale"), kw.get("v_scale"))
    sel = rtcattn.ops.attention_fwd.selection_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=window,
                                                     block_table=b.block_table, quant=quant)
    # every case has a sequence of more than 16 query rows: the sm90 prefill kernel's for E4M3 and FP4, the
    # baseline's for FNUZ (MI300X's format, which no sm_90a kernel lists)
    want = "baseline" if kv_dtype == "fp8_e4m3fnuz" else "sm90"
    assert max(lens_q) > 16 and sel.kernel.name == want and sel.variant["kv_dtype"] == kv_dtype, sel


def test_fp8_nan_code_reaches_the_rows_that_read_it():
    """E4M3's NaN code in K row j of one sequence and head: that sequence's rows of the head's query heads are NaN,
    every other row finite."""
    b = vs.make_batch([3, 2], [20, 20], 2, 2, 64, DEV, seed=7)
    k, v = (kvquant.quantize_fp8(t, torch.ones((), device=DEV)) for t in (b.k, b.v))
    k.view(torch.uint8)[5, 1, 3] = 0x7F  # sequence 0, K/V head 1, key 5
    out = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, window_size=(100, 100))
    nan = torch.isnan(out.float()).cpu()
    assert nan[0:3, 1].all()
    nan[0:3, 1] = False
    assert not nan.any()


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp4_e2m1"])
def test_kvcache_append_writes_quantize_kv_bytes(kv_dtype):
    """flash_attn_with_kvcache appends 3 rows a sequence into a quantized cache on the device: those rows hold
    quantize_kv's bytes (and scales), nothing else changes, and the output meets the accuracy rule."""
    gen = torch.Generator().manual_seed(3)
    rnd = lambda *s: torch.randn(s, generator=gen).to(torch.bfloat16).to(DEV)  # noqa: E731
    seqlens = torch.tensor([20, 30], dtype=torch.int32, device=DEV)
    kn, vn, q = rnd(2, 3, 2, 128), rnd(2, 3, 2, 128), rnd(2, 1, 4, 128)
    if kv_dtype == "fp4_e2m1":
        (kp, ks), (vp, vs_) = kvquant.quantize_fp4(rnd(9, 16, 2, 128)), kvquant.quantize_fp4(rnd(9, 16, 2, 128))
        table = torch.randperm(9, generator=gen)[:6].view(2, 3).to(torch.int32).to(DEV)
        cache = dict(k_cache=_hnd(kp), v_cache=_hnd(vp), block_table=table, kv_cache_dtype="fp4_e2m1", k_scale=ks,
                     v_scale=vs_)
        kq, vq, kqs, vqs = rtcattn.quantize_kv(kn, vn, "fp4_e2m1")
    else:
        kd, vd = (torch.rand((2, 2), generator=gen) + 0.5 for _ in range(2))
        kd, vd = kd.to(DEV), vd.to(DEV)
        kc, vc = (kvquant.quantize_fp8(rnd(2, 48, 2, 128), torch.ones((), device=DEV)) for _ in range(2))
        cache = dict(k_cache=kc, v_cache=vc, k_descale=kd, v_descale=vd)
        (kq, vq), kqs, vqs = rtcattn.quantize_kv(kn, vn, k_descale=kd, v_descale=vd), None, None
    before = {n: cache[n].view(torch.uint8).clone() for n in ("k_cache", "v_cache", "k_scale", "v_scale") if n in cache}
    out = rtcattn.flash_attn_with_kvcache(q, **cache, k=kn, v=vn, cache_seqlens=seqlens, causal=True,
                                          how_v3_bf16_cvt=0)
    torch.cuda.synchronize()
    fp4 = kv_dtype == "fp4_e2m1"
    for b, start in enumerate(seqlens.tolist()):
        for i in range(3):
            r = start + i
            for name, want, swant in (("k_cache", kq, kqs), ("v_cache", vq, vqs)):
                if fp4:
                    page = int(cache["block_table"][b, r // 16])
                    sname = name[0] + "_scale"
                    assert torch.equal(cache[sname][page, r % 16], swant[b, i]), (name, b, i)
                    before[sname][page, r % 16] = swant[b, i]
                    assert torch.equal(cache[name][page, :, r % 16], want[b, i]), (name, b, i)
                    before[name][page, :, r % 16] = want[b, i].view(torch.uint8)
                else:
                    assert torch.equal(cache[name][b, r].view(torch.uint8), want[b, i].view(torch.uint8)), (name, b, i)
                    before[name][b, r] = want[b, i].view(torch.uint8)
    for n, t in before.items():
        assert torch.equal(cache[n].view(torch.uint8), t), n
    extra = {}
    if fp4:
        kdq = ref.dequantize_cache(cache["k_cache"].cpu(), "fp4_e2m1", cache["k_scale"].cpu())
        vdq = ref.dequantize_cache(cache["v_cache"].cpu(), "fp4_e2m1", cache["v_scale"].cpu())
        extra = dict(block_table=cache["block_table"].cpu())
    else:
        kdq, vdq = ref.dequantize_cache(cache["k_cache"].cpu()), ref.dequantize_cache(cache["v_cache"].cpu())
        extra = dict(k_descale=cache["k_descale"].cpu(), v_descale=cache["v_descale"].cpu())
    lens = (seqlens + 3).cpu()
    _, (o64, _) = ref.reference_kvcache(q.cpu(), kdq, vdq, cache_seqlens=lens, window=(-1, 0), **extra)
    _, r = ref.reference_kvcache(q.cpu(), kdq, vdq, cache_seqlens=lens, window=(-1, 0), round_mode="rtne", **extra)
    err, nrm = ref.errors(out.cpu(), o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all() and err <= 2 * err_r + 1e-5 and nrm < NORMWISE_BOUND[q.dtype], (
        err, err_r, nrm)
