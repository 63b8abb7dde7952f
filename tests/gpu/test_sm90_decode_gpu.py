"""The sm_90a decode kernel on the GPU, bf16 and fp16, every head-dim bucket: the numerics contract against the fp64
reference (dense, varlen and paged; causal, bottom-right, so a decode row sees the whole cache, and sliding windows;
GQA and MQA; Sq 1..16; the three round modes; LSE), KV lengths 1, 17, 300 and 4097, batches of 1 to 40 sequences,
pages of 16 to 256 rows in shuffled order equal to the packed call bit for bit, the KV split forced to 1..n parts (each
meets the contract, one n gives the same bits run to run), bad metadata (run under compute-sanitizer by
tests/gpu/sanitizer_smoke.py) and dispatch: decode calls take this kernel, prefill calls the sm90 kernel."""
import pytest

torch = pytest.importorskip("torch")

import numerics_suite as suite  # noqa: E402
import rtcattn  # noqa: E402
import varlen_suite as vs  # noqa: E402
from rtcattn.ops import attention_fwd  # noqa: E402
from rtcattn.ops.attention_fwd import reference as ref, validate  # noqa: E402
from rtcattn.runtime import _lib, dispatch, manifest  # noqa: E402

pytestmark = pytest.mark.gpu

KERNEL = "sm90_decode"
F16, BF16 = torch.float16, torch.bfloat16
DTYPES = {"bf16": BF16, "fp16": F16}
BUCKETS = list(manifest.load().op(attention_fwd.OP).kernel(KERNEL).axes["head_dim"].buckets)
CAUSAL = (-1, 0)
MAX_Q = 16
DEV = "cuda"


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the sm90_decode kernel runs on sm_90a (H100/H200)")


def run_on(**pins):
    def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
        with dispatch.pinned(kernel=KERNEL, **pins):
            return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                                   window_size=window)
    return run


