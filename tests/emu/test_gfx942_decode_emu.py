"""The gfx942 decode kernel on the wave emulator, bf16 and fp16, every head-dim bucket: the numerics contract against
the fp64 reference (dense, varlen and paged; causal, bottom-right, so a decode row sees the whole cache, and sliding
windows; GQA and MQA; Sq 1..16; the three round modes; LSE), KV lengths 1, 17, 300 and 4097, batches of 1 to 40
sequences, pages of 16 to 256 rows in shuffled order equal to the packed call bit for bit, the KV split forced to
1..n parts (each meets the contract, one n gives the same bits run to run), the emulated gfx942 and gfx90a builds bit
for bit, bad metadata that must stay inside the tensors (the emulator fails a launch on any access outside them), and
dispatch: decode calls take this kernel, prefill calls the gfx942 kernel. Each bucket is built for one mask and kv form
where it can (the emulator builds a variant in about 2 s), so the cases spread the modes, layouts, GQA ratios and row
counts over the buckets instead of crossing them all."""
import contextlib
import os

import pytest
import torch

import numerics_suite as suite
import rtcattn
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref, validate
from rtcattn.runtime import _lib, dispatch, manifest

pytestmark = pytest.mark.emu

KERNEL = "gfx942_decode"
F16, BF16 = torch.float16, torch.bfloat16
DTYPES = {"bf16": BF16, "fp16": F16}
BUCKETS = list(manifest.load().op(attention_fwd.OP).kernel(KERNEL).axes["head_dim"].buckets)
CUS = dispatch.emulated_cus("gfx942-emu")
CAUSAL = (-1, 0)
MAX_Q = 16  # query rows per sequence the kernel takes


@contextlib.contextmanager
def on(arch="gfx942", **pins):
    """The calls inside run on the emulated arch with the decode kernel pinned (no fallback) and pins set."""
    before = os.environ.get("RTCATTN_EMULATE")
    os.environ["RTCATTN_EMULATE"] = arch
    try:
        with dispatch.pinned(kernel=KERNEL, num_cus=CUS, **pins):
            yield
    finally:
        if before is None:
            del os.environ["RTCATTN_EMULATE"]
        else:
            os.environ["RTCATTN_EMULATE"] = before


def run_on(arch="gfx942", **pins):
    def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
        with on(arch, **pins):
            return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse,
                                   window_size=window)
    return run


