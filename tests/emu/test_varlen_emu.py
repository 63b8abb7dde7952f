"""Packed sequences (varlen) and paged KV on the emulator: the gfx942 kernel (and the baseline, fewer cases) pinned.

Each accuracy case is checked per sequence against the fp64 reference (tests/varlen_suite.py): length
mixes with 0, 1, sub-tile and > 384 rows, a batch of one, 40 short sequences, causal / windows, GQA and
the three round modes. Paged calls (pages of 16..256 rows, shuffled, spare pages of junk, block tables
longer than needed) must equal the packed call bit for bit. A max_seqlen_k below real KV lengths only
sizes the launch: every key still counts, and the paged V^T workspace is sized by the block table. Bad
metadata (decreasing or out-of-range cu_seqlens, block ids out of the pool, lengths past max_seqlen) must
only complete: the emulator fails a launch on any access outside the tensors, the workspace or the
metadata, so completing is the proof of memory safety.
"""
from dataclasses import replace

import pytest
import torch

import numerics_suite as suite
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref, validate
from rtcattn.runtime import dispatch

CUS = dispatch.emulated_cus("gfx942-emu")  # the emulated MI300X

pytestmark = pytest.mark.emu

ACCURACY = [  # (lens_q, lens_k, (Hq, Hk), window, mode)
    ([0, 1, 17, 100, 385, 700], [5, 1, 64, 65, 130, 800], (2, 1), (-1, -1), "rtne"),
    ([0, 1, 17, 100, 385, 700], [5, 1, 64, 65, 130, 800], (4, 2), (-1, 0), "rtna"),
    ([300, 50, 64], [40, 200, 0], (2, 2), (17, 3), "rtz"),       # rows that see no key, a sequence without keys
    ([777], [777], (2, 2), (-1, 0), "rtne"),                     # a batch of one
    ([450, 90], [1000, 90], (8, 1), (100, -1), "rtna"),          # MQA, one-sided window
]
PAGES = [16, 32, 64, 128, 256]


