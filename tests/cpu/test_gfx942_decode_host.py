"""The gfx942 decode kernel's host side (jit/ops/attention_fwd/gfx942_decode.cpp): the plan (packed rows per K/V head,
KV steps, the split planner and a forced split, the partials' workspace, grids) and what the kernel refuses, by name,
before anything is launched. No device: fake addresses, the runtime's plan and check only."""
import functools
import math

import pytest
import torch

from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import stub, validate
from rtcattn.runtime import _lib, manifest

OP = "attention_fwd"
KERNEL = "gfx942_decode"
CUS = 304
BUCKETS = list(manifest.load().op(OP).kernel(KERNEL).axes["head_dim"].buckets)
STEP_KEYS = {64: 64, 96: 32, 128: 32, 192: 32, 256: 16}  # 16-key sub-tiles per step: 4, 2, 2, 2, 1


def args(b, hq, hk, sq, sk, d, tail_split=-1, st=None, cus=CUS, max_splits=0, **machine):
    qs = st or (sq * hq * d, hq * d, d)  # bshd, contiguous
    ks = (sk * hk * d, hk * d, d)
    return _lib.op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, q_strides=qs, k_strides=ks, v_strides=ks,
                        o_strides=qs, batch=b, heads=hq, seq_q=sq, seq_k=sk, head_dim=d, heads_k=hk, window_left=-1,
                        window_right=-1, softmax_scale=0.1, tail_split=tail_split, num_cus=cus,
                        max_splits=max_splits, **machine)


def bucket_of(d):
    return next(x for x in BUCKETS if x >= d)


@pytest.mark.parametrize("d", [8, 64, 72, 128, 160, 256])
def test_plan_follows_the_bucket_and_the_group(d):
    b = bucket_of(d)
    p = _lib.op_plan(OP, KERNEL, args(4, 32, 8, 4, 4096, d, tail_split=0))
    assert p["bucket"] == b and p["group"] == 4 and p["chunks"] == 1 and p["items"] == 4 * 8, p  # 4 x 4 rows
    assert p["step_keys"] == STEP_KEYS[b] and p["steps"] == math.ceil(4096 / STEP_KEYS[b]), p
    assert p["splits"] == 1 and p["workspace_bytes"] == 0 and p["grid_attn"] == 32 and "grid_merge" not in p, p
    f = _lib.op_plan(OP, KERNEL, args(4, 32, 8, 4, 4096, d, tail_split=5))
    # The merge: one workgroup per item and 16-column tile of O.
    assert f["splits"] == 5 and f["grid_attn"] == 32 * 5 and f["grid_merge"] == 32 * math.ceil(d / 16), f
    assert f["workspace_bytes"] == 32 * 5 * 16 * (b + 2) * 4, f  # per part: O [16][bucket], m, l in fp32
    mqa = _lib.op_plan(OP, KERNEL, args(1, 32, 1, 3, 100, d, tail_split=0))
    assert mqa["chunks"] == 6 and mqa["items"] == 6, mqa  # 32 heads x 3 rows = 96 packed rows
    # More than one chunk: the units (parts of a (sequence, K/V head)) rounded up to 8, each unit's chunks on one XCD.
    assert mqa["grid_attn"] == 8 * 6, mqa
    assert _lib.op_plan(OP, KERNEL, args(3, 32, 1, 3, 100, d, tail_split=3))["grid_attn"] == 16 * 6