def bucket_of(d: int) -> int:
    return next(b for b in BUCKETS if b >= -(-d // 8) * 8)


# (head dim, dtype, mode, layout, Sq, Sk, Hq, Hk, window): every bucket in both dtypes, the head dims 8 and 111 (padded
# to 112 by the Python layer) below theirs, GQA 1, 4, 8 and 32 query heads per K/V head, one to 16 query rows (MQA
# 32 x 3 rows: six chunks of 16 packed rows), causal, windows (rows that see few keys, or none) and none.
DENSE = [
    (8, "bf16", "rtne", "bshd", 1, 17, 4, 1, None),
    (64, "fp16", "rtne", "bhsd", 16, 300, 2, 2, CAUSAL),
    (72, "bf16", "rtna", "bshd", 4, 300, 32, 8, (37, 5)),
    (96, "fp16", "rtne", "bshd", 2, 77, 8, 1, None),
    (111, "bf16", "rtz", "bhsd", 5, 300, 4, 1, CAUSAL),
    (128, "fp16", "rtne", "bshd", 1, 300, 8, 2, None),
    (160, "bf16", "rtne", "bshd", 3, 130, 32, 1, None),
    (192, "fp16", "rtne", "bhsd", 1, 1, 1, 1, CAUSAL),
    (200, "bf16", "rtna", "bshd", 16, 17, 1, 1, (3, 0)),
    (256, "fp16", "rtne", "bshd", 8, 300, 2, 1, None),
    (256, "bf16", "rtne", "bhsd", 16, 40, 4, 4, (30, 0)),
]


def test_the_cases_cover_the_issue():
    """Every bucket in both dtypes, GQA 1/4/8/32, Sq 1 and 16, the three modes, causal and windows."""
    assert {(bucket_of(c[0]), c[1]) for c in DENSE} == {(b, t) for b in BUCKETS for t in DTYPES}
    assert {c[6] // c[7] for c in DENSE} >= {1, 4, 8, 32}
    assert {c[4] for c in DENSE} >= {1, MAX_Q} and max(c[4] for c in DENSE) == MAX_Q
    assert {c[2] for c in DENSE} == set(suite.MODES)
    assert CAUSAL in {c[8] for c in DENSE} and {c[8] for c in DENSE} - {CAUSAL, None}


@pytest.mark.parametrize("d,dtype,mode,layout,sq,sk,hq,hk,window", DENSE,
                         ids=[f"d{c[0]}-{c[1]}-sq{c[4]}-g{c[6] // c[7]}" for c in DENSE])
def test_dense_against_fp64(d, dtype, mode, layout, sq, sk, hq, hk, window):
    q, k, v = suite.make_qkv(layout, 2, hq, sq, sk, d, "cpu", seed=d + sq, hk=hk, dtype=DTYPES[dtype])
    suite.check_accuracy(run_on(), q, k, v, layout, mode, what=f"decode d={d}", window=window)


def test_special_values():
    suite.check_special_values(run_on(), "cpu", "bshd", "rtne", sq=MAX_Q, sk=100, d=128)


def test_head_dim_below_its_bucket_equals_zero_columns():
    """D = 40 runs the 64 bucket on zero columns: the call equals the one on inputs zero-padded to 64 with the scale
    of 40, bit for bit; the emulator fails a launch on any access past the rows' 40 columns."""
    q, k, v = suite.make_qkv("bshd", 1, 8, 3, 100, 40, "cpu", seed=4, hk=2, dtype=F16)
    pad = lambda t: torch.nn.functional.pad(t, (0, 24))  # noqa: E731
    with on():
        o, lse = rtcattn.forward(q, k, v, return_lse=True, window_size=CAUSAL)
        o_p, lse_p = rtcattn.forward(pad(q), pad(k), pad(v), softmax_scale=40 ** -0.5, return_lse=True,
                                     window_size=CAUSAL)
    assert torch.equal(ref.bf16_bits(o), ref.bf16_bits(o_p[..., :40]))
    assert torch.equal(lse.view(torch.int32), lse_p.view(torch.int32))


# ---- packed sequences: lengths, batches, pages --------------------------------------------------------------------

LENS_Q, LENS_K = [1, 16, 4, 7, 0], [1, 17, 300, 4097, 5]


def test_lengths_1_17_300_4097_against_fp64():
    """One to 16 query rows against 1 to 4097 keys (GQA 4), causal and a window, with the planner's split (a batch
    of five sequences cannot fill 304 CUs) and without one."""
    b = vs.make_batch(LENS_Q, LENS_K, 8, 2, 128, "cpu", seed=1)
    with on():
        p = validate.check_varlen_inputs(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k)
        assert _lib.op_plan(attention_fwd.OP, KERNEL, attention_fwd.args_block_varlen(
            b.q, b.k, b.v, None, b.cu_q, b.cu_k, None, p, dispatch.arch_fields("gfx942-emu", CUS)))["splits"] > 1
        vs.check_accuracy(b, "rtne", CAUSAL, what="planned split")
    with on(tail_split=0):
        vs.check_accuracy(b, "rtna", (100, 0), what="no split")


def test_batches_of_1_and_40_sequences():
    gen = torch.Generator().manual_seed(5)
    lens_q = torch.randint(0, MAX_Q + 1, (40,), generator=gen).tolist()
    lens_k = torch.randint(1, 90, (40,), generator=gen).tolist()
    with on():
        vs.check_accuracy(vs.make_batch(lens_q, lens_k, 2, 1, 128, "cpu", seed=5), "rtne", CAUSAL, what="B=40")
        vs.check_accuracy(vs.make_batch([MAX_Q], [700], 32, 1, 128, "cpu", seed=6), "rtne", CAUSAL, what="B=1 MQA")


@pytest.mark.parametrize("page", [16, 64, 256])
def test_paged_equals_packed(page):
    """Shuffled pages, junk in the spare pages and a block table longer than needed: the packed call's output and
    LSE bit for bit, with a split forced on (its parts cut pages)."""
    b = vs.make_batch([1, 16, 4, 7], [1, 17, 300, 900], 8, 2, 128, "cpu", seed=page)
    with on(tail_split=3):
        vs.check_paged_equals_packed(b, page, "rtne", CAUSAL, seed=page)
        if page == 16:
            vs.check_accuracy(vs.to_paged(b, page, seed=page), "rtne", CAUSAL, what="paged 16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_every_bucket(dtype):
    """Varlen and paged at every bucket (one dtype per form), GQA 4, causal."""
    for i, d in enumerate((40, 72, 128, 160, 256)):
        b = vs.make_batch([1, 16, 3], [17, 130, 65], 8, 2, d, "cpu", seed=d, dtype=DTYPES[dtype])
        with on():
            vs.check_accuracy(b if (i % 2 == 0) == (dtype == "bf16") else vs.to_paged(b, 32, seed=d), "rtne", CAUSAL,
                              what=f"d={d}")


# ---- the KV split: forced 1..n, the same bits run to run ----------------------------------------------------------

def test_forced_splits_meet_the_contract_and_repeat_bit_for_bit():
    """1..6 parts, and 40 (more parts than the 22 steps: empty parts), each against fp64; 5 parts twice: the same
    output and LSE bits (the merge adds the parts in a fixed order, never with atomics)."""
    q, k, v = suite.make_qkv("bshd", 1, 8, 2, 700, 128, "cpu", seed=7, hk=2)
    for n in (1, 2, 3, 4, 5, 6, 40):
        suite.check_accuracy(run_on(tail_split=n), q, k, v, "bshd", "rtne", what=f"splits={n}", window=CAUSAL)
    runs = [run_on(tail_split=5)(q, k, v, "bshd", "rtne", None, True, CAUSAL) for _ in range(2)]
    assert torch.equal(ref.bf16_bits(runs[0][0]), ref.bf16_bits(runs[1][0]))
    assert torch.equal(runs[0][1].view(torch.int32), runs[1][1].view(torch.int32))
    one = run_on(tail_split=1)(q, k, v, "bshd", "rtne", None, True, CAUSAL)
    assert not torch.equal(one[1].view(torch.int32), runs[0][1].view(torch.int32)), "the split did not run"


@pytest.mark.parametrize("hq,hk,splits", [(8, 8, 300), (6, 2, 40), (8, 2, 70)], ids=["1-row", "3-rows", "4-rows"])
def test_the_merge_gives_spare_row_lanes_to_parts(hq, hk, splits):
    """An item of 1, 3 or 4 rows of the call (MHA, GQA 3 and 4 at Sq 1) merges with 16, 4 and 4 part groups of lanes
    (gfx942_decode/params.h decode_merge_rows): 300 parts over 1-row items take two rounds of 16 x 16 parts, and parts
    past the steps are empty; each against fp64, and the same bits run to run."""
    q, k, v = suite.make_qkv("bshd", 2, hq, 1, 1500, 64, "cpu", seed=hq + hk, hk=hk)
    suite.check_accuracy(run_on(tail_split=splits), q, k, v, "bshd", "rtne", what=f"{hq}/{hk} splits={splits}",
                         window=CAUSAL)
    runs = [run_on(tail_split=splits)(q, k, v, "bshd", "rtne", None, True, CAUSAL) for _ in range(2)]
    assert torch.equal(ref.bf16_bits(runs[0][0]), ref.bf16_bits(runs[1][0]))
    assert torch.equal(runs[0][1].view(torch.int32), runs[1][1].view(torch.int32))


@pytest.mark.parametrize("splits", [0, 3])
def test_rows_that_see_no_key_and_chunks_with_a_split(splits):
    """Causal with more query rows than keys: rows 0..10 of 16 see no key (+0, LSE -Inf), the rest 1..5 keys; and MQA
    32/1 with 3 rows (six chunks of 16 packed rows on one XCD each), unsplit and split."""
    run = run_on(tail_split=splits)
    q, k, v = suite.make_qkv("bshd", 2, 8, MAX_Q, 5, 64, "cpu", seed=11, hk=2)
    suite.check_accuracy(run, q, k, v, "bshd", "rtna", what=f"empty rows splits={splits}", window=CAUSAL)
    q, k, v = suite.make_qkv("bhsd", 3, 32, 3, 200, 128, "cpu", seed=12, hk=1, dtype=F16)
    suite.check_accuracy(run, q, k, v, "bhsd", "rtne", what=f"MQA chunks splits={splits}", window=(50, 0))


def test_gfx942_and_gfx90a_agree_bit_for_bit():
    """The same source built for both archs gives the same output and LSE, dense with a split, and paged."""
    q, k, v = suite.make_qkv("bshd", 2, 8, 3, 450, 128, "cpu", seed=3, hk=2)
    outs = [run_on(a, tail_split=3)(q, k, v, "bshd", "rtne", None, True, CAUSAL) for a in ("gfx942", "gfx90a")]
    assert torch.equal(ref.bf16_bits(outs[0][0]), ref.bf16_bits(outs[1][0]))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))
    p = vs.to_paged(vs.make_batch([1, 5], [70, 200], 8, 2, 128, "cpu", seed=2), 16, seed=2)
    res = []
    for a in ("gfx942", "gfx90a"):
        with on(a):
            res.append(vs.run(p, "rtne", CAUSAL))
    assert torch.equal(ref.bf16_bits(res[0][0]), ref.bf16_bits(res[1][0]))
    assert torch.equal(res[0][1].view(torch.int32), res[1][1].view(torch.int32))


def test_gfx950_agrees_with_gfx942_bit_for_bit():
    """The gfx950 emulator target (CDNA4 keeps CDNA3's MFMA and buffer loads) gives the gfx942 build's bits: dense
    with a split, and paged."""
    q, k, v = suite.make_qkv("bshd", 2, 8, 3, 450, 128, "cpu", seed=3, hk=2)
    outs = [run_on(a, tail_split=3)(q, k, v, "bshd", "rtne", None, True, CAUSAL) for a in ("gfx942", "gfx950")]
    assert torch.equal(ref.bf16_bits(outs[0][0]), ref.bf16_bits(outs[1][0]))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))
    p = vs.to_paged(vs.make_batch([1, 5], [70, 200], 8, 2, 128, "cpu", seed=2), 16, seed=2)
    res = []
    for a in ("gfx942", "gfx950"):
        with on(a):
            res.append(vs.run(p, "rtne", CAUSAL))
    assert torch.equal(ref.bf16_bits(res[0][0]), ref.bf16_bits(res[1][0]))
    assert torch.equal(res[0][1].view(torch.int32), res[1][1].view(torch.int32))


