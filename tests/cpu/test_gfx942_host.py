"""The gfx942 kernel's host side per head-dim bucket (jit/ops/attention_fwd/gfx942.cpp): the plan (q rows per work
item, V^T blocks, split partials, grids) follows the call's bucket, and what the kernel cannot take is refused by
name before anything is launched. No device: fake addresses, the runtime's plan and check only."""
import math

import pytest

from rtcattn.runtime import _lib, manifest

OP = "attention_fwd"
CUS = 304
BUCKETS = list(manifest.load().op(OP).kernel("gfx942").axes["head_dim"].buckets)
Q_ROWS = {64: 384, 96: 384, 128: 384, 192: 256, 256: 128}  # 8 waves x 16 rows x q tiles per wave (3, 3, 3, 2, 1)


def args(b, h, sq, sk, d, tail_split=-1, max_splits=0):
    st = (sk * h * d, h * d, d)  # bshd, contiguous
    return _lib.op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, q_strides=st, k_strides=st, v_strides=st,
                        o_strides=st, batch=b, heads=h, seq_q=sq, seq_k=sk, head_dim=d, heads_k=h, window_left=-1,
                        window_right=-1, softmax_scale=0.1, tail_split=tail_split, num_cus=CUS, max_splits=max_splits)


def bucket_of(d):
    return next(x for x in BUCKETS if x >= d)


@pytest.mark.parametrize("d", [8, 40, 64, 72, 96, 104, 128, 136, 160, 192, 200, 256])
def test_plan_follows_the_bucket(d):
    a = args(2, 5, 3000, 5000, d)
    p = _lib.op_plan(OP, "gfx942", a)
    b = bucket_of(d)
    assert p["bucket"] == b and p["q_rows"] == Q_ROWS[b], p
    assert p["nqb"] == math.ceil(3000 / Q_ROWS[b]) and p["nkb"] == math.ceil(5000 / 64), p
    assert p["vt_bytes"] == 2 * 5 * p["nkb"] * 64 * b * 2, p  # a V^T block: 64 keys x the bucket's columns
    assert p["grid_attn"] == p["n_prefix"] + p["tail"] * p["split_g"] and p["grid_vt"] == 2 * 5 * p["nkb"], p
    # A forced split: the partials hold q rows x (the bucket's columns + m + l) in fp32, merged 16 rows a workgroup.
    f = _lib.op_plan(OP, "gfx942", args(2, 5, 3000, 5000, d, tail_split=4))
    assert f["split_g"] == 4 and f["workspace_bytes"] == f["vt_bytes"] + f["tail"] * 4 * Q_ROWS[b] * (b + 2) * 4
    assert f["grid_merge"] == f["tail"] * Q_ROWS[b] // 16, f
    assert _lib.op_supports(OP, "gfx942", a, "hip") is None


@pytest.mark.parametrize("d", [4, 12, 60, 100, 250])
def test_a_head_dim_off_the_multiples_of_8_is_refused_naming_the_buckets(d):
    """The Python layer pads these; the runtime refuses them unpadded, naming what it takes."""
    why = _lib.op_supports(OP, "gfx942", args(1, 2, 100, 100, d), "hip")
    assert why == (f"head_dim={d} is not accepted by the gfx942 kernel; accepted: a multiple of 8 from 8 to 256 "
                   f"(buckets {', '.join(map(str, BUCKETS))})"), why


def test_v_transpose_offsets_bound_the_keys_per_bucket():
    """A (batch, head)'s V^T is read at 32-bit offsets through a resource of 2^32 - 1 bytes: (2^32 - 1) // (64 keys x
    bucket x 2 bytes) blocks of 64 keys, fewer keys at 256 (131071 blocks) than at 128 (262143). 9 000 000 keys: K
    spans under 4 GiB at D 128 and 200, V^T does not at 200 (bucket 256)."""
    assert _lib.op_supports(OP, "gfx942", args(1, 1, 64, 9_000_000, 128), "hip") is None
    most = (2**32 - 1) // (64 * 256 * 2) * 64
    why = _lib.op_supports(OP, "gfx942", args(1, 1, 64, 9_000_000, 200), "hip")
    assert why == ("seq_k=9000000 is not accepted by the gfx942 kernel at head dim 200 (it reads V^T at 32-bit "
                   f"offsets); accepted: at most {most}"), why
    assert _lib.op_supports(OP, "gfx942", args(1, 1, 64, most, 200), "hip") is None
    assert _lib.op_supports(OP, "gfx942", args(1, 1, 64, most + 1, 200), "hip") is not None


def test_max_splits_caps_the_planned_tail_split():
    """100 (b, h) x 22 q blocks = 2200 items on 304 CUs leave a tail of 72 items the planner splits in 4: max_splits n
    caps the parts (1: no split), an n past the planner's pick changes nothing, a forced split wins."""
    planned = _lib.op_plan(OP, "gfx942", args(1, 100, 8192, 8192, 128))
    assert planned["tail"] == 72 and planned["split_g"] == 4, planned
    for n, g in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 4), (100, 4)):
        p = _lib.op_plan(OP, "gfx942", args(1, 100, 8192, 8192, 128, max_splits=n))
        assert p["split_g"] == g and p["tail"] == (72 if g > 1 else 0), (n, p)
        assert p["grid_attn"] == p["n_prefix"] + p["tail"] * g, p
    assert _lib.op_plan(OP, "gfx942", args(1, 100, 8192, 8192, 128, tail_split=6, max_splits=2))["split_g"] == 6
