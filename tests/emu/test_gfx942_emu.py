"""The gfx942 fast kernel on the wave emulator: numerics contract, tail split forced on and off, gfx942 = gfx90a bit
for bit.

Size design (a Latin square, to stay near 2 minutes on 2 cores): S = (1, 17, 100, 384, 385, 1000).
Every layout x mode x split (off, forced on) runs the diagonal (s_i, s_i) plus one cyclic shift
(s_i, s_(i+d) mod 6), so each size appears twice as Sq and twice as Sk in every combination, self
and cross attention. The shift d walks 1..5 over the six (mode, split) combinations, and bhsd swaps
the split of bshd, so per layout all 36 (Sq, Sk) pairs run, and each shift runs with the split off
in one layout and forced on in the other. Any out-of-bounds access or LDS race fails the emulated
launch, so a passing test also means none was reported.
"""
import pytest
import torch

import gfx942_driver as drv
import numerics_suite as suite
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch

pytestmark = pytest.mark.emu

SIZES = (1, 17, 100, 384, 385, 1000)
SPLITS = (0, 3)  # off, forced into 3 parts (capped at the number of kv blocks)


def runner(tail_split, arch="gfx942"):
    def run(q, k, v, layout, mode, scale, lse):
        return drv.forward(q, k, v, layout, mode, scale, lse, arch=arch, tail_split=tail_split)
    return run


def size_pairs(layout, mode, tail_split):
    """The diagonal plus the cyclic shift d of this (layout, mode, split), as in the docstring."""
    combo = 2 * suite.MODES.index(mode) + SPLITS.index(tail_split)
    d = 1 + ((combo ^ 1) if layout == "bhsd" else combo) % 5
    n = len(SIZES)
    return [(s, s) for s in SIZES] + [(SIZES[i], SIZES[(i + d) % n]) for i in range(n)]


def test_size_design_covers_every_size_and_pair():
    for layout in suite.LAYOUTS:
        seen = {}
        for mode in suite.MODES:
            for split in SPLITS:
                pairs = size_pairs(layout, mode, split)
                for axis in (0, 1):
                    assert sorted(p[axis] for p in pairs) == sorted(2 * SIZES), (layout, mode, split, pairs)
                for p in pairs:
                    seen.setdefault(p, set()).add(split)
        assert len(seen) == len(SIZES) ** 2, (layout, sorted(seen))
    for layout, other in (("bshd", "bhsd"), ("bhsd", "bshd")):
        for mode in suite.MODES:
            for split in SPLITS:
                shifted = set(size_pairs(layout, mode, split)[len(SIZES):])
                assert any(shifted == set(size_pairs(other, m, s)[len(SIZES):]) for m in suite.MODES for s in SPLITS
                           if s != split), (layout, mode, split)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
@pytest.mark.parametrize("mode", suite.MODES)
@pytest.mark.parametrize("tail_split", SPLITS)
def test_sizes_cross_attention_and_lse(layout, mode, tail_split):
    for i, (sq, sk) in enumerate(size_pairs(layout, mode, tail_split)):
        q, k, v = suite.make_qkv(layout, 1, 2, sq, sk, 128, "cpu", seed=40 + i)
        suite.check_accuracy(runner(tail_split), q, k, v, layout, mode, what=f"split={tail_split}")


@pytest.mark.parametrize("layout", suite.LAYOUTS)
@pytest.mark.parametrize("tail_split", SPLITS)
def test_special_values(layout, tail_split):
    for mode in suite.MODES:
        suite.check_special_values(runner(tail_split), "cpu", layout, mode, sq=20, sk=300, d=128)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
@pytest.mark.parametrize("tail_split", SPLITS)
def test_strided_views_and_determinism(layout, tail_split):
    suite.check_strided(runner(tail_split), "cpu", layout, "rtna", sq=37, sk=300, d=128)
    suite.check_determinism(runner(tail_split), "cpu", layout, "rtz")


def test_softmax_scale_and_split_both_meet_the_contract():
    q, k, v = suite.make_qkv("bhsd", 2, 1, 130, 700, 128, "cpu", seed=9)
    outs = [suite.check_accuracy(runner(s), q, k, v, "bhsd", "rtne", scale=0.05, what=f"split={s}") for s in SPLITS]
    assert all(nrm < 1e-2 for _, nrm in outs)
    # The split really ran: a different summation order, so some bits differ from the unsplit run.
    a = drv.forward(q, k, v, "bhsd", "rtne", 0.05, tail_split=0)
    b = drv.forward(q, k, v, "bhsd", "rtne", 0.05, tail_split=5)
    assert not torch.equal(ref.bf16_bits(a), ref.bf16_bits(b))


@pytest.mark.parametrize("tail_split", SPLITS)
def test_gfx942_and_gfx90a_agree_bit_for_bit(tail_split):
    q, k, v = suite.make_qkv("bshd", 1, 2, 77, 450, 128, "cpu", seed=3)
    outs = [drv.forward(q, k, v, "bshd", "rtne", None, True, arch=a, tail_split=tail_split)
            for a in ("gfx942", "gfx90a")]
    assert torch.equal(ref.bf16_bits(outs[0][0]), ref.bf16_bits(outs[1][0]))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))


def test_gfx950_agrees_with_gfx942_bit_for_bit():
    """gfx950 (CDNA4) keeps CDNA3's MFMA and buffer loads: the same source on the gfx950 emulator target gives the
    gfx942 build's bits (output and LSE), with a split."""
    q, k, v = suite.make_qkv("bshd", 1, 2, 77, 450, 128, "cpu", seed=3)
    outs = [drv.forward(q, k, v, "bshd", "rtne", None, True, arch=a, tail_split=3) for a in ("gfx942", "gfx950")]
    assert torch.equal(ref.bf16_bits(outs[0][0]), ref.bf16_bits(outs[1][0]))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))


def test_small_workspace_is_refused():
    from rtcattn.runtime import _lib, manifest
    q, k, v = suite.make_qkv("bshd", 1, 1, 10, 10, 128, "cpu")
    out = torch.empty_like(q)
    strides = [(t.stride(0), t.stride(1), t.stride(2)) for t in (q, k, v, out)]
    args = _lib.op_args("attention_fwd", q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
                        q_strides=strides[0], k_strides=strides[1], v_strides=strides[2], o_strides=strides[3],
                        batch=1, heads=1, seq_q=10, seq_k=10, head_dim=128, heads_k=1, window_left=-1, window_right=-1,
                        softmax_scale=0.1, tail_split=0,
                        num_cus=dispatch.emulated_cus("gfx942-emu"))
    need = _lib.op_workspace_bytes("attention_fwd", "gfx942", args)
    assert need == 16384  # one 64-row V^T block, no split
    ws = torch.empty(need - 1, dtype=torch.uint8)
    args.workspace, args.workspace_bytes = ws.data_ptr(), need - 1
    call = {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}
    v128 = manifest.load().variant_for("attention_fwd", "gfx942", "gfx942-emu", call)
    with pytest.raises(ValueError, match=r"workspace_bytes=16383 is too small for the gfx942 kernel; accepted: "
                                         r">= 16384 \(rtc_op_workspace_bytes with the same args\)"):
        _lib.op_launch(dispatch.build(v128).program, "attention_fwd", "gfx942", args, "host", 0)
