"""The sm_90a kernel on the product path without a GPU: NVRTC compiles from the manifest, ptxas's report, dispatch's
fallback."""
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rtcattn.ops import attention_fwd  # noqa: E402
from rtcattn.ops.attention_fwd import kvquant, stub, validate  # noqa: E402
from rtcattn.runtime import _lib, dispatch, manifest  # noqa: E402
from rtcattn.tools import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYMBOL = "attention_fwd_sm90"
EM_CUDA = 190
OP = "attention_fwd"
LAYOUTS, MODES = validate.LAYOUTS, validate.axis_values("round_mode")
BUCKETS = (32, 64, 96, 128, 160, 192, 256)
H100 = dispatch.arch_fields("sm_90a", 132)  # the planner's inputs for an H100 / H200 (132 SMs)


def _sm90():
    return manifest.load().op(OP).kernel("sm90")


def _build(mode, cache_dir, mask="none", kv="dense", head_dim=128, dtype="bf16", kv_dtype="same", score_mod="plain",
           dropout="nodrop"):
    """Manifest -> build request -> C++ runtime -> NVRTC, into a fresh cache dir."""
    v = manifest.load().variant_for(OP, "sm90", "sm_90a", {"round_mode": mode, "mask": mask, "kv": kv,
                                                           "head_dim": head_dim, "dtype": dtype, "kv_dtype": kv_dtype,
                                                           "score_mod": score_mod, "dropout": dropout})
    req = manifest.load().request(v, dispatch.package_version())
    try:
        res = _lib.build(req.op, req.variant, req.arch, req.kernel_symbol, req.main, req.headers, req.options,
                         compiler=",".join(req.compilers), package_version=req.package_version,
                         cache_dir=str(cache_dir))
    except _lib.UnavailableError as e:
        pytest.skip(f"NVRTC unavailable for sm_90a: {e}")
    assert res.origin == "compile", f"fresh cache dir, yet origin {res.origin}"
    return req, res


def test_manifest_entry_precedes_baseline():
    m = manifest.load()
    names = [k.name for k in m.op(OP).kernels]
    assert names.index("sm90") < names.index("baseline"), names
    k = _sm90()
    hd = k.axes["head_dim"]
    assert k.symbol == SYMBOL and k.archs == ("sm_90a",) and hd.buckets == BUCKETS
    assert k.axes["dtype"] == ("bf16", "fp16")
    v = m.variant_for(OP, "sm90", "sm_90a",
                      {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": 128, "dtype": "bf16",
                       "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"})
    headers = {n for n, _ in m.request(v, "0").headers}
    assert {"sm90/params.h", "ptx_sm90.h", "wgmma_sm90.h", "sm90/softmax.h", "attn_params.h"} <= headers, headers
    assert all(hd.accepts(d) for d in range(8, 257, 8)) and not hd.accepts(264) and not hd.accepts(60)


# The dense variants with and without a mask (one code object for both layouts: the strides carry the layout);
# packed ones with and without a mask. Every bucket in both dtypes at RTNE; the other bf16 modes at 128 (their
# packing differs only in the conversion instructions). fp16 and the other modes on the dense forms: they change the
# conversions (fp16 the MMA's type too) the same way in every form, and packing changes addressing alone, which bf16
# RTNE checks at every bucket (fp16 packed: the quantized and dropout builds below; CI's time).
# The unmasked packed forms and fp16 at the smallest, 128 and largest bucket (END_BUCKETS; CI's time): the masked packed
# forms, which hold the unmasked ones' code and the window's, take every bucket, and fp16 changes the same conversions
# and MMA type at every bucket.
BUILDS = [(mask, kv) for kv in ("dense", "varlen", "paged") for mask in ("none", "window")]
END_BUCKETS = (BUCKETS[0], 128, BUCKETS[-1])
TYPED = ([(d, "bf16", "rtne") for d in BUCKETS] + [(d, "fp16", "rtne") for d in END_BUCKETS]
         + [(128, "bf16", m) for m in MODES if m != "rtne"])
PLAIN_BUILDS = [(mask, kv, d, dtype, mode) for d, dtype, mode in TYPED for mask, kv in BUILDS
                if kv == "dense" or ((dtype, mode) == ("bf16", "rtne") and (mask == "window" or d in END_BUCKETS))]