@pytest.fixture
def pin(monkeypatch):
    """Runs the calls of the test on the emulated gfx942 with `kernel` pinned (no fallback)."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")

    def pinned(kernel="gfx942", **args):
        return dispatch.pinned(kernel=kernel, **args)
    return pinned


def many_short(n=40, seed=5):
    gen = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(0, 40, (n,), generator=gen).tolist()
    lens_k = torch.randint(1, 90, (n,), generator=gen).tolist()
    return vs.make_batch(lens_q, lens_k, 2, 1, 128, "cpu", seed=seed)


def test_packed_calls_select_the_gfx942_kernel(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    b = vs.make_batch([10, 30], [20, 40], 4, 2, 128, "cpu")
    p = vs.to_paged(b, 16)
    sel = attention_fwd.selection_varlen
    assert sel(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q,
               b.max_k).variant.name == "gfx942-rtne-none-varlen-d128-bf16-same-plain-nodrop"
    assert sel(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, window=(-1, 0),
               block_table=p.block_table).variant.name == "gfx942-rtne-window-paged-d128-bf16-same-plain-nodrop"
    b64 = vs.make_batch([10, 30], [20, 40], 4, 2, 64, "cpu")
    assert sel(b64.q, b64.k, b64.v, b64.cu_q, b64.cu_k, b64.max_q, b64.max_k).variant.name == \
        "gfx942-rtne-none-varlen-d64-bf16-same-plain-nodrop"


@pytest.mark.parametrize("lens_q,lens_k,heads,window,mode", ACCURACY, ids=[str(c[3]) + c[4] for c in ACCURACY])
def test_gfx942_varlen_against_fp64(pin, lens_q, lens_k, heads, window, mode):
    b = vs.make_batch(lens_q, lens_k, *heads, 128, "cpu", seed=len(lens_q))
    with pin():
        vs.check_accuracy(b, mode, window, what="gfx942")


def test_gfx942_many_short_sequences(pin):
    b = many_short()
    with pin():
        vs.check_accuracy(b, "rtne", (-1, 0), what="gfx942 40 sequences")


@pytest.mark.parametrize("page", PAGES)
def test_gfx942_paged_equals_packed(pin, page):
    i = PAGES.index(page)
    b = vs.make_batch([70, 1, 400, 0][: 2 + i % 3], [300, 17, 520, 64][: 2 + i % 3], 4, 2, 128, "cpu", seed=page)
    window = [(-1, -1), (-1, 0), (33, 5)][i % 3]
    with pin():
        vs.check_paged_equals_packed(b, page, suite.MODES[i % 3], window, seed=i)


def test_gfx942_paged_against_fp64(pin):
    b = vs.to_paged(vs.make_batch([130, 5, 0], [200, 33, 7], 4, 1, 128, "cpu", seed=3), 32, seed=3)
    with pin():
        vs.check_accuracy(b, "rtna", (-1, 0), what="gfx942 paged")


def test_gfx942_out_lse_and_determinism(pin):
    b = vs.make_batch([5, 390, 64], [100, 390, 1], 4, 2, 128, "cpu", seed=9)
    with pin():
        vs.check_out_and_determinism(b, "rtz", (-1, 0))
        vs.check_out_and_determinism(vs.to_paged(b, 16, seed=9), "rtne")


def test_gfx90a_emulation_agrees_bit_for_bit(pin, monkeypatch):
    b = vs.make_batch([17, 400], [90, 450], 4, 2, 128, "cpu", seed=4)
    with pin():
        a = vs.run(b, "rtne", (-1, 0))
        monkeypatch.setenv("RTCATTN_EMULATE", "gfx90a")
        c = vs.run(b, "rtne", (-1, 0))
    assert torch.equal(ref.bf16_bits(a[0]), ref.bf16_bits(c[0])) and torch.equal(a[1].view(torch.int32),
                                                                                  c[1].view(torch.int32))


def test_out_of_pool_page_reads_as_zeros(pin):
    """A block-table id outside the pool reads zeros: the same as the packed call with those rows zeroed."""
    b = vs.make_batch([90, 40], [100, 40], 2, 1, 128, "cpu", seed=6)
    paged = vs.to_paged(b, 32, seed=6)
    paged.block_table[0, 1] = -1                      # rows 32..63 of sequence 0
    paged.block_table[1, 0] = paged.k.shape[0] + 7    # rows 0..31 of sequence 1
    zeroed = vs.Batch(b.q, b.k.clone(), b.v.clone(), b.cu_q, b.cu_k, b.max_q, b.max_k)
    for rows in (slice(32, 64), slice(100, 132)):
        zeroed.k[rows] = 0
        zeroed.v[rows] = 0
    with pin():
        o1, l1 = vs.run(zeroed, "rtne")
        o2, l2 = vs.run(paged, "rtne")
    assert torch.equal(ref.bf16_bits(o1), ref.bf16_bits(o2)) and torch.equal(l1.view(torch.int32), l2.view(torch.int32))


def test_packed_tail_split_is_refused_with_a_reason(pin):
    b = vs.make_batch([10], [10], 1, 1, 128, "cpu")
    with pin(tail_split=3), pytest.raises(ValueError, match="tail_split=3 .*packed"):
        vs.run(b)


def test_workspace_is_sized_without_reading_cu_seqlens(pin):
    from rtcattn.runtime import _lib
    b = vs.make_batch([10, 200, 3], [70, 129, 1], 4, 2, 128, "cpu")
    p = validate.check_varlen_inputs(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k)
    args = attention_fwd.args_block_varlen(b.q, b.k, b.v, None, b.cu_q, b.cu_k, None, p,
                                           dispatch.arch_fields("gfx942-emu", CUS))
    # Hk * (ceil(total_k / 64) + batch) blocks of 16 KiB: 2 * (4 + 3)
    assert _lib.op_workspace_bytes("attention_fwd", "gfx942", args) == 2 * 7 * 16384


# ---- max_seqlen_k only sizes the launch: every kernel uses each sequence's real keys --------------------

SHORT_MAX_K = [  # (lens_q, lens_k, (Hq, Hk), max_seqlen_k, window)
    ([33], [100], (2, 2), 50, (-1, -1)),                                   # the reported call
    ([5, 40, 1, 0, 70], [450, 70, 129, 20, 1], (2, 1), 1, (-1, 0)),       # 1 against several hundred keys
]


@pytest.mark.parametrize("kernel", vs.packed_kernels("gfx942-emu"))
@pytest.mark.parametrize("kv", ["varlen", "paged"])
@pytest.mark.parametrize("lens_q,lens_k,heads,max_k,window", SHORT_MAX_K, ids=["50of100", "1ofmany"])
def test_max_seqlen_k_below_the_real_lengths(pin, kernel, kv, lens_q, lens_k, heads, max_k, window):
    """The keys of sequence b are cu_seqlens_k[b]:cu_seqlens_k[b+1] whatever max_seqlen_k says (paged:
    pages of 32 rows, a table longer than needed). A decode kernel (one that leaves calls with more query rows to
    the prefill kernel at run time) gets the same keys with at most 16 query rows per sequence."""
    from rtcattn.runtime import manifest
    if manifest.load().op("attention_fwd").kernel(kernel).declines_at_run_time:
        lens_q = [min(n, 16) for n in lens_q]
    b = vs.make_batch(lens_q, lens_k, *heads, 128, "cpu", seed=len(lens_k))
    if kv == "paged":
        b = vs.to_paged(b, 32, seed=len(lens_k))
    with pin(kernel):
        vs.check_short_max_seqlen_k(b, max_k, "rtne", window, what=f"{kernel} {kv}")


def test_paged_workspace_is_sized_by_the_block_table(pin):
    """Paged V^T holds every key the block table can address (seq_of clamps a length to it), not max_seqlen_k."""
    from rtcattn.runtime import _lib
    b = vs.to_paged(vs.make_batch([10, 3], [70, 300], 4, 2, 128, "cpu"), 32)
    pages = b.block_table.shape[1]
    p = validate.check_varlen_inputs(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, 1,
                                                                block_table=b.block_table)
    args = attention_fwd.args_block_varlen(b.q, b.k, b.v, None, b.cu_q, b.cu_k, b.block_table, p,
                                           dispatch.arch_fields("gfx942-emu", CUS))
    # Hk * B * ceil(pages * 32 / 64) blocks of 16 KiB
    assert _lib.op_workspace_bytes("attention_fwd", "gfx942", args) == 2 * 2 * -(-pages * 32 // 64) * 16384


def test_paged_workspace_larger_than_the_device_is_refused(pin, monkeypatch):
    """A block table that addresses more keys than the V^T workspace can hold on the device: a clear error
    naming the sizes, before anything is allocated."""
    from rtcattn.runtime import dispatch
    b = vs.to_paged(vs.make_batch([10, 3], [70, 300], 4, 2, 128, "cpu"), 32)
    wide = torch.zeros((2, 4096), dtype=torch.int32)     # 2 x 4096 x 32 keys: 2 * 2 * 2048 * 16 KiB = 128 MiB
    wide[:, : b.block_table.shape[1]] = b.block_table
    monkeypatch.setattr(dispatch, "_memory_bytes", lambda device: 64 << 20)
    with pin(), pytest.raises(ValueError, match=r"workspace of kernel gfx942 of 134217728 bytes .*pages_per_seq=4096"):
        vs.run(replace(b, block_table=wide))


def test_a_table_past_what_v_transpose_offsets_reach_is_refused(pin):
    """The gfx942 kernel addresses one sequence's V^T with 32-bit offsets: 2^24 keys per sequence at most."""
    b = vs.make_batch([4], [4], 1, 1, 128, "cpu")
    pool = torch.zeros((1, 1 << 16, 1, 128), dtype=torch.bfloat16)
    table = torch.zeros((1, 257), dtype=torch.int32)     # 257 pages of 2^16 rows: past 2^24 keys
    with pin(), pytest.raises(ValueError, match=r"block_table.shape\[1\]\*page_size=257\*65536"):
        attention_fwd.selection_varlen(b.q, pool, pool, b.cu_q, b.cu_k, 4, 4, block_table=table)