# ---- bad metadata: the launch must complete (the emulator checks every access) ------------------------------------

@pytest.mark.parametrize("splits", [0, 3])
def test_bad_metadata_stays_inside_the_tensors(splits):
    b = vs.make_batch([5, 16, 9], [100, 60, 130], 4, 2, 128, "cpu", seed=8)
    t_q, t_k = b.q.shape[0], b.k.shape[0]
    cus = [([0, 5, 2, t_q], [0, 100, 30, t_k]),                    # decreasing offsets
           ([0, 5, 21, t_q + 400], [0, 100, 160, t_k + 999]),      # past the totals
           ([-70, 10, 21, t_q], [-5, 100, -3, 2 ** 31 - 1]),       # negative, huge
           ([0, 30, 30, 30], [0, 290, 290, 290])]                  # a sequence longer than max_seqlen
    paged = vs.to_paged(b, 16, seed=8)
    n = paged.k.shape[0]
    tables = [paged.block_table.clone() for _ in range(3)]
    tables[0][0, 2], tables[0][2, 0] = -1, -(2 ** 31)            # negative ids
    tables[1][1, 1], tables[1][2, 3] = n, 2 ** 31 - 1            # past the pool
    tables[2][:] = n + 5                                         # nothing valid
    with on(tail_split=splits):
        for cu_q, cu_k in cus:
            bad = vs.Batch(b.q, b.k, b.v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
                           b.max_q, b.max_k)
            out, lse = vs.run(bad, "rtne", CAUSAL)
            assert out.shape == b.q.shape and lse.shape == (4, t_q)
        for table in tables:
            vs.run(vs.Batch(paged.q, paged.k, paged.v, paged.cu_q, paged.cu_k, paged.max_q, paged.max_k, table))
        for cu_k in ([0, 100, 60, 9000], [0, 2 ** 31 - 1, 3, 5], [-9, 100, 160, 290]):
            vs.run(vs.Batch(paged.q, paged.k, paged.v, paged.cu_q, torch.tensor(cu_k, dtype=torch.int32), paged.max_q,
                            paged.max_k, paged.block_table), "rtne", (5, 0))