@pytest.mark.parametrize("mask,kv,head_dim,dtype,mode", PLAIN_BUILDS)
def test_nvrtc_sm90a_no_spills_no_serialization(mask, kv, head_dim, dtype, mode, tmp_path):
    req, res = _build(mode, tmp_path, mask, kv, head_dim, dtype)
    code = res.code()
    assert code[:4] == b"\x7fELF" and struct.unpack_from("<H", code, 18)[0] == EM_CUDA
    assert (struct.unpack_from("<I", code, 48)[0] >> 8) & 0xFF == 90, "cubin is not sm_90"
    assert SYMBOL.encode() + b"\0" in code, f"kernel {SYMBOL} missing from the cubin"
    name = f"attention_fwd-sm90-{mode}-{mask}-{kv}-d{head_dim}-{dtype}-same-plain-nodrop-sm_90a-"
    assert res.cache_name.startswith(name), res.cache_name
    log = res.log()
    assert f"Compiling entry function '{SYMBOL}' for 'sm_90a'" in log, log
    frame = re.search(r"\b(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert frame and tuple(int(n) for n in frame.groups()) == (0, 0, 0), log
    # C7510/C7514: ptxas serialized the wgmma pipeline (the warpgroup waits after every MMA).
    assert not re.search(r"C75(10|14)", log), log
    assert "wgmma" not in log.lower(), log


# A quantized cache (sm90/expand.h: the expansion stage and the attention over its rows in one code object): FP8 and
# FP4, the paged window variants (the tightest registers: the producer's and consumers' shares of a varlen cache, the
# expansion's loop beside them), in bf16 at the smallest bucket and from 128 up (the three consumer warpgroups' and the
# widest accumulators), fp16 at the smallest, the middle and the largest bucket. (CI's time: bf16 at 64 and 96 was built
# without spills by every earlier CI run, the plain packed window variants are at every bucket above.)
QUANT = ([(kvd, d, "bf16") for kvd in ("fp8_e4m3", "fp4_e2m1") for d in BUCKETS if d not in (64, 96)]
         + [(kvd, d, "fp16") for kvd in ("fp8_e4m3", "fp4_e2m1") for d in (32, 128, 256)])


@pytest.mark.parametrize("kv_dtype,head_dim,dtype", QUANT)
def test_nvrtc_sm90a_quantized_cache_no_spills(kv_dtype, head_dim, dtype, tmp_path):
    req, res = _build("rtne", tmp_path, "window", "paged", head_dim, dtype, kv_dtype)
    name = f"attention_fwd-sm90-rtne-window-paged-d{head_dim}-{dtype}-{kv_dtype}-plain-nodrop-sm_90a-"
    assert res.cache_name.startswith(name), res.cache_name
    assert {"sm90/expand.h", "sm90_kv_elems.h", "kv_quant.h"} <= {n for n, _ in req.headers}
    log = res.log()
    frame = re.search(r"\b(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert frame and tuple(int(n) for n in frame.groups()) == (0, 0, 0), log
    assert not re.search(r"C75(10|14)", log), log


# Score modifications (the soft cap and ALiBi, csrc_common/score_mod_sm90.h): both at once (the most state) at 64, 128
# and 256 in the open form (no mask, dense: the widest block) and with a window over varlen and paged K/V, over dense at
# 128; the cap alone open and ALiBi alone windowed at 128, fp16 once (CI's time: the rest were built once, NOTES); over
# quantized caches FP8 with ALiBi alone (its scores go to the softmax as t: sm90/mask.h) and both with each format.
# Every one without a stack frame or spills, and with the wgmma pipeline kept, but for one known exception, asserted
# as it stands so that it does not grow (issue 25: to be removed): FP8 at 256 with a window, where ptxas spills a few
# words of the tile's setup (stored at its start, loaded at its end: not in the KV loop) beside the register its
# k_descale's cap takes (sm90/mask.h). Bytes of spill stores + loads.
KNOWN_SPILLS = {("softcap", 256, "window", "paged", "bf16", "fp8_e4m3"): 44}
SCORE_MOD_BUILDS = ([("softcap_alibi", d, "none", "dense", "bf16", "same") for d in (64, 128, 256)]
                    + [("softcap_alibi", d, "window", kv, "bf16", "same") for d in (64, 128, 256)
                       for kv in ("varlen", "paged")]
                    + [("softcap_alibi", 128, "window", "dense", "bf16", "same"),
                       ("softcap", 128, "none", "dense", "bf16", "same"),
                       ("alibi", 128, "window", "varlen", "bf16", "same")]
                    + [("softcap_alibi", 128, "window", "paged", "fp16", "same"),
                       ("alibi", 128, "window", "paged", "bf16", "fp8_e4m3"),
                       ("softcap_alibi", 192, "window", "paged", "bf16", "fp8_e4m3"),
                       ("softcap_alibi", 256, "none", "paged", "bf16", "fp8_e4m3"),
                       ("softcap", 256, "window", "paged", "bf16", "fp8_e4m3"),
                       ("softcap_alibi", 256, "window", "paged", "bf16", "fp4_e2m1"),
                       ("softcap_alibi", 128, "window", "paged", "bf16", "fp4_e2m1")])


@pytest.mark.parametrize("score_mod,head_dim,mask,kv,dtype,kv_dtype", SCORE_MOD_BUILDS)
def test_nvrtc_sm90a_score_mods_no_spills(score_mod, head_dim, mask, kv, dtype, kv_dtype, tmp_path):
    req, res = _build("rtne", tmp_path, mask, kv, head_dim, dtype, kv_dtype, score_mod)
    assert res.cache_name.startswith(f"attention_fwd-sm90-rtne-{mask}-{kv}-d{head_dim}-{dtype}-{kv_dtype}-{score_mod}-")
    assert "score_mod_sm90.h" in {n for n, _ in req.headers}
    log = res.log()
    frame = re.search(r"\b(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    known = KNOWN_SPILLS.get((score_mod, head_dim, mask, kv, dtype, kv_dtype), 0)
    assert frame and int(frame.group(2)) + int(frame.group(3)) <= known, log
    assert known or int(frame.group(1)) == 0, log
    assert not re.search(r"C75(10|14)", log), log


# Dropout (sm90/drop.h; the mask csrc_common/dropout.h's): the open form at 64 and 256 (three consumer warpgroups, the
# widest accumulators), a window over packed sequences at 128 and 256, with both score modifications at 256, fp16 paged
# once (every bucket, form and dtype was built without spills: docs/NOTES.md, issue 25 step 3). Every one without a
# stack frame or spills and with the wgmma pipeline kept, but for the known one below, asserted as it stands so that it
# does not grow: the 256 bucket's packed window variant with both score modifications, where ptxas keeps a few words of
# the tile's setup on the stack (stored before the tile's first GEMM and reloaded after its KV loop, none in the loop).
# Bytes of spill stores + loads.
DROPOUT_SPILLS = {(256, "window", "varlen", "softcap_alibi"): 112}
DROPOUT_BUILDS = ([(d, "none", "dense", "plain", "bf16") for d in (64, 256)]
                  + [(d, "window", "varlen", "plain", "bf16") for d in (128, 256)]
                  + [(256, "window", "varlen", "softcap_alibi", "bf16"), (128, "window", "paged", "plain", "fp16")])


@pytest.mark.parametrize("head_dim,mask,kv,score_mod,dtype", DROPOUT_BUILDS)
def test_nvrtc_sm90a_dropout_no_spills(head_dim, mask, kv, score_mod, dtype, tmp_path):
    req, res = _build("rtne", tmp_path, mask, kv, head_dim, dtype, "same", score_mod, "dropout")
    name = f"attention_fwd-sm90-rtne-{mask}-{kv}-d{head_dim}-{dtype}-same-{score_mod}-dropout-"
    assert res.cache_name.startswith(name), res.cache_name
    assert {"sm90/drop.h", "dropout.h"} <= {n for n, _ in req.headers}
    log = res.log()
    frame = re.search(r"\b(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    known = DROPOUT_SPILLS.get((head_dim, mask, kv, score_mod), 0)
    assert frame and int(frame.group(2)) + int(frame.group(3)) <= known, log
    assert known or int(frame.group(1)) == 0, log
    assert not re.search(r"C75(10|14)", log), log


def test_warm_lists_and_compiles_sm90(tmp_path):
    args = cli.parser().parse_args(["warm", "--all", "--arch", "sm_90a"])
    names = {v.name for v in cli._warm_variants(args) if v.op == OP and v.kernel == "sm90"}
    # every kv_dtype sm90 lists: q's dtype in every kv form, the quantized caches packed (varlen, paged) only; every
    # score modification, with and without dropout
    assert names == {f"sm90-{mode}-{mask}-{kv}-d{d}-{dtype}-{kvd}-{sm}-{dr}" for d in BUCKETS
                     for dr in ("nodrop", "dropout")
                     for mask in ("none", "window") for kvd in ("same", "fp8_e4m3", "fp4_e2m1")
                     for kv in (("dense", "varlen", "paged") if kvd == "same" else ("varlen", "paged"))
                     for mode, dtype in [(m, "bf16") for m in MODES] + [("rtne", "fp16")]
                     for sm in ("plain", "softcap", "alibi", "softcap_alibi")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "rtcattn", "warm", "--all", "--op", OP, "--arch", "sm_90a",
                          "--kernels", "sm90", "--round-mode", "rtz", "--mask", "none", "--kv", "dense",
                          "--head-dim", "128", "--score-mod", "plain", "--dropout", "nodrop",
                          "--cache-dir", str(tmp_path), "--jobs", "1"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    if "no compiler available" in run.stdout + run.stderr:
        pytest.skip("NVRTC unavailable for sm_90a")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 ready (1 compiled), 0 failed" in run.stdout, run.stdout
    assert list(tmp_path.glob("attention_fwd-sm90-rtz-none-dense-d128-bf16-same-plain-nodrop-sm_90a-*.co")), \
        list(tmp_path.iterdir())


# ---- selection: the sm90 kernel when its conditions hold, else the baseline with the reason logged ----

def _args(q, k, v, out, layout):
    """The C ABI argument block of CPU tensors: nothing reads through the pointers while selecting."""
    p = validate.check_inputs(q, k, v, layout, "rtne")
    return p, attention_fwd.args_block(q, k, v, out, None, layout, p, H100)


def _call(p):
    return {"round_mode": "rtne", "mask": "none", "kv": "dense", "head_dim": p.head_dim, "dtype": "bf16",
            "kv_dtype": "same", "score_mod": "plain", "dropout": "nodrop"}


def _choose(q, layout, capfd, monkeypatch, view=None):
    monkeypatch.setenv("RTCATTN_LOG", "1")
    monkeypatch.setattr(dispatch, "_logged", set())  # each distinct choice is logged once per process
    x = q if view is None else view
    p, args = _args(x, x, x, torch.empty_like(q), layout)
    sel = dispatch.choose(OP, "sm_90a", _call(p), args, "cuda")
    return sel, capfd.readouterr().err


@pytest.mark.parametrize("layout", LAYOUTS)
def test_select_sm90_for_aligned_d128(layout, capfd, monkeypatch):
    """Both layouts select the one variant: the strides carry the layout (200 query rows either way: a call of at
    most 16 goes to the decode kernel, tests/cpu/test_sm90_decode_host.py)."""
    q = torch.zeros(2, 200, 200, 128, dtype=torch.bfloat16)
    sel, err = _choose(q, layout, capfd, monkeypatch)
    assert sel.kernel.name == "sm90" and sel.why.startswith("fallback; sm90_decode: seq_q=200 is not accepted")
    assert sel.variant.name == "sm90-rtne-none-dense-d128-bf16-same-plain-nodrop"
    assert ("rtcattn: attention_fwd: kernel sm90 (sm90-rtne-none-dense-d128-bf16-same-plain-nodrop, sm_90a): fallback"
            in err), err


@pytest.mark.parametrize("d,bucket", [(8, 32), (40, 64), (64, 64), (72, 96), (96, 96), (104, 128), (136, 160),
                                      (168, 192), (200, 256), (256, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_select_sm90_every_bucket(d, bucket, dtype, monkeypatch):
    """Every head dim 8..256 and both dtypes select sm90, at the smallest bucket that holds the head dim; the host
    sizes the launch from the same bucket's plan (sm90/params.h), and its shared memory fits."""
    monkeypatch.setattr(dispatch, "device_facts", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(dispatch, "vendor_of", lambda device: "cuda")
    q = torch.zeros(1, 200, 2, d, dtype=dtype)
    name = "fp16" if dtype == torch.float16 else "bf16"
    assert attention_fwd.selection(q, q, q).variant.name == f"sm90-rtne-none-dense-d{bucket}-{name}-same-plain-nodrop"
    p, args = _args(q, q, q, torch.empty_like(q), "bshd")
    plan = _lib.op_plan(OP, "sm90", args)
    assert plan["head_dim_bucket"] == bucket and plan["shared_bytes"] <= 227 * 1024, plan
    assert plan["block_n"] % 16 == 0 and plan["q_stages"] in (1, 2), plan
    # a producer warpgroup and one consumer warpgroup per 64 rows
    assert plan["block_m"] in (128, 192) and plan["block"] == 128 + 2 * plan["block_m"], plan


@pytest.mark.parametrize("kv", ["varlen", "paged"])
@pytest.mark.parametrize("mask,window", [("none", (-1, -1)), ("window", (-1, 0))])
def test_select_sm90_for_seqused_k(kv, mask, window, monkeypatch):
    """A packed call with seqused_k (flash_attn_with_kvcache's form) runs sm90 on sm_90a: the kernel takes every KV
    length from seq_of, which honours seqused_k (on a GPU: tests/gpu/test_seqused_gpu.py)."""
    import varlen_suite as vs
    monkeypatch.setattr(dispatch, "device_facts", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(dispatch, "vendor_of", lambda device: "cuda")
    b = vs.make_batch([1, 40], [20, 300], 4, 2, 128, "cpu")
    if kv == "paged":
        b = vs.to_paged(b, 16)
    used = torch.tensor([20, 17], dtype=torch.int32)
    sel = attention_fwd.selection_varlen(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, window=window,
                                         block_table=b.block_table, seqused_k=used)
    # 40 query rows: the decode kernel ahead of sm90 leaves the call to it.
    assert sel.kernel.name == "sm90" and sel.why.startswith("fallback; sm90_decode: max_seqlen_q=40"), sel.why
    assert sel.variant.name == f"sm90-rtne-{mask}-{kv}-d128-bf16-same-plain-nodrop", sel.variant.name
    p = validate.check_varlen_inputs(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, block_table=b.block_table,
                                     seqused_k=used)
    args = attention_fwd.args_block_varlen(b.q, b.k, b.v, None, b.cu_q, b.cu_k, b.block_table, p, H100, used)
    assert _lib.op_supports(OP, "sm90", args, "cuda") is None


def _plan_rows():
    """sm90/params.h's plan rows: {bucket: ((block_n, consumers), (open_block_n, open_consumers))}."""
    text = (ROOT / "op_sources" / "attention_fwd" / "sm90" / "params.h").read_text()
    rows = re.findall(r"^    \{(\d+), (\d+), \d+, \d+, ([23]), (\d+), ([23]), [01], [01]\},$", text, re.MULTILINE)
    return {int(b): ((int(n), int(c)), (int(on), int(oc))) for b, n, c, on, oc in rows}


@pytest.mark.parametrize("d", [32, 64, 96, 128, 160, 192, 256])
def test_dense_variants_take_their_blocks(d):
    """The host sizes each variant's K/V boxes, tiles, threads and shared memory with the block width and consumer
    count the kernel was compiled for: the open variant (no mask, dense K/V) its plan row's open_block_n and
    open_consumers, the masked dense and the packed ones its block_n and consumers, varlen and paged alike (the kernel
    takes the same plan from sm90_plan: one function, both sides)."""
    import varlen_suite as vs
    masked, open_ = _plan_rows()[d]
    q = torch.zeros(1, 200, 2, d, dtype=torch.bfloat16)
    for window, (n, c) in (((-1, -1), open_), ((-1, 0), masked), ((64, 64), masked)):
        p = validate.check_inputs(q, q, q, "bshd", "rtne", window=window)
        plan = _lib.op_plan(OP, "sm90", attention_fwd.args_block(q, q, q, torch.empty_like(q), None, "bshd", p, H100))
        assert (plan["block_n"], plan["block_m"], plan["block"]) == (n, 64 * c, 128 * (1 + c)), (window, plan)
        assert plan["shared_bytes"] <= 227 * 1024, (window, plan)
    b = vs.make_batch([40, 300], [200, 300], 2, 2, d, "cpu")
    for paged in (False, True):
        x = vs.to_paged(b, 16) if paged else b
        p = validate.check_varlen_inputs(x.q, x.k, x.v, x.cu_q, x.cu_k, x.max_q, x.max_k, block_table=x.block_table)
        args = attention_fwd.args_block_varlen(x.q, x.k, x.v, None, x.cu_q, x.cu_k, x.block_table, p, H100, None)
        plan = _lib.op_plan(OP, "sm90", args)
        assert (plan["block_n"], plan["block_m"]) == (masked[0], 64 * masked[1]), (paged, plan)


def test_host_plans_are_the_manifest_buckets():
    """The host's plan for each head dim is the manifest's bucket for it: one list, read by both."""
    hd = _sm90().axes["head_dim"]
    for d in range(8, 257, 8):
        q = torch.zeros(1, 16, 1, d, dtype=torch.bfloat16)
        p, args = _args(q, q, q, torch.empty_like(q), "bshd")
        plan = _lib.op_plan(OP, "sm90", args)
        assert plan["head_dim_bucket"] == hd.bucket_for(d), d
        # 16 rows: one tile per (head, batch), whatever the tile's rows; 200 rows: ceil(200 / block_m) tiles.
        assert plan["num_tiles"] == 1, plan
    for d in (32, 64, 128, 256):
        q = torch.zeros(1, 200, 3, d, dtype=torch.bfloat16)
        p, args = _args(q, q, q, torch.empty_like(q), "bshd")
        plan = _lib.op_plan(OP, "sm90", args)
        assert plan["num_tiles"] == 3 * -(-200 // plan["block_m"]), plan


@pytest.mark.parametrize("sk,d,hq,hk,b,want", [(4096, 256, 16, 16, 2, 8), (4096, 128, 32, 32, 2, 16),
                                                 (4096, 192, 21, 21, 2, 10), (200, 64, 3, 3, 1, 3),
                                                 (16384, 128, 32, 8, 1, 16), (32768, 128, 8, 8, 1, 2),
                                                 (65536, 256, 4, 4, 1, 1), (8192, 64, 64, 1, 1, 64)])
def test_masked_tile_order_sections(sk, d, hq, hk, b, want):
    """The masked dense tile order goes section by section (sm90/scheduler.h): as many (batch, head) pairs as keep
    the section's K/V within 32 MB, whole GQA groups, at least one, at most all of them."""
    q = torch.zeros(b, 16, hq, d, dtype=torch.bfloat16)
    k = torch.zeros(b, sk, hk, d, dtype=torch.bfloat16)
    p, args = _args(q, k, k, torch.empty_like(q), "bshd")
    assert _lib.op_plan(OP, "sm90", args)["l2_heads"] == want


def test_fallback_for_misaligned_view(capfd, monkeypatch):
    base = torch.zeros(1, 50, 2, 136, dtype=torch.bfloat16)
    view = base[..., 1:129]            # 2-byte offset, seq/head strides not a multiple of 8 elements
    sel, err = _choose(torch.zeros(1, 50, 2, 128, dtype=torch.bfloat16), "bshd", capfd, monkeypatch, view)
    assert sel.kernel.name == "baseline"
    assert "sm90: q pointer is not 16-byte aligned (address % 16 = 2)" in sel.why, sel.why
    assert f"sm_90a): {sel.why}" in err, err


def test_fallback_for_odd_strides_and_other_vendor():
    base = torch.zeros(1, 40, 2, 132, dtype=torch.bfloat16)
    view = base[..., :128]             # aligned pointer, strides 264 and 132 elements: 132 % 8 != 0
    p, args = _args(view, view, view, torch.empty_like(view), "bshd")
    why = _lib.op_supports(OP, "sm90", args, "cuda")
    assert why == "q_strides[2]=132 is not accepted by the sm90 kernel; accepted: a multiple of 8 elements in [0, 2^38)"
    sel = dispatch.select(OP, "sm_90a", _call(p), supports=dispatch.runtime_check(OP, args, "cuda"))
    assert sel.kernel.name == "baseline" and why in sel.why
    q = torch.zeros(1, 40, 2, 128, dtype=torch.bfloat16)
    p, args = _args(q, q, q, torch.empty_like(q), "bshd")
    assert _lib.op_supports(OP, "sm90", args, "cuda") is None
    assert "accepted: cuda" in _lib.op_supports(OP, "sm90", args, "hip")
    assert _lib.op_supports(OP, "baseline", args, "hip") is None
    with pytest.raises(ValueError, match="kernel='nope' is not a kernel of op 'attention_fwd'"):
        _lib.op_supports(OP, "nope", args, "cuda")


def test_quantized_cache_plan_expands_into_the_workspace():
    """A quantized cache on sm90 (sm90/expand.h): the workspace holds the tile counter, then K and V expanded to 16-bit
    elements, 256-byte aligned: paged, a slot per sequence of its block-table row's capacity (with seqused_k, at most
    max_seqlen_k); varlen, the cache's own rows. FNUZ (MI300X's FP8) is refused by name; the expansion's grid covers
    every (sequence, K/V head)."""
    from test_sm90_decode_host import _paged_decode  # 2 sequences of 20 keys, Hq 8, Hk 2, pages of 16, 2 a row

    for cache in ("fp8", "fp4"):
        q, k, v, cu_q, cu_k, mq, mk, table, quant = _paged_decode(40, 128, cache)
        p = validate.check_varlen_inputs(q, k, v, cu_q, cu_k, mq, mk, "rtne", None, None, (-1, -1), table, None, quant)
        args = stub.args_block_varlen(q, k, v, None, cu_q, cu_k, table, p, H100, None, 0, quant)
        assert _lib.op_supports(OP, "sm90", args, "cuda") is None
        plan = _lib.op_plan(OP, "sm90", args)
        used = torch.tensor([20, 5], dtype=torch.int32)
        pu = validate.check_varlen_inputs(q, k, v, cu_q, cu_k, mq, mk, "rtne", None, None, (-1, -1), table, used, quant)
        plan_used = _lib.op_plan(OP, "sm90", stub.args_block_varlen(q, k, v, None, cu_q, cu_k, table, pu, H100, used, 0,
                                                                    quant))
        assert plan_used["expanded_rows"] == 2 * 20, plan_used  # seqused_k: at most max_seqlen_k a sequence
        rows = 2 * 2 * 16  # no seqused_k: the block table's capacity (every key of cu_seqlens_k counts)
        assert plan["expanded_rows"] == rows, plan
        assert plan["workspace_bytes"] == 256 + 2 * (-(-rows * 2 * 128 * 2 // 256) * 256), plan
        lanes = 32 if cache == "fp8" else 16  # a row's 4-byte units (D 128: 32 FP8, 16 FP4)
        assert plan["expand_ctas"] == 2 * 2 * -(-20 // (plan["block"] // lanes)), plan  # (sequence, K/V head) pairs
        # varlen: the cache's own rows
        kv = kvquant.quantize_fp8(torch.randn(37, 2, 128), torch.ones(()))
        cu = torch.tensor([0, 17, 37], dtype=torch.int32)
        qv = torch.zeros(40, 8, 128, dtype=torch.bfloat16)
        cq = torch.tensor([0, 20, 40], dtype=torch.int32)
        quant8 = validate.KvQuant(k_descale=torch.ones(2, 2), v_descale=torch.ones(1))
        p = validate.check_varlen_inputs(qv, kv, kv, cq, cu, 20, 20, "rtne", None, None, (-1, -1), None, None, quant8)
        args = stub.args_block_varlen(qv, kv, kv, None, cq, cu, None, p, H100, None, 0, quant8)
        plan = _lib.op_plan(OP, "sm90", args)
        assert plan["expanded_rows"] == 37, plan
    q, k, v, cu_q, cu_k, mq, mk, table, quant = _paged_decode(40, 128, "fnuz")
    p = validate.check_varlen_inputs(q, k, v, cu_q, cu_k, mq, mk, "rtne", None, None, (-1, -1), table, None, quant)
    args = stub.args_block_varlen(q, k, v, None, cu_q, cu_k, table, p, H100, None, 0, quant)
    assert _lib.op_supports(OP, "sm90", args, "cuda") == (
        "kv_dtype=2 is not accepted by the sm90 kernel; accepted: 0 (same: K/V in q's dtype), 1 (fp8_e4m3), "
        "3 (fp4_e2m1)")