def bucket_of(d: int) -> int:
    return next(b for b in BUCKETS if b >= -(-d // 8) * 8)


# (head dim, dtype, mode, layout, Sq, Sk, Hq, Hk, window): every bucket in both dtypes, padded head dims (8, 111,
# 200), GQA 1, 4, 8 and 32 query heads per K/V head, one to 16 query rows, causal, windows and none.
DENSE = [
    (8, "bf16", "rtne", "bshd", 1, 17, 4, 1, None),
    (32, "fp16", "rtne", "bhsd", 3, 4097, 8, 8, CAUSAL),
    (40, "bf16", "rtna", "bshd", 2, 300, 8, 2, (37, 0)),
    (64, "fp16", "rtne", "bhsd", 16, 300, 2, 2, CAUSAL),
    (64, "bf16", "rtne", "bshd", 1, 4097, 32, 8, None),
    (72, "bf16", "rtna", "bshd", 4, 300, 32, 8, (37, 5)),
    (96, "fp16", "rtne", "bshd", 2, 77, 8, 1, None),
    (111, "bf16", "rtz", "bhsd", 5, 300, 4, 1, CAUSAL),
    (128, "fp16", "rtne", "bshd", 1, 300, 8, 2, None),
    (128, "bf16", "rtz", "bshd", 1, 4097, 32, 8, CAUSAL),
    (160, "bf16", "rtne", "bshd", 3, 130, 32, 1, None),
    (160, "fp16", "rtne", "bhsd", 1, 1000, 4, 4, (100, 0)),
    (192, "fp16", "rtne", "bhsd", 1, 1, 1, 1, CAUSAL),
    (192, "bf16", "rtna", "bshd", 8, 700, 16, 2, None),
    (200, "bf16", "rtna", "bshd", 16, 17, 1, 1, (3, 0)),
    (256, "fp16", "rtne", "bshd", 8, 300, 2, 1, None),
    (256, "bf16", "rtne", "bhsd", 16, 40, 4, 4, (30, 0)),
]


def test_the_cases_cover_the_issue():
    """Every bucket in both dtypes, GQA 1/4/8/32, Sq 1 and 16, the three modes, causal and windows."""
    assert {(bucket_of(c[0]), c[1]) for c in DENSE} == {(b, t) for b in BUCKETS for t in DTYPES}
    assert {c[6] // c[7] for c in DENSE} >= {1, 4, 8, 32}
    assert {c[4] for c in DENSE} >= {1, MAX_Q} and max(c[4] for c in DENSE) == MAX_Q
    assert {c[2] for c in DENSE} == {"rtne", "rtna", "rtz"}
    assert CAUSAL in {c[8] for c in DENSE} and {c[8] for c in DENSE} - {CAUSAL, None}


@needs_hopper
@pytest.mark.parametrize("d,dtype,mode,layout,sq,sk,hq,hk,window", DENSE,
                         ids=[f"d{c[0]}-{c[1]}-sq{c[4]}-sk{c[5]}-g{c[6] // c[7]}" for c in DENSE])
def test_dense_against_fp64(d, dtype, mode, layout, sq, sk, hq, hk, window):
    q, k, v = suite.make_qkv(layout, 2, hq, sq, sk, d, DEV, seed=d + sq, hk=hk, dtype=DTYPES[dtype])
    suite.check_accuracy(run_on(), q, k, v, layout, mode, what=f"decode d={d}", window=window)


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_special_values(dtype):
    suite.check_special_values(run_on(), DEV, "bshd", "rtne", sq=MAX_Q, sk=100, d=128, dtype=dtype)
    suite.check_special_values(run_on(tail_split=3), DEV, "bshd", "rtne", sq=4, sk=300, d=64, dtype=dtype)


@needs_hopper
def test_head_dim_below_its_bucket_equals_zero_columns():
    """D = 40 runs the 64 bucket on zero columns: the call equals the one on inputs zero-padded to 64 with the scale
    of 40, bit for bit."""
    q, k, v = suite.make_qkv("bshd", 1, 8, 3, 100, 40, DEV, seed=4, hk=2, dtype=F16)
    pad = lambda t: torch.nn.functional.pad(t, (0, 24))  # noqa: E731
    with dispatch.pinned(kernel=KERNEL):
        o, lse = rtcattn.forward(q, k, v, return_lse=True, window_size=CAUSAL)
        o_p, lse_p = rtcattn.forward(pad(q), pad(k), pad(v), softmax_scale=40 ** -0.5, return_lse=True,
                                     window_size=CAUSAL)
    assert torch.equal(ref.bf16_bits(o), ref.bf16_bits(o_p[..., :40]))
    assert torch.equal(lse.view(torch.int32), lse_p.view(torch.int32))


# ---- packed sequences: lengths, batches, pages --------------------------------------------------------------------

LENS_Q, LENS_K = [1, 16, 4, 7, 0], [1, 17, 300, 4097, 5]


@needs_hopper
def test_lengths_1_17_300_4097_against_fp64():
    """One to 16 query rows against 1 to 4097 keys (GQA 4), causal and a window, with the planner's split (a batch
    of five sequences cannot fill the GPU) and without one."""
    b = vs.make_batch(LENS_Q, LENS_K, 8, 2, 128, DEV, seed=1)
    with dispatch.pinned(kernel=KERNEL):
        p = validate.check_varlen_inputs(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k)
        assert _lib.op_plan(attention_fwd.OP, KERNEL, attention_fwd.args_block_varlen(
            b.q, b.k, b.v, None, b.cu_q, b.cu_k, None, p, dispatch.machine_fields(b.q.device)))["splits"] > 1
        vs.check_accuracy(b, "rtne", CAUSAL, what="planned split")
    with dispatch.pinned(kernel=KERNEL, tail_split=0):
        vs.check_accuracy(b, "rtna", (100, 0), what="no split")


@needs_hopper
def test_batches_of_1_and_40_sequences():
    gen = torch.Generator().manual_seed(5)
    lens_q = torch.randint(0, MAX_Q + 1, (40,), generator=gen).tolist()
    lens_k = torch.randint(1, 900, (40,), generator=gen).tolist()
    with dispatch.pinned(kernel=KERNEL):
        vs.check_accuracy(vs.make_batch(lens_q, lens_k, 2, 1, 128, DEV, seed=5), "rtne", CAUSAL, what="B=40")
        vs.check_accuracy(vs.make_batch([MAX_Q], [700], 32, 1, 128, DEV, seed=6), "rtne", CAUSAL, what="B=1 MQA")


@needs_hopper
@pytest.mark.parametrize("page", [16, 32, 64, 128, 256])
def test_paged_equals_packed(page):
    """Shuffled pages, junk in the spare pages and a block table longer than needed: the packed call's output and
    LSE bit for bit, with a split forced on (its parts cut pages)."""
    b = vs.make_batch([1, 16, 4, 7], [1, 17, 300, 900], 8, 2, 128, DEV, seed=page)
    with dispatch.pinned(kernel=KERNEL, tail_split=3):
        vs.check_paged_equals_packed(b, page, "rtne", CAUSAL, seed=page)
        if page == 16:
            vs.check_accuracy(vs.to_paged(b, page, seed=page), "rtne", CAUSAL, what="paged 16")


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_every_bucket(dtype):
    """Varlen and paged at every bucket, GQA 4, causal."""
    for i, d in enumerate((32, 40, 72, 128, 160, 192, 256)):
        b = vs.make_batch([1, 16, 3], [17, 1300, 65], 8, 2, d, DEV, seed=d, dtype=DTYPES[dtype])
        with dispatch.pinned(kernel=KERNEL):
            vs.check_accuracy(b if (i % 2 == 0) == (dtype == "bf16") else vs.to_paged(b, 32, seed=d), "rtne", CAUSAL,
                              what=f"d={d}")


# ---- the KV split: forced 1..n, the same bits run to run ----------------------------------------------------------

@needs_hopper
def test_forced_splits_meet_the_contract_and_repeat_bit_for_bit():
    """1..6 parts, and 40 (more parts than the 11 stages: empty parts), each against fp64; 5 parts twice: the same
    output and LSE bits (the merge adds the parts in part order, never with atomics)."""
    q, k, v = suite.make_qkv("bshd", 1, 8, 2, 700, 128, DEV, seed=7, hk=2)
    for n in (1, 2, 3, 4, 5, 6, 40):
        suite.check_accuracy(run_on(tail_split=n), q, k, v, "bshd", "rtne", what=f"splits={n}", window=CAUSAL)
    runs = [run_on(tail_split=5)(q, k, v, "bshd", "rtne", None, True, CAUSAL) for _ in range(3)]
    for r in runs[1:]:
        assert torch.equal(ref.bf16_bits(runs[0][0]), ref.bf16_bits(r[0]))
        assert torch.equal(runs[0][1].view(torch.int32), r[1].view(torch.int32))
    one = run_on(tail_split=1)(q, k, v, "bshd", "rtne", None, True, CAUSAL)
    assert not torch.equal(one[1].view(torch.int32), runs[0][1].view(torch.int32)), "the split did not run"


@needs_hopper
@pytest.mark.parametrize("splits", [0, 3])
def test_rows_that_see_no_key_and_chunks_with_a_split(splits):
    """Causal with more query rows than keys: rows 0..10 of 16 see no key (+0, LSE -Inf), the rest 1..5 keys; and MQA
    32/1 with 3 rows (six chunks of 16 packed rows), unsplit and split."""
    run = run_on(tail_split=splits)
    q, k, v = suite.make_qkv("bshd", 2, 8, MAX_Q, 5, 64, DEV, seed=11, hk=2)
    suite.check_accuracy(run, q, k, v, "bshd", "rtna", what=f"empty rows splits={splits}", window=CAUSAL)
    q, k, v = suite.make_qkv("bhsd", 3, 32, 3, 200, 128, DEV, seed=12, hk=1, dtype=F16)
    suite.check_accuracy(run, q, k, v, "bhsd", "rtne", what=f"MQA chunks splits={splits}", window=(50, 0))


# ---- bad metadata: the launch completes and nothing else is written -------------------------------------------------

@needs_hopper
@pytest.mark.parametrize("splits", [0, 3])
def test_bad_metadata_stays_inside_the_tensors(splits):
    """Out-of-range offsets and block ids run to completion (compute-sanitizer's memcheck runs the same calls in
    tests/gpu/sanitizer_smoke.py); the output has the shape asked for."""
    b = vs.make_batch([5, 16, 9], [100, 60, 130], 4, 2, 128, DEV, seed=8)
    t_q = b.q.shape[0]
    paged = vs.to_paged(b, 16, seed=8)
    n = paged.k.shape[0]
    tables = [paged.block_table.clone() for _ in range(3)]
    tables[0][0, 2], tables[0][2, 0] = -1, -(2 ** 31)
    tables[1][1, 1], tables[1][2, 3] = n, 2 ** 31 - 1
    tables[2][:] = n + 5
    with dispatch.pinned(kernel=KERNEL, tail_split=splits):
        for cu_q, cu_k in (([0, 5, 2, t_q], [0, 100, 30, b.k.shape[0]]),
                           ([-70, 10, 21, t_q], [-5, 100, -3, 2 ** 31 - 1])):
            bad = vs.Batch(b.q, b.k, b.v, torch.tensor(cu_q, dtype=torch.int32, device=DEV),
                           torch.tensor(cu_k, dtype=torch.int32, device=DEV), b.max_q, b.max_k)
            out, lse = vs.run(bad, "rtne", CAUSAL)
            assert out.shape == b.q.shape and lse.shape == (4, t_q)
        for table in tables:
            out, _ = vs.run(vs.Batch(paged.q, paged.k, paged.v, paged.cu_q, paged.cu_k, paged.max_q, paged.max_k,
                                     table))
            assert torch.isfinite(out.float()).all()
        torch.cuda.synchronize()


# ---- dispatch -----------------------------------------------------------------------------------------------------

@needs_hopper
def test_dispatch_picks_the_decode_kernel_for_decode_calls_only():
    """Up to 16 query rows per sequence (dense seq_q, packed max_seqlen_q) run on the decode kernel, more on the
    prefill kernel, for every form and both dtypes; the refusal names the argument and what is accepted."""
    for dtype in DTYPES.values():
        for sq, kernel in ((1, KERNEL), (MAX_Q, KERNEL), (MAX_Q + 1, "sm90")):
            q, k, v = suite.make_qkv("bshd", 2, 8, sq, 300, 128, DEV, hk=2, dtype=dtype)
            assert attention_fwd.selection(q, k, v).kernel.name == kernel, sq
            sel = attention_fwd.selection(q, k, v, window=CAUSAL)
            assert sel.kernel.name == kernel, sq
            if kernel == "sm90":
                assert f"{KERNEL}: seq_q={sq} is not accepted by the {KERNEL} kernel; accepted: at most 16" in sel.why
            b = vs.make_batch([1, sq], [20, 40], 8, 2, 128, DEV, dtype=dtype)
            p = vs.to_paged(b, 16)
            svl = attention_fwd.selection_varlen
            assert svl(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k).kernel.name == kernel
            assert svl(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=CAUSAL,
                       block_table=p.block_table).kernel.name == kernel


@needs_hopper
def test_flash_attn_with_kvcache_runs_the_decode_kernel():
    """The decode entry: a paged cache with one new token appended per sequence, causal, against fp64 after the
    append (the kvcache API's own tests check its semantics; this one that the decode kernel serves it)."""
    torch.manual_seed(3)
    b, hk, g, d, page, blocks = 4, 2, 4, 128, 16, 40
    kc = torch.randn(b * blocks, page, hk, d, device=DEV, dtype=BF16)
    vc = torch.randn_like(kc)
    table = torch.randperm(b * blocks, device=DEV, dtype=torch.int32).view(b, blocks)
    lens = torch.tensor([1, 17, 300, 600], device=DEV, dtype=torch.int32)
    q = torch.randn(b, 1, hk * g, d, device=DEV, dtype=BF16)
    kn, vn = torch.randn(b, 1, hk, d, device=DEV, dtype=BF16), torch.randn(b, 1, hk, d, device=DEV, dtype=BF16)
    with dispatch.pinned(kernel=KERNEL):
        out, lse = rtcattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                                   causal=True, return_softmax_lse=True)
    for i, n in enumerate((lens + 1).tolist()):
        rows = torch.arange(n, device=DEV)
        kk = kc[table[i, rows // page].long(), rows % page]  # [n, hk, d], the cache after the append
        vv = vc[table[i, rows // page].long(), rows % page]
        qq = q[i].transpose(0, 1).double()  # [hq, 1, d]
        kx = kk.transpose(0, 1).double().repeat_interleave(g, 0)
        vx = vv.transpose(0, 1).double().repeat_interleave(g, 0)
        s = qq @ kx.transpose(1, 2) * d ** -0.5
        o = torch.softmax(s, -1) @ vx
        err = (out[i].transpose(0, 1).double() - o).abs().max().item()
        assert err < 2e-2, (i, err)
        assert torch.allclose(lse[i, :, 0].double(), torch.logsumexp(s, -1)[:, 0], atol=1e-3)


@needs_hopper
@pytest.mark.parametrize("splits", [0, 2])
def test_output_near_65504_stays_within_the_contract(splits):
    """V's column 0 at 65504 and column 1 at -65504, one key at p = 1 and 100 at p = 0.500338 (fp16 0.500488): R, which
    rounds every p against the row's max over all keys, gives O/l = 65523, so +-Inf. This kernel rounds each p
    against the running max of its warp's keys (and of its split part), where the 100 keys' own max makes their p
    exactly 1: their fp16 P is exact and the row stays at the exact answer +-65504 (0x7BFF / 0xFBFF). docs/numerics.md
    §9 allows both; rows whose P is exact everywhere stay 0x7BFF / 0xFBFF."""
    import math
    n = 100
    q = torch.zeros(1, 3, 1, 64, dtype=F16, device=DEV)
    k = torch.zeros(1, n + 1, 1, 64, dtype=F16, device=DEV)
    q[0, :, 0, 0] = torch.tensor([1.0, 0.0, -1.0])
    k[0, 1:, 0, 0] = -(1 - 2**-10)
    v = torch.randn(1, n + 1, 1, 64, device=DEV).to(F16)
    v[..., 0], v[..., 1] = 65504.0, -65504.0
    out = run_on(tail_split=splits)(q, k, v, "bshd", "rtne", math.log(2.0), False)
    bits = ref.bf16_bits(out.cpu())[0, :, 0]
    assert bits[0, :2].tolist() in ([0x7BFF, 0xFBFF], [0x7C00, 0xFC00]), bits[0, :2]
    assert bits[1:, 0].tolist() == [0x7BFF, 0x7BFF] and bits[1:, 1].tolist() == [0xFBFF, 0xFBFF]