def planned_ns(items, rows, steps, g, d=128, chunks=1, kv_dtype=0, gbps=5300, lds=64 * 1024, cus=CUS, gfx=0):
    """The planner's estimate (jit/ops/attention_fwd/gfx942_decode.cpp, split_ns), restated: HBM (the device's gbps,
    MI300X's 5.3 TB/s where the argument block does not say: the KV bytes, and with a split the partials of the call's
    q rows written and read back, (d + 2) fp32 a row a part) or the waves' parts, whichever is longer, + the merge's
    round trips (16 parts a trip per part group). A 16-bit cache: each step a 2 us round trip + 0.2 us of S^T MFMAs,
    in rounds of the resident waves per CU: 2 a SIMD up to 128 (3 on gfx950: gfx 0x950) and 1 above (FP4: 2), as
    many as the CU's LDS (lds bytes, 64 KB where the block does not say) holds at the bucket's d x 40
    bytes a wave (64 KB: 6 FP4 waves at 256). FP8 (d bytes a row): each step a round trip + 0.8 us (the expansion
    too). FP4 (d/2 + 1 bytes a row, its scale): three steps in flight (at 256 two but on gfx942 and gfx950) share a
    round trip, so a part of n steps takes n x (2 us / a + 0.8 us) + the first round trip's rest, (a - 1) / a of it
    (part_ns)."""
    fp4 = kv_dtype == 3
    step_keys = STEP_KEYS[d]
    waves = min(4 * ((3 if gfx == 0x950 else 2) if d <= 128 else 2 if fp4 else 1), lds // (d * 40))
    row_bytes = d / 2 + 1 if fp4 else d if kv_dtype else 2 * d
    partials = 2 * rows * g * (d + 2) * 4 if g > 1 else 0
    hbm = (items // chunks * steps * 2 * step_keys * row_bytes + partials) / gbps
    n = math.ceil(steps / g)
    a = 3 if d <= 192 or gfx in (0x942, 0x950) else 2
    part = n * (2000.0 / a + 800.0) + 2000.0 * (a - 1) / a if fp4 else n * 2800.0 if kv_dtype else n * 2200.0
    steps_ns = math.ceil(items * g / (cus * waves)) * part
    groups = 16 // next(r for r in (1, 2, 4, 8, 16) if r >= min(rows * chunks // items, 16))  # merge lanes
    return max(hbm, steps_ns) + (math.ceil(g / (16 * groups)) * 2000.0 if g > 1 else 0.0)


@pytest.mark.parametrize("b,hk,sk,d", [(1, 8, 131072, 128), (32, 8, 4096, 128), (8, 8, 32768, 128),
                                       (256, 8, 1024, 128), (1, 8, 200, 128), (1, 8, 131072, 256),
                                       (32, 8, 4096, 64), (64, 8, 8192, 128)])
def test_the_planner_takes_the_fewest_parts_of_least_estimated_time(b, hk, sk, d):
    p = _lib.op_plan(OP, KERNEL, args(b, 32, hk, 1, sk, d))
    items, rows, steps = b * hk, b * 32, math.ceil(sk / STEP_KEYS[d])
    best = min(range(1, max(min(steps // 4, 1024), 1) + 1), key=lambda g: (planned_ns(items, rows, steps, g, d), g))
    assert p["splits"] == best, (b, hk, sk, d, p)
    assert abs(p["planned_ns"] - planned_ns(items, rows, steps, best, d)) <= 1, p


def paged_quant(kv_dtype, b, hk, sk, d, page=16, cus=CUS, **machine):
    """A paged decode call over an FP8 (kv_dtype 1) or FP4 E2M1 + E8M0 (3) cache (fake addresses): b sequences of sk
    keys, one query row."""
    pages, row = math.ceil(sk / page), d // 2 if kv_dtype == 3 else d  # a row's bytes
    kv = (row * hk * page, row * hk, row)
    scales = dict(k_scale=1 << 47, v_scale=1 << 48, k_scale_strides=(page * hk, hk, 1),
                  v_scale_strides=(page * hk, hk, 1)) if kv_dtype == 3 else {}
    return _lib.op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, q_strides=(32 * d, 32 * d, d), k_strides=kv,
                        v_strides=kv, o_strides=(32 * d, 32 * d, d), batch=b, heads=32, seq_q=1, seq_k=sk, head_dim=d,
                        heads_k=hk, window_left=-1, window_right=-1, softmax_scale=0.1, tail_split=-1, num_cus=cus,
                        cu_seqlens_q=1 << 44, cu_seqlens_k=1 << 45, block_table=1 << 46, total_q=b, total_k=0,
                        page_size=page, num_pages=b * pages, pages_per_seq=pages, table_stride=pages,
                        kv_dtype=kv_dtype, **scales, **machine)


@pytest.mark.parametrize("kv_dtype", [1, 3], ids=["fp8", "fp4"])
@pytest.mark.parametrize("b,hk,sk,d", [(32, 8, 4096, 128), (1, 8, 131072, 128), (8, 8, 32768, 64),
                                       (1, 8, 9000, 256)])
def test_the_planner_prices_a_quantized_step(b, hk, sk, d, kv_dtype):
    """A quantized step's math is its expansion's too (0.8 us), and an FP4 cache keeps three steps' loads in flight
    (two at 256; params.h decode_ahead, the plan's steps_ahead): the planner prices a part of n steps as n x (a
    round trip over the steps in flight + the step's math) + the rest of the first round trip, with the format's row
    bytes and occupancy, and picks the fewest parts of least estimated time by that."""
    p = _lib.op_plan(OP, KERNEL, paged_quant(kv_dtype, b, hk, sk, d))
    assert p["steps_ahead"] == ((3 if d <= 192 else 2) if kv_dtype == 3 else 1) and p["step_keys"] == STEP_KEYS[d], p
    items, steps = b * hk, math.ceil(sk / STEP_KEYS[d])
    price = functools.partial(planned_ns, items, b * 32, steps, d=d, kv_dtype=kv_dtype)
    best = min(range(1, max(min(steps // 4, 1024), 1) + 1), key=lambda g: (price(g), g))
    assert p["splits"] == best, (b, hk, sk, d, p)
    assert abs(p["planned_ns"] - price(best)) <= 1, p


@pytest.mark.parametrize("kv_dtype", [0, 1, 3], ids=["bf16", "fp8", "fp4"])
@pytest.mark.parametrize("b,hk,sk,d", [(32, 8, 4096, 128), (1, 8, 131072, 128), (8, 8, 32768, 64),
                                       (1, 8, 9000, 256), (4, 8, 16384, 256)])
def test_the_planner_takes_the_parts_machine(b, hk, sk, d, kv_dtype):
    """The argument block's hbm_gbps, lds_per_cu and gfx_arch (the manifest's machine of the arch, as the Python layer
    fills them) are the planner's HBM bandwidth, the LDS its occupancy counts and the arch whose waves it counts:
    MI355X's 8 TB/s and 160 KB over 256 CUs, 3 waves a SIMD up to 128, price a gfx950 call as split_ns restated with
    those figures, and the plan follows them."""
    m = manifest.load().machine("gfx950")
    fields = dict(hbm_gbps=m.hbm_gbps, lds_per_cu=m.lds_per_cu, gfx_arch=m.gfx_arch)
    p = _lib.op_plan(OP, KERNEL, paged_quant(kv_dtype, b, hk, sk, d, cus=m.cus, **fields) if kv_dtype
                     else args(b, 32, hk, 1, sk, d, cus=m.cus, **fields))
    items, steps = b * hk, math.ceil(sk / STEP_KEYS[d])
    price = functools.partial(planned_ns, items, b * 32, steps, d=d, kv_dtype=kv_dtype, gbps=m.hbm_gbps,
                              lds=m.lds_per_cu, cus=m.cus, gfx=0x950)
    best = min(range(1, max(min(steps // 4, 1024), 1) + 1), key=lambda g: (price(g), g))
    assert p["splits"] == best, (b, hk, sk, d, p)
    assert abs(p["planned_ns"] - price(best)) <= 1, p


def test_the_machine_fields_come_from_the_manifest(monkeypatch):
    """The Python layer fills the planner's picture of the device from the manifest's machine of its arch (an emulated
    arch: its arch's), and leaves it unknown (0) where the manifest names none."""
    from rtcattn.runtime import dispatch
    for arch in ("gfx942", "gfx90a", "gfx950"):
        m = manifest.load().machine(arch)
        monkeypatch.setattr(dispatch, "device_facts", lambda device, arch=arch: (arch + "-emu", 7))  # 7: the device's
        want = dict(num_cus=7, hbm_gbps=m.hbm_gbps, lds_per_cu=m.lds_per_cu, gfx_arch=int(arch[3:], 16))
        assert dispatch.machine_fields(torch.device("cpu")) == want, arch
    mi355x = manifest.load().machine("gfx950")
    assert (mi355x.cus, mi355x.hbm_gbps, mi355x.lds_per_cu) == (256, 8000, 160 * 1024), mi355x
    monkeypatch.setattr(dispatch, "device_facts", lambda device: ("sm_90a", 132))
    assert dispatch.machine_fields(torch.device("cpu")) == dict(num_cus=132, hbm_gbps=0, lds_per_cu=0, gfx_arch=0)


def test_the_planner_splits_when_the_batch_cannot_fill_the_gpu():
    one = _lib.op_plan(OP, KERNEL, args(1, 32, 8, 1, 131072, 128))  # 8 items of 4096 steps: split
    kv_ns = 131072 * 8 * 128 * 4 / 5.3e3  # the KV bytes at 5.3 TB/s
    assert 64 <= one["splits"] <= 304 and one["planned_ns"] <= 1.25 * kv_ns, one
    assert _lib.op_plan(OP, KERNEL, args(256, 32, 8, 1, 1024, 128))["splits"] == 1  # 2048 items fill the GPU
    assert _lib.op_plan(OP, KERNEL, args(1, 32, 8, 1, 200, 128))["splits"] == 1  # 7 steps: at least 4 per part
    no_cus = _lib.op_plan(OP, KERNEL, args(1, 8, 8, 1, 9000, 128, cus=0))  # unknown CUs: no planned split
    assert no_cus["splits"] == 1, no_cus


# ---- max_splits (flash_attn_with_kvcache's num_splits) caps the planned split ------------------------------------

def best_of(items, rows, steps, d, cap):
    """The planner's pick among 1..cap parts (each part at least 4 steps): least estimated time, fewest parts."""
    return min(range(1, max(min(steps // 4, 1024, cap), 1) + 1),
               key=lambda g: (planned_ns(items, rows, steps, g, d), g))


@pytest.mark.parametrize("b,hk,sk,d", [(1, 8, 131072, 128), (1, 8, 4097, 128), (1, 2, 700, 128), (1, 8, 9000, 256)])
def test_max_splits_caps_the_planned_split(b, hk, sk, d):
    """max_splits n >= 1: the planner's pick among at most n parts (1: no split, no workspace, no merge); 0 or an n
    at or past the heuristic's pick: the heuristic's."""
    items, rows, steps = b * hk, b * 32, math.ceil(sk / STEP_KEYS[d])
    free = _lib.op_plan(OP, KERNEL, args(b, 32, hk, 1, sk, d))["splits"]
    assert free == best_of(items, rows, steps, d, 1024) > 3, free  # a case where the heuristic splits more than 3 ways
    for n in (1, 2, 3, free - 1, free, free + 1, 5000):
        p = _lib.op_plan(OP, KERNEL, args(b, 32, hk, 1, sk, d, max_splits=n))
        assert p["splits"] == best_of(items, rows, steps, d, n) <= n, (n, p)
        if n >= free:
            assert p["splits"] == free, (n, p)
    one = _lib.op_plan(OP, KERNEL, args(b, 32, hk, 1, sk, d, max_splits=1))
    assert one["splits"] == 1 and one["workspace_bytes"] == 0 and "grid_merge" not in one, one


def test_a_forced_split_wins_over_max_splits():
    """tail_split > 1 is what was asked, capped at 1024 parts, whatever max_splits says; tail_split 0 is no split."""
    assert _lib.op_plan(OP, KERNEL, args(1, 32, 8, 1, 4097, 128, tail_split=5, max_splits=2))["splits"] == 5
    assert _lib.op_plan(OP, KERNEL, args(1, 32, 8, 1, 131072, 128, tail_split=5000, max_splits=2000))["splits"] == 1024
    assert _lib.op_plan(OP, KERNEL, args(1, 32, 8, 1, 4097, 128, tail_split=0, max_splits=9))["splits"] == 1


def test_a_negative_max_splits_is_refused_by_name():
    with pytest.raises(ValueError, match=r"max_splits=-1 is not accepted; accepted: 0 \(the kernel's own cap\) or "
                                         r"n >= 1"):
        _lib.op_plan(OP, KERNEL, args(1, 32, 8, 1, 4097, 128, max_splits=-1))


def test_num_splits_maps_to_the_split_fields():
    """flash-attn's num_splits: 0 the heuristic (tail_split -1, max_splits 0), 1 no split (tail_split 0), n >= 2 the
    planner's pick of at most n (max_splits n); a packed call's argument block carries them to the plan."""
    assert stub.split_fields(0) == {"tail_split": -1, "max_splits": 0}
    assert stub.split_fields(1) == {"tail_split": 0, "max_splits": 0}
    assert stub.split_fields(2) == {"tail_split": -1, "max_splits": 2}
    assert stub.split_fields(7) == {"tail_split": -1, "max_splits": 7}
    q, k = torch.zeros(1, 32, 128, dtype=torch.bfloat16), torch.zeros(4097, 8, 128, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 4097], dtype=torch.int32)
    p = validate.check_varlen_inputs(q, k, k, cu_q, cu_k, 1, 4097)
    splits = {n: _lib.op_plan(OP, KERNEL, attention_fwd.args_block_varlen(q, k, k, None, cu_q, cu_k, None, p,
                                                                           dict(num_cus=CUS), num_splits=n))["splits"]
              for n in (0, 1, 2, 3)}
    assert splits == {0: best_of(8, 32, 129, 128, 1024), 1: 1, 2: 2, 3: 3} and splits[0] > 3, splits


def test_refusals_name_the_argument():
    assert _lib.op_supports(OP, KERNEL, args(2, 8, 2, 16, 300, 128), "hip") is None
    why = _lib.op_supports(OP, KERNEL, args(2, 8, 2, 17, 300, 128), "hip")
    assert why.startswith("seq_q=17 is not accepted by the gfx942_decode kernel; accepted: at most 16"), why
    why = _lib.op_supports(OP, KERNEL, args(2, 8, 2, 4, 300, 128, st=(4 * 8 * 128, -8 * 128, 128)), "hip")
    assert why.startswith("q_strides=(4096, -1024, 128) over 4 rows and 4 heads") and "non-negative" in why, why
    why = _lib.op_supports(OP, KERNEL, args(2, 8, 2, 4, 300, 128), "cuda")
    assert why.startswith("vendor='cuda' is not accepted by the gfx942_decode kernel"), why


def packed_quant(kv_dtype, row_stride, d=128, page=16):
    """A paged decode call on a quantized cache (fake addresses): row_stride bytes between key rows of a page."""
    quant = dict(kv_dtype=kv_dtype)
    if kv_dtype == 3:  # FP4: its scales
        quant.update(k_scale=1 << 47, v_scale=1 << 48, k_scale_strides=(page, 1, 1), v_scale_strides=(page, 1, 1))
    ks = (row_stride * page, row_stride, d)
    return _lib.op_args(OP, q=1 << 40, k=1 << 41, v=1 << 42, o=1 << 43, q_strides=(8 * d, 8 * d, d), k_strides=ks,
                        v_strides=ks, o_strides=(8 * d, 8 * d, d), batch=1, heads=8, seq_q=1, seq_k=20, head_dim=d,
                        heads_k=1, window_left=-1, window_right=0, softmax_scale=0.1, tail_split=-1, num_cus=CUS,
                        cu_seqlens_q=1 << 44, cu_seqlens_k=1 << 45, block_table=1 << 46, total_q=1, total_k=0,
                        page_size=page, num_pages=4, pages_per_seq=2, table_stride=2, **quant)


@pytest.mark.parametrize("kv_dtype,row", [(0, 256), (1, 128), (2, 128), (3, 64)])
def test_a_quantized_cache_spans_its_bytes(kv_dtype, row):
    """The K/V span the kernel's buffer resources cover counts the cache's bytes (a strided page: 15 row strides and
    a row of D values): a row stride that a bf16 cache's 2-byte elements push past 4 GiB is accepted for FP8 / FP4,
    and the refusal names k_strides[1] with the bytes."""
    big = (1 << 32) // 15 // 2 + 1  # 15 * big bytes < 4 GiB, 15 * big * 2 >= 4 GiB
    assert _lib.op_supports(OP, KERNEL, packed_quant(kv_dtype, row), "hip") is None
    why = _lib.op_supports(OP, KERNEL, packed_quant(kv_dtype, big), "hip")
    if kv_dtype == 0:
        assert why.startswith(f"k_strides[1]={big} over 16 rows spans {(15 * big + 128) * 2} bytes"), why
    else:
        assert why is None, why
        why = _lib.op_supports(OP, KERNEL, packed_quant(kv_dtype, 2 * big), "hip")
        span = 15 * 2 * big + (64 if kv_dtype == 3 else 128)
        assert why.startswith(f"k_strides[1]={2 * big} over 16 rows spans {span} bytes"), why


def test_a_kv_span_leaves_room_for_the_no_row_offset():
    """A lane the call has no row or column for loads from offset 2^32 - 16 (params.h decode_no_row), past every K / V
    resource: a span up to it is accepted, one that reaches past it (yet below 4 GiB) is refused by name."""
    no_row = (1 << 32) - 16
    rs = (no_row - 128) // 15  # FP8 at d 128: 15 row strides and a row of 128 bytes over a page of 16
    assert 15 * rs + 128 <= no_row < 15 * (rs + 1) + 128 < 1 << 32
    assert _lib.op_supports(OP, KERNEL, packed_quant(1, rs), "hip") is None
    why = _lib.op_supports(OP, KERNEL, packed_quant(1, rs + 1), "hip")
    assert why.startswith(f"k_strides[1]={rs + 1} over 16 rows spans {15 * (rs + 1) + 128} bytes") and \
        f"at most {no_row} bytes" in why, why
