"""The sm_90a decode kernel without a GPU: NVRTC builds of its variants (no spills, every bucket and dtype), the
manifest entry (before sm90, declining long calls at run time), the host's plan (row tiles, chunks, the split and its
workspace, num_splits' cap), the refusals, and dispatch: decode calls take it, prefill calls the sm90 kernel."""
import re

import pytest

torch = pytest.importorskip("torch")

from rtcattn.ops import attention_fwd  # noqa: E402
from rtcattn.ops.attention_fwd import stub, validate  # noqa: E402
from rtcattn.runtime import _lib, dispatch, manifest  # noqa: E402

OP, KERNEL, SYMBOL = "attention_fwd", "sm90_decode", "attention_fwd_sm90_decode"
BUCKETS = (32, 64, 96, 128, 160, 192, 256)
SMS = 132


def _build(tmp_path, mode="rtne", mask="none", kv="paged", head_dim=128, dtype="bf16", kv_dtype="same",
           score_mod="plain"):
    m = manifest.load()
    v = m.variant_for(OP, KERNEL, "sm_90a", {"round_mode": mode, "mask": mask, "kv": kv, "head_dim": head_dim,
                                              "dtype": dtype, "kv_dtype": kv_dtype,
         "score_mod": score_mod, "dropout": "nodrop"})
    req = m.request(v, dispatch.package_version())
    try:
        res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                         compiler=",".join(req.compilers), package_version=req.package_version,
                         cache_dir=str(tmp_path))
    except _lib.UnavailableError as e:
        pytest.skip(f"NVRTC unavailable for sm_90a: {e}")
    return res


# Every bucket in bf16, in the heaviest form (a window over packed sequences) and the paged one, fp16 at the smallest,
# 128 and largest bucket in each (CI's time: fp16 changes the conversions and the MMA's type, the same code at every
# bucket); every (mask, kv) at 128 and 256; the other bf16 modes at 128.
FP16_BUCKETS = (BUCKETS[0], 128, BUCKETS[-1])
BUILDS = ([(d, t, "rtne", mask, kv) for mask, kv in (("window", "varlen"), ("none", "paged")) for d in BUCKETS
           for t in ("bf16", "fp16") if t == "bf16" or d in FP16_BUCKETS]
          + [(d, "bf16", "rtne", mask, kv) for d in (128, 256) for mask in ("none", "window")
             for kv in ("dense", "varlen", "paged") if (mask, kv) not in (("window", "varlen"), ("none", "paged"))]
          + [(128, "bf16", m, "window", "paged") for m in ("rtna", "rtz")])


@pytest.mark.slow
@pytest.mark.parametrize("head_dim,dtype,mode,mask,kv", BUILDS)
def test_nvrtc_builds_without_spills(head_dim, dtype, mode, mask, kv, tmp_path):
    res = _build(tmp_path, mode, mask, kv, head_dim, dtype)
    assert res.origin == "compile"
    log = res.log()
    assert f"Compiling entry function '{SYMBOL}' for 'sm_90a'" in log, log
    assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), log
    # Two CTAs of 128 threads per SM up to the 128 bucket (shared memory allows it): at most 255 registers.
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 255, log


# Quantized caches (FP8 E4M3, FP4 E2M1): one build per (format, dtype, bucket). FP8 paged or packed rows, windowed or
# not, FP4 paged (the only form the API gives it): the quantized code is the same in each, and the (mask, kv) forms
# are checked above on the bf16 cache. bf16's three modes (they round P) in turn over the buckets; fp16 at 64 and 256
# (CI's time: as above).
QUANT_BUILDS = [(f, d, t, ("rtne", "rtna", "rtz")[i % 3] if t == "bf16" else "rtne", "window" if d % 64 else "none",
                 "paged" if f == "fp4_e2m1" or d % 64 == 0 else "varlen")
                for f in ("fp8_e4m3", "fp4_e2m1") for i, d in enumerate(BUCKETS) for t in ("bf16", "fp16")
                if t == "bf16" or d in (64, 256)]


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype,head_dim,dtype,mode,mask,kv", QUANT_BUILDS)
def test_nvrtc_builds_quantized_caches_without_spills(kv_dtype, head_dim, dtype, mode, mask, kv, tmp_path):
    """The FP8 and FP4 variants (bytes through ldmatrix, expanded in registers; FP4's scales through shared memory):
    no stack, no spills, and at most 255 registers, as the bf16 ones."""
    res = _build(tmp_path, mode, mask, kv, head_dim, dtype, kv_dtype)
    assert res.origin == "compile"
    log = res.log()
    assert f"Compiling entry function '{SYMBOL}' for 'sm_90a'" in log, log
    assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), log
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 255, log


