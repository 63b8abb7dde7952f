"""The sm_90a kernels' score modifications (the soft cap and ALiBi, issue 25) on the GPU, each kernel pinned (no silent
fallback): tests/score_mod_suite.py's checks for the sm90 prefill (dense, varlen and paged K/V; bf16 and fp16; head
dims 64, 128, 256 and 200, below its bucket), the sm90_decode kernel (flash_attn_with_kvcache, contiguous and paged
caches, 1 and 4 query rows) and the sm90 backward (dense and varlen), every case of the suite (each modification alone
and both, with and without a mask); and both forwards over FP8 and FP4 caches (a helper here: the suite has none),
against the fp64 reference over the exactly dequantized cache with the same modifications."""
import pytest

torch = pytest.importorskip("torch")

from test_sm90_decode_kvquant_gpu import _quantized  # noqa: E402

import rtcattn  # noqa: E402
import score_mod_suite as sms  # noqa: E402
import varlen_suite as vs  # noqa: E402
from numerics_suite import NORMWISE_BOUND  # noqa: E402
from rtcattn.ops.attention_fwd import reference as ref  # noqa: E402
from rtcattn.runtime import dispatch  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
BF16, F16 = torch.bfloat16, torch.float16
HEAD_DIMS = (64, 128, 256, 200)  # 200: below its bucket (256), columns past D are the tiles' zeros


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the sm90 kernels run on sm_90a (H100/H200)")
CASES = pytest.mark.parametrize("case", sms.CASES, ids=sms.IDS)


# ---- sm90 prefill ----

@needs_hopper
@CASES
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_sm90_dense(case, d, dtype):
    sms.check_dense("sm90", DEV, case, d=d, dtype=dtype)


@needs_hopper
@CASES
@pytest.mark.parametrize("d,sq,sk,layout", [(128, 300, 700, "bshd"), (64, 517, 517, "bhsd"), (256, 200, 1000, "bshd")])
def test_sm90_dense_many_blocks(case, d, sq, sk, layout):
    """Many K/V blocks a tile (the steady state, the window's cut and whole blocks) and several tiles a head."""
    sms.check_dense("sm90", DEV, case, d=d, sq=sq, sk=sk, layout=layout)