# ---- dispatch -----------------------------------------------------------------------------------------------------

def test_small_workspace_is_refused():
    """A split call's partials need the workspace the plan sizes: a launch given a byte less is refused by name, before
    anything runs."""
    q, k, v = suite.make_qkv("bshd", 1, 8, 1, 300, 128, "cpu")
    out = torch.empty_like(q)
    kv = dict(heads_k=2, window_left=-1, window_right=0)
    strides = [(t.stride(0), t.stride(1), t.stride(2)) for t in (q, k[:, :, :2], v[:, :, :2], out)]
    args = _lib.op_args(attention_fwd.OP, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
                        q_strides=strides[0], k_strides=strides[1], v_strides=strides[2], o_strides=strides[3],
                        batch=1, heads=8, seq_q=1, seq_k=300, head_dim=128, softmax_scale=0.1, tail_split=3,
                        num_cus=CUS, **kv)
    need = _lib.op_workspace_bytes(attention_fwd.OP, KERNEL, args)
    assert need == 2 * 3 * 16 * (128 + 2) * 4, need  # 2 items x 3 parts: O [16][128], m and l in fp32
    ws = torch.empty(need - 1, dtype=torch.uint8)
    args.workspace, args.workspace_bytes = ws.data_ptr(), need - 1
    call = {"round_mode": "rtne", "mask": "window", "kv": "dense", "head_dim": 128, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}
    variant = manifest.load().variant_for(attention_fwd.OP, KERNEL, "gfx942-emu", call)
    with pytest.raises(ValueError, match=rf"workspace_bytes={need - 1} is too small for the gfx942_decode kernel; "
                                         rf"accepted: >= {need} \(rtc_op_workspace_bytes with the same args\)"):
        _lib.op_launch(dispatch.build(variant).program, attention_fwd.OP, KERNEL, args, "host", 0)