# Score modifications (the soft cap and ALiBi, csrc_common/score_mod_sm90.h): both at once at 64, 128 and 256 in the
# paged, windowed packed and dense forms, each alone at 128, fp16 once, over an FP8 and an FP4 cache: no stack, no
# spills, at most 255 registers.
SCORE_MOD_BUILDS = ([("softcap_alibi", d, "bf16", mask, kv, "same") for d in (64, 128, 256)
                     for mask, kv in (("none", "paged"), ("window", "varlen"), ("window", "dense"))]
                    + [(m, 128, "bf16", "window", "paged", "same") for m in ("softcap", "alibi")]
                    + [("softcap_alibi", 128, "fp16", "window", "paged", "same")]
                    + [("softcap_alibi", d, "bf16", "window", "paged", f) for f in ("fp8_e4m3", "fp4_e2m1")
                       for d in (64, 256)])


@pytest.mark.parametrize("score_mod,head_dim,dtype,mask,kv,kv_dtype", SCORE_MOD_BUILDS)
def test_nvrtc_builds_score_mods_without_spills(score_mod, head_dim, dtype, mask, kv, kv_dtype, tmp_path):
    res = _build(tmp_path, "rtne", mask, kv, head_dim, dtype, kv_dtype, score_mod)
    assert res.origin == "compile" and f"-{kv_dtype}-{score_mod}-" in res.cache_name, res.cache_name
    log = res.log()
    assert f"Compiling entry function '{SYMBOL}' for 'sm_90a'" in log, log
    assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), log
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 255, log


def test_manifest_entry_comes_before_sm90_and_declines_long_calls():
    k = manifest.load().op(OP)
    names = [x.name for x in k.kernels]
    assert names.index(KERNEL) < names.index("sm90") < names.index("baseline"), names
    entry = k.kernel(KERNEL)
    assert entry.archs == ("sm_90a",) and entry.axes["head_dim"].buckets == BUCKETS
    assert entry.axes["dtype"] == ("bf16", "fp16")


def _dense_args(sq, sk, hq, hk, d, dtype=torch.bfloat16, sms=SMS):
    q = torch.zeros(2, sq, hq, d, dtype=dtype)
    k = torch.zeros(2, sk, hk, d, dtype=dtype)
    p = validate.check_inputs(q, k, k, "bshd", "rtne")
    return attention_fwd.args_block(q, k, k, torch.empty_like(q), None, "bshd", p, dispatch.arch_fields("sm_90a", sms))


def _plan(args):
    return _lib.op_plan(OP, KERNEL, args)


@pytest.mark.parametrize("hq,hk,sq,tiles,chunks", [(32, 8, 1, 1, 1), (64, 8, 1, 1, 1), (32, 8, 4, 1, 1),
                                                   (32, 1, 1, 2, 1), (8, 1, 4, 2, 1), (32, 8, 16, 4, 1),
                                                   (128, 1, 1, 4, 2), (64, 1, 16, 4, 16)])