@needs_hopper
@CASES
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("page", [None, 16], ids=["varlen", "paged16"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_sm90_packed(case, d, page, dtype):
    sms.check_packed("sm90", DEV, case, d=d, page=page, dtype=dtype)


@needs_hopper
@CASES
def test_sm90_packed_long_sequences(case):
    """Sequences of several tiles and many blocks, K longer than Q (chunked prefill) and equal."""
    sms.check_packed("sm90", DEV, case, d=128, lens_q=(300, 17, 129), lens_k=(900, 17, 300), hq=8, hk=2)


# ---- sm90_decode (flash_attn_with_kvcache) ----

@needs_hopper
@CASES
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_sm90_decode_kvcache(case, d, sq, paged):
    sms.check_kvcache("sm90_decode", DEV, case, d=d, sq=sq, paged=paged)


@needs_hopper
@CASES
def test_sm90_decode_kvcache_fp16_long(case):
    sms.check_kvcache("sm90_decode", DEV, case, d=128, sq=2, dtype=F16, cap_rows=1040, seqlens=(1000, 3, 517),
                      paged=True)


# ---- sm90 backward ----

@needs_hopper
@CASES
@pytest.mark.parametrize("d", [64, 128, 200, 256])
def test_sm90_backward_dense(case, d):
    sms.check_backward_dense("sm90", DEV, case, d=d)


@needs_hopper
@CASES
@pytest.mark.parametrize("d,dtype", [(64, BF16), (128, F16), (256, BF16)], ids=["d64-bf16", "d128-fp16", "d256-bf16"])
def test_sm90_backward_packed(case, d, dtype):
    sms.check_backward_packed("sm90", DEV, case, d=d, dtype=dtype)


@needs_hopper
@pytest.mark.parametrize("case", [c for c in sms.CASES if c[0] in ("softcap_causal", "both_window")],
                         ids=["softcap_causal", "both_window"])
def test_sm90_backward_longer(case):
    """Many key blocks and row steps a CTA (the DKDV stage's ring and the DQ stage's steps)."""
    sms.check_backward_dense("sm90", DEV, case, d=128, sq=300, sk=700, hq=8, hk=2)


# ---- quantized caches (FP8 E4M3 with descales, FP4 E2M1 with E8M0 scales), both forwards ----

def _check_quantized(kernel, case, kv_dtype, lens_q, lens_k, d, dtype=BF16, hq=8, hk=2, seed=0):
    """forward_varlen over a paged quantized cache (pages of 16) with the case's modifications on `kernel`, against
    the fp64 reference over the exactly dequantized cache (reference_varlen: descales per sequence and K/V head) with
    the same modifications: the accuracy rule (test_kvquant_gpu's, err <= 2 err(R) + 1e-5), the LSE's."""
    name, cap, kind, window = case
    b = vs.to_paged(vs.make_batch(lens_q, lens_k, hq, hk, d, DEV, seed=seed, dtype=dtype), 16, seed=seed)
    k, v, kw, kdq, vdq, kd, vd = _quantized(b, kv_dtype, True, seed)
    al = sms.slopes(kind, len(lens_q), hq, DEV, seed)
    with dispatch.pinned(kernel=kernel):
        out, lse = rtcattn.forward_varlen(b.q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True,
                                          window_size=window, block_table=b.block_table, softcap=cap,
                                          alibi_slopes=al, **kw)
    torch.cuda.synchronize()
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    args = (b.q.cpu(), kdq.cpu(), vdq.cpu(), b.cu_q.cpu(), b.cu_k.cpu())
    score = dict(softcap=cap, alibi_slopes=cpu(al))
    o64, lse64 = ref.reference_varlen(*args, None, None, window, cpu(b.block_table), cpu(kd), cpu(vd), **score)
    r = ref.reference_varlen(*args, "rtne", None, window, cpu(b.block_table), cpu(kd), cpu(vd), **score)
    tag = f"{kernel} {kv_dtype} {name} d={d} {dtype} lens_q={lens_q} lens_k={lens_k}"
    err, nrm = ref.errors(out.cpu(), o64)
    err_r, _ = ref.errors(r, o64)
    assert torch.isfinite(out.float()).all(), tag
    assert err <= 2 * err_r + 1e-5, f"err {err:.3g} > 2*err(R) {err_r:.3g} + 1e-5: {tag}"
    assert nrm < NORMWISE_BOUND[dtype], f"normwise error {nrm:.3g}: {tag}"
    assert bool(ref.lse_close(lse.cpu(), lse64).all()), tag


QUANT = pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp4_e2m1"])


@needs_hopper
@CASES
@QUANT
@pytest.mark.parametrize("d", [64, 128, 256])
def test_sm90_quantized_paged(case, kv_dtype, d):
    _check_quantized("sm90", case, kv_dtype, [40, 17, 130], [300, 17, 700], d)


@needs_hopper
@CASES
@QUANT
@pytest.mark.parametrize("d", [64, 128, 256])
def test_sm90_decode_quantized_paged(case, kv_dtype, d):
    _check_quantized("sm90_decode", case, kv_dtype, [1, 4, 1], [300, 17, 129], d)


@needs_hopper
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_sm90_a_models_cap_over_large_scores(d, dtype):
    """Gemma 2's cap (50) with scores spread over about +-40: the cap bends them, and the accuracy rule sees the
    tanh's own error (numerics §12)."""
    for seed in range(3):
        sms.check_dense("sm90", DEV, sms.LARGE_CAP, d=d, dtype=dtype, qk=sms.LARGE_CAP_QK, sq=200, sk=600,
                        seed=seed)