def test_dispatch_picks_the_decode_kernel_for_decode_calls_only(monkeypatch):
    """Up to 16 query rows per sequence (dense seq_q, packed max_seqlen_q) run on the decode kernel, more on the
    prefill kernel, for every form and both dtypes; the refusal names the argument and what is accepted."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    for dtype in DTYPES.values():
        for sq, kernel in ((1, KERNEL), (MAX_Q, KERNEL), (MAX_Q + 1, "gfx942")):
            q, k, v = suite.make_qkv("bshd", 2, 8, sq, 300, 128, "cpu", hk=2, dtype=dtype)
            assert attention_fwd.selection(q, k, v).kernel.name == kernel, sq
            sel = attention_fwd.selection(q, k, v, window=CAUSAL)
            assert sel.kernel.name == kernel, sq
            if kernel == "gfx942":
                assert f"{KERNEL}: seq_q={sq} is not accepted by the {KERNEL} kernel; accepted: at most 16" in sel.why
            b = vs.make_batch([1, sq], [20, 40], 8, 2, 128, "cpu", dtype=dtype)
            p = vs.to_paged(b, 16)
            svl = attention_fwd.selection_varlen
            assert svl(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k).kernel.name == kernel
            assert svl(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=CAUSAL,
                       block_table=p.block_table).kernel.name == kernel