def test_row_tiles_pack_a_group_into_one_cta(hq, hk, sq, tiles, chunks):
    """group x Sq packed rows: the fewest of 1, 2, 4 row tiles that hold them, then chunks of 64 rows."""
    plan = _plan(_dense_args(sq, 4096, hq, hk, 128))
    assert (plan["row_tiles"], plan["chunks"], plan["group"]) == (tiles, chunks, hq // hk), plan
    assert plan["items"] == 2 * hk * chunks and plan["block"] == 128


def test_row_tiles_stay_within_shared_memory():
    """Every bucket: 64 packed rows take as many row tiles as fit beside the ring (at most 4, the rest in chunks), and
    the launch's shared memory stays within sm_90's 227 KB."""
    for d in BUCKETS:
        plan = _plan(_dense_args(16, 4096, 32, 8, d))
        assert plan["shared_bytes"] <= 227 * 1024 and plan["bucket"] == d, plan
        assert plan["row_tiles"] in (1, 2, 4) and plan["row_tiles"] * plan["chunks"] * 16 >= 64, plan
        assert plan["items"] == 2 * 8 * plan["chunks"], plan


def test_column_split_at_256_caps_the_row_tiles():
    """At 256 two warps share each 16-key block (half of O's columns each), so a CTA's four warps hold at most two row
    tiles: 64 packed rows (MQA 32/1, Sq 2) take two chunks of two tiles. Other buckets keep whole rows per warp."""
    for d in BUCKETS:
        plan = _plan(_dense_args(2, 4096, 32, 1, d))
        if d == 256:
            assert (plan["col_split"], plan["row_tiles"], plan["chunks"]) == (2, 2, 2), plan
        else:
            assert plan["col_split"] == 1 and plan["row_tiles"] * plan["chunks"] == 4, plan


def test_split_plan_fills_the_gpu_and_sizes_its_workspace():
    """One long sequence is split to fill the SMs; a batch that fills them is not; the workspace holds each part's
    partial per row tile (16 x (bucket + 2) fp32) and the merge grid is one CTA per item and 32 columns."""
    args = _dense_args(1, 131072, 32, 8, 128)
    plan = _plan(args)
    assert plan["splits"] > 8 and plan["grid_attn"] == plan["items"] * plan["splits"], plan
    assert plan["grid_merge"] == plan["items"] * 128 // 32, plan  # a merge CTA per item and 32 columns
    assert plan["workspace_bytes"] == plan["items"] * plan["splits"] * 16 * (128 + 2) * 4, plan
    full = _plan(_dense_args(1, 4096, 32 * 64, 8 * 64, 128))
    assert full["splits"] == 1 and full["workspace_bytes"] == 0 and "grid_merge" not in full, full
    unknown = _plan(_dense_args(1, 131072, 32, 8, 128, sms=0))  # no SM count: no split
    assert unknown["splits"] == 1, unknown


def test_forced_split_and_num_splits_cap():
    args = _dense_args(1, 131072, 32, 8, 128)
    planned = _plan(args)["splits"]
    args.tail_split = 5
    assert _plan(args)["splits"] == 5
    args.tail_split = 0
    assert _plan(args)["splits"] == 1
    args.tail_split, args.max_splits = -1, 3
    assert _plan(args)["splits"] == 3 < planned
    fields = stub.split_fields(2)
    args.tail_split, args.max_splits = fields["tail_split"], fields["max_splits"]
    assert _plan(args)["splits"] == 2


def test_refusals_name_the_argument_and_what_is_accepted():
    args = _dense_args(17, 300, 8, 2, 128)
    why = _lib.op_supports(OP, KERNEL, args, "cuda")
    assert why == ("seq_q=17 is not accepted by the sm90_decode kernel; accepted: at most 16 query rows per "
                   "sequence (decode; longer calls go to the prefill kernel)")
    assert "accepted: cuda" in _lib.op_supports(OP, KERNEL, _dense_args(1, 300, 8, 2, 128), "hip")
    base = torch.zeros(1, 40, 2, 132, dtype=torch.bfloat16)
    view = base[..., :128]  # strides 264 and 132 elements: 132 % 8 != 0
    p = validate.check_inputs(view, view, view, "bshd", "rtne")
    args = attention_fwd.args_block(view, view, view, torch.empty_like(view), None, "bshd", p,
                                     dispatch.arch_fields("sm_90a", SMS))
    args.seq_q = 1
    assert _lib.op_supports(OP, KERNEL, args, "cuda") == (
        "q_strides[2]=132 is not accepted by the sm90_decode kernel; accepted: a multiple of 8 elements in [0, 2^38)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dispatch_picks_the_decode_kernel_for_decode_calls_only(dtype, monkeypatch):
    monkeypatch.setattr(dispatch, "device_facts", lambda device: ("sm_90a", SMS))
    monkeypatch.setattr(dispatch, "vendor_of", lambda device: "cuda")
    for sq, kernel in ((1, KERNEL), (16, KERNEL), (17, "sm90")):
        q = torch.zeros(2, sq, 8, 128, dtype=dtype)
        k = torch.zeros(2, 300, 2, 128, dtype=dtype)
        sel = attention_fwd.selection(q, k, k, window=(-1, 0))
        assert sel.kernel.name == kernel, (sq, sel.why)
        if kernel == "sm90":
            assert f"{KERNEL}: seq_q=17 is not accepted by the {KERNEL} kernel" in sel.why, sel.why


def _paged_decode(sq, d=128, cache="fp8", pages=5):
    """A paged decode call's (q, k, v, cu_q, cu_k, max_q, max_k, table, quant) over a cache of `cache` ("fp8",
    "fnuz", "fp4" or "bf16"): 2 sequences of 20 keys, Hq 8, Hk 2, pages of 16."""
    from rtcattn.ops.attention_fwd import kvquant
    q = torch.zeros(2 * sq, 8, d, dtype=torch.bfloat16)
    pool = torch.randn(pages, 16, 2, d)
    quant = validate.NO_QUANT
    k = v = pool.to(torch.bfloat16)
    if cache == "fp4":
        (k, ks), (v, vs) = kvquant.quantize_fp4(pool.to(torch.bfloat16)), kvquant.quantize_fp4(pool.to(torch.bfloat16))
        k, v = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # HND pages, as AITER's FP4 cache
        quant = validate.KvQuant(kv_cache_dtype="fp4_e2m1", k_scale=ks, v_scale=vs)
    elif cache != "bf16":
        k = kvquant.quantize_fp8(pool, torch.ones(()))
        k = v = k.float().to(torch.float8_e4m3fnuz) if cache == "fnuz" else k
        quant = validate.KvQuant(k_descale=torch.ones(2, 2), v_descale=torch.ones(1))
    cu_q = torch.tensor([0, sq, 2 * sq], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 40], dtype=torch.int32)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    return q, k, v.clone(), cu_q, cu_k, sq, 20, table, quant


def _quant_paged_selection(sq, d=128, cache="fp8"):
    q, k, v, cu_q, cu_k, mq, mk, table, quant = _paged_decode(sq, d, cache)
    return attention_fwd.selection_varlen(q, k, v, cu_q, cu_k, mq, mk, block_table=table, quant=quant)


def _paged_plan(d, cache):
    q, k, v, cu_q, cu_k, mq, mk, table, quant = _paged_decode(1, d, cache)
    p = validate.check_varlen_inputs(q, k, v, cu_q, cu_k, mq, mk, "rtne", None, None, (-1, -1), table, None, quant)
    machine = dispatch.arch_fields("sm_90a", SMS)
    return _plan(stub.args_block_varlen(q, k, v, None, cu_q, cu_k, table, p, machine, None, 0, quant))


def test_dispatch_sends_quantized_decode_calls_to_the_decode_kernel(monkeypatch):
    """FP8 E4M3 and FP4 caches: decode calls take sm90_decode's variant of their kv_dtype; longer calls, and head dims
    whose quantized rows TMA cannot stride (FP8 D 8: 8-byte rows; FP4 D 48: 24-byte rows) go on to the sm90 prefill
    kernel (its expansion reads 4-byte units), FNUZ caches (MI300X's format) to the baseline, each passed-over kernel
    saying why."""
    monkeypatch.setattr(dispatch, "device_facts", lambda device: ("sm_90a", SMS))
    monkeypatch.setattr(dispatch, "vendor_of", lambda device: "cuda")
    for cache, kv_dtype in (("fp8", "fp8_e4m3"), ("fp4", "fp4_e2m1")):
        sel = _quant_paged_selection(4, cache=cache)
        assert sel.kernel.name == KERNEL and sel.variant["kv_dtype"] == kv_dtype, sel.why
        sel = _quant_paged_selection(17, cache=cache)
        assert sel.kernel.name == "sm90" and sel.variant["kv_dtype"] == kv_dtype, sel.why
        assert "max_seqlen_q=17" in sel.why, sel.why
    sel = _quant_paged_selection(1, cache="fnuz")
    assert sel.kernel.name == "baseline", sel.why
    assert f"{KERNEL}: kv_dtype 'fp8_e4m3fnuz' not in ['same', 'fp8_e4m3', 'fp4_e2m1']" in sel.why, sel.why
    assert "sm90: kv_dtype 'fp8_e4m3fnuz' not in ['same', 'fp8_e4m3', 'fp4_e2m1']" in sel.why, sel.why
    sel = _quant_paged_selection(1, d=8)
    assert sel.kernel.name == "sm90", sel.why
    assert "k_strides[2]=8 is not accepted by the sm90_decode kernel; accepted: a multiple of 16 elements" in sel.why
    sel = _quant_paged_selection(1, d=48, cache="fp4")
    assert sel.kernel.name == "sm90", sel.why
    assert "k_strides[2]=24 is not accepted by the sm90_decode kernel; accepted: a multiple of 16 elements" in sel.why


def test_quantized_plans_keep_the_ctas_of_the_bf16_ones():
    """A quantized stage holds more keys (up to 128) where that fits in the bf16 stage's bytes: FP8 twice at D 96, 128,
    256, FP4 128 keys at every D; elsewhere the same keys in fewer bytes. The ring never grows, so an SM holds as many
    CTAs as with the bf16 cache (FP4 adds a stage's scale bytes beside it)."""
    for d in BUCKETS:
        same, fp8, fp4 = _paged_plan(d, "bf16"), _paged_plan(d, "fp8"), _paged_plan(d, "fp4")
        assert fp8["step_keys"] in (same["step_keys"], 2 * same["step_keys"]) and fp8["step_keys"] <= 128, (d, fp8)
        assert fp8["shared_bytes"] <= same["shared_bytes"], (d, same, fp8)
        assert (fp8["step_keys"] == 2 * same["step_keys"]) == (d in (96, 128, 256)), (d, same, fp8)
        assert fp4["step_keys"] == 128, (d, fp4)
        assert fp8["slots"] >= same["slots"] and fp4["slots"] >= same["slots"], (d, same, fp8, fp4)