# ---- bad metadata: the launch must complete (the emulator checks every access) -------------------------

def bad_varlen_cases():
    b = vs.make_batch([50, 30, 90], [100, 60, 130], 4, 2, 128, "cpu", seed=8)
    t_q, t_k = b.q.shape[0], b.k.shape[0]
    return b, [
        ([0, 50, 20, t_q], [0, 100, 30, t_k]),                   # decreasing offsets
        ([0, 50, 80, t_q + 400], [0, 100, 160, t_k + 999]),      # past the totals
        ([-70, 10, 80, t_q], [-5, 100, -3, 2 ** 31 - 1]),        # negative, huge
        ([0, 170, 170, 170], [0, 290, 290, 290]),                # one sequence longer than max_seqlen
    ]


@pytest.mark.parametrize("kernel", ["gfx942", "baseline"])
def test_bad_cu_seqlens_stay_inside_the_tensors(pin, kernel):
    b, cases = bad_varlen_cases()
    with pin(kernel):
        for cu_q, cu_k in cases:
            bad = vs.Batch(b.q, b.k, b.v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
                           b.max_q, b.max_k)
            out, lse = vs.run(bad, "rtne", (-1, 0))
            assert out.shape == b.q.shape and lse.shape == (4, b.q.shape[0])


@pytest.mark.parametrize("kernel", ["gfx942", "baseline"])
def test_bad_block_tables_stay_inside_the_pool(pin, kernel):
    b = vs.make_batch([50, 30, 90], [100, 60, 130], 4, 2, 128, "cpu", seed=8)
    paged = vs.to_paged(b, 16, seed=8)
    n = paged.k.shape[0]
    tables = [paged.block_table.clone() for _ in range(3)]
    tables[0][0, 2], tables[0][2, 0] = -1, -(2 ** 31)            # negative ids
    tables[1][1, 1], tables[1][2, 3] = n, 2 ** 31 - 1            # past the pool
    tables[2][:] = n + 5                                         # nothing valid
    with pin(kernel):
        for table in tables:
            vs.run(vs.Batch(paged.q, paged.k, paged.v, paged.cu_q, paged.cu_k, paged.max_q, paged.max_k, table))
        # lengths past what the table row holds, decreasing and huge offsets
        for cu_k in ([0, 100, 60, 9000], [0, 2 ** 31 - 1, 3, 5], [-9, 100, 160, 290]):
            vs.run(vs.Batch(paged.q, paged.k, paged.v, paged.cu_q, torch.tensor(cu_k, dtype=torch.int32), paged.max_q,
                            paged.max_k, paged.block_table), "rtne", (-1, 0))


# ---- the baseline kernel through the same checks -------------------------------------------------------

def test_baseline_varlen_and_paged(pin):
    b = vs.make_batch([0, 1, 17, 100], [5, 1, 64, 130], 4, 2, 128, "cpu", seed=2)
    with pin("baseline"):
        vs.check_accuracy(b, "rtna", (-1, 0), what="baseline")
        vs.check_paged_equals_packed(b, 32, "rtne", (17, 3))
        vs.check_out_and_determinism(b, "rtz")
