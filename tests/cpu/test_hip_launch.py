"""The HIP launch path without an AMD GPU: the bytes the HIP loader passes are the bytes the code object reads.

A stand-in libamdhip64 (hip_standin/libamdhip64.c, built here with gcc) exports what
jit/runtime/loader_hip.cpp binds and records every module load (the image), function lookup and
launch (grid, block, shared bytes, stream, the kernarg buffer from `extra`). A child process (this
file run as a script, so the stand-in never enters the pytest process) builds the forward's gfx942
variants that `python -m rtcattn warm --all --arch gfx942` builds and gfx90a's rtne ones, and a sample
of the backward's (both kernels, both archs; _variants), through dispatch.build, and launches each
once through rtc_op_launch on vendor "hip" (the backward: its three stages). Each recorded launch is then checked
against the code object's own AMDGPU metadata (llvm-readelf --notes) and its kernarg bytes decoded
with the layout of the kernels' parameter structs (parsed from their headers, offsets from g++,
the same offsets asserted for the amdgcn targets with clang) to the values of the call.
"""
import itertools
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rtcattn.runtime import manifest  # pure Python: no runtime library is loaded in the pytest process

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

pytestmark = pytest.mark.slow

ARCHS = ("gfx942", "gfx90a")
STANDIN_SRC = os.path.join(HERE, "hip_standin", "libamdhip64.c")
OP_DIRS = [os.path.join(ROOT, "op_sources", op) for op in ("attention_fwd", "attention_bwd")]
COMMON = os.path.join(ROOT, "csrc_common")
# The struct each (op, kernel) takes by value, and the headers declaring them (include names under an op's folder, or
# COMMON: attn_params.h, which the attention ops share).
PARAM_STRUCT = {("attention_fwd", "baseline"): "AttnParams", ("attention_fwd", "gfx942"): "Gfx942Params",
                ("attention_fwd", "gfx942_decode"): "DecodeParams", ("attention_bwd", "baseline"): "BwdParams",
                ("attention_bwd", "gfx942"): "BwdParams"}
PARAM_HEADERS = ("attn_params.h", "gfx942/params.h", "decode_params.h", "gfx942_decode/params.h", "bwd_params.h")
INCLUDES = [arg for d in (*OP_DIRS, COMMON) for arg in ("-I", d)]


def _header(name: str) -> str:
    """Where an include name of PARAM_HEADERS lives: an op's folder, else csrc_common (as the compilers find it)."""
    return next((p for p in (os.path.join(d, name) for d in OP_DIRS) if os.path.exists(p)), os.path.join(COMMON, name))


# Fake device addresses above 2^32 (a pointer truncated to 32 bits shows) and a fake stream.
ADDR = {"q": 0x7F1200010000, "k": 0x7F1300020000, "v": 0x7F1400030000, "o": 0x7F1500040000,
        "lse": 0x7F1600050000}
GRAD_ADDR = {"dout": 0x7F2100010000, "dq": 0x7F2200020000, "dk": 0x7F2300030000, "dv": 0x7F2400040000}  # backward
WORKSPACE = 0x7F1A00000000
CU_Q, CU_K, TABLE = 0x7F1700060000, 0x7F1800070000, 0x7F1900080000  # packed sequences' metadata
# A quantized cache's descales (FP8) or scales (FP4).
# ALiBi's slopes and dropout's (seed, offset) (issue 25).
ALIBI, RNG_STATE = 0x7F1F000D0000, 0x7F20000E0000
SOFTCAP, DROPOUT_P = 30.0, 0.125
QUANT = {"k_descale": 0x7F1B00090000, "v_descale": 0x7F1C000A0000, "k_scale": 0x7F1D000B0000,
         "v_scale": 0x7F1E000C0000}
STREAM = 0x5EED0000
NUM_CUS = 304
LDS_LIMIT = 65536
LOG2E = 1.4426950408889634


# Ops this test does not launch yet, and why (none now).
NOT_YET: set = set()
# The backward's variants launched here (mask, kv, head dim, dtype, round mode): its parameter block (the forward's
# AttnParams, then the gradients') and three launches are the same for every variant of a kernel but for the values the
# sample varies: both layouts (rtna: [B, H, S, D]), a window over packed sequences, fp16, buckets 64-192.
BWD_SAMPLE = {("none", "dense", 128, "bf16", "rtne"), ("window", "varlen", 64, "fp16", "rtne"),
              ("window", "dense", 192, "bf16", "rtna")}
# The score modifications and dropout (issue 25) change no grid (the parameter block is one struct, their fields read
# or not; a call's cap, slopes and dropout fill them): their variants are launched at one (mask, kv, head dim, dtype,
# round mode) each, with both modifications and dropout on (every field they add filled by the call; the plain
# variants launched everywhere else leave them zero), with the arguments that value serves (CI's time: each value
# alone was launched by earlier runs).
MOD_SAMPLE = ("window", "paged", 128, "bf16", "rtne")
MOD_SAMPLE_BWD = ("window", "varlen", 64, "fp16", "rtne")
MOD_VALUE = ("softcap_alibi", "dropout")
# The forward baseline on gfx90a: two variants, one a layout ([B, H, S, D] for its fp16: _problem) and both kv
# forms' metadata between them; gfx942's take every mask, kv form, dtype and mode (the baseline's block, grid and
# parameter block are the same on both archs).
BASELINE_OTHER_ARCH = {("none", "dense", "fp16"), ("window", "varlen", "bf16")}
# The forward baseline's bucket launched here (CI's time; _variants), and the buckets of the fast kernels' packed
# calls on archs other than gfx942 (the ISA tests' PACKED_OTHER_ARCH_BUCKETS, whose builds this test reads).
BASELINE_BUCKETS = (128,)
PACKED_OTHER_ARCH_BUCKETS = (128,)


def _variants():
    """What `warm --all --arch gfx942,gfx90a` builds: every op's variants for those archs; of those that read a
    quantized KV cache (kv_dtype other than "same"), one per (arch, kernel, kv_dtype): bucket 128, windowed, rtne,
    paged, bf16. What a quantized cache adds to the parameter block and the launch (the kv_dtype value, descales or
    scales and their strides, byte strides) is the same for every bucket, mask, rounding, kv form and dtype, and those
    axes' launches are checked on the `same` variants: 18 compiles where every (kv form, dtype) would add 72. The
    rounding mode changes no launch field either: gfx90a's variants are its rtne ones (bf16 and fp16), gfx942's every
    mode on dense calls; the forward's packed calls on rtne bf16, and fp16 on gfx942 (the ISA tests' sample, whose
    builds this test reads). The score-mod and dropout variants: both modifications with dropout (MOD_VALUE) at one
    sample (MOD_SAMPLE, MOD_SAMPLE_BWD).
    The forward baseline's at bucket 128 (BASELINE_BUCKETS), two of them on gfx90a (BASELINE_OTHER_ARCH): its block,
    grid and parameter block (AttnParams, the same struct at every bucket) depend on neither the bucket nor the arch,
    and the head dim the call carries in it is decoded at every bucket by the fast kernels' launches, which take the
    same struct's fields. gfx90a's packed calls of the gfx942 and gfx942_decode kernels at bucket 128
    (PACKED_OTHER_ARCH_BUCKETS): the other buckets' packed launches are gfx942's (the same plan and parameter block;
    the ISA tests' sample); gfx90a's fp16 ones, gfx942's packed fp16 ones and gfx942's rtna / rtz ones at the end
    buckets (the ISA tests' sample too)."""
    m = manifest.load()

    def keep(v):
        key = (v["mask"], v["kv"], v["head_dim"], v["dtype"], v["round_mode"])
        plain = (v["score_mod"], v["dropout"]) == ("plain", "nodrop")
        if dict(v.values).get("kv_dtype", "same") != "same":  # one per (arch, kernel, kv_dtype), plain scores
            return plain and key == ("window", "paged", 128, "bf16", "rtne")
        if not plain:
            return (v["score_mod"], v["dropout"]) == MOD_VALUE and key == (
                MOD_SAMPLE_BWD if v.op == "attention_bwd" else MOD_SAMPLE)
        if v.op == "attention_bwd":
            return key in BWD_SAMPLE
        if v.kernel == "baseline" and (v["head_dim"] not in BASELINE_BUCKETS or (
                v.arch != "gfx942" and (v["mask"], v["kv"], v["dtype"]) not in BASELINE_OTHER_ARCH)):
            return False
        if v.kernel != "baseline" and v.arch != "gfx942" and v["kv"] != "dense":
            return v["head_dim"] in PACKED_OTHER_ARCH_BUCKETS
        if v.kernel != "baseline" and ((v["dtype"] == "fp16" and (v.arch != "gfx942" or v["kv"] != "dense"))
                                       or v["round_mode"] != "rtne"):
            ends = m.op(v.op).kernel(v.kernel).axes["head_dim"].buckets
            return v["head_dim"] in (ends[0], ends[-1])
        return True
    return [v for op in m.ops if op not in NOT_YET for v in m.variants(op, archs=list(ARCHS))
            if (v["round_mode"] == "rtne" or v.arch == "gfx942") and keep(v)
            and (v.op != "attention_fwd" or v["kv"] == "dense" or (v["round_mode"] == "rtne" and
                                                                    (v["dtype"] == "bf16" or v.arch == "gfx942")))]


VARIANTS = _variants()


def _problem(v) -> dict:
    """The op_args values of the one call made for variant v (fake addresses: the stand-in runs nothing)."""
    if v.op not in ("attention_fwd", "attention_bwd"):
        raise NotImplementedError(f"no launch problem for op {v.op!r}; add one to {__file__}")
    d = v["head_dim"]
    # gfx942: 2*50*22 = 2200 q blocks of 384 rows on 304 CUs leave a tail of 72 (head-dim buckets up to 128; 3200
    # blocks of 256 rows at 192: 160; 6400 of 128 at 256: 16), which the planner splits (V^T, attention, merge);
    # Sq != Sk and B != H so a swapped field shows.
    # gfx942_decode: 3 query rows of 8 q heads on 2 K/V heads (a decode call, GQA 4), 5000 keys: 2 x 2 items that
    # the planner splits (attention, merge).
    b, h, sq, sk = {"gfx942": (2, 50, 8192, 8000), "gfx942_decode": (2, 8, 3, 5000)}.get(v.kernel, (2, 3, 40, 50))
    # A masked variant gets a window (left 17, causal) and, where it takes one, a K/V head count below h.
    gqa = v.kernel == "baseline" or v.op == "attention_bwd"
    hk, window = (h, (-1, -1)) if v["mask"] == "none" else (1 if gqa else h, (17, 0))
    if v.kernel == "gfx942_decode":
        hk = 2

    # One code object serves both layouts (the strides carry it): the rtna variants (and gfx90a's fp16 ones) get
    # [B, H, S, D] tensors, the others [B, S, H, D], so both stride orders reach every kernel, arch, mask and head dim.
    bhsd = v["round_mode"] == "rtna" or (v.arch == "gfx90a" and v["dtype"] == "fp16")

    def strides(s):  # contiguous, in (batch, seq, head) order whatever the layout
        return [h * s * d, d, s * d] if bhsd else [s * h * d, h * d, d]

    call = dict(ADDR, q_strides=strides(sq), k_strides=strides(sk), v_strides=strides(sk), o_strides=strides(sq),
                batch=b, heads=h, seq_q=sq, seq_k=sk, head_dim=d, heads_k=hk, window_left=window[0],
                window_right=window[1], softmax_scale=1 / math.sqrt(d), tail_split=-1, num_cus=NUM_CUS)
    if v["kv"] != "dense":  # b sequences packed in rows of [total, heads, D]; paged: k, v in pages of 16 rows
        packed = lambda heads: [0, heads * d, d]  # noqa: E731
        call.update(q_strides=packed(h), o_strides=packed(h), k_strides=packed(hk), v_strides=packed(hk),
                    cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K, total_q=b * sq - 5, total_k=b * sk - 7)
        if v["kv"] == "paged":
            pages = b * sk // 16 + 3
            call.update(k_strides=[16 * hk * d, hk * d, d], v_strides=[16 * hk * d, hk * d, d], total_k=0,
                        block_table=TABLE, page_size=16, num_pages=pages, pages_per_seq=sk // 16 + 1,
                        table_stride=sk // 16 + 2)
    if v.op == "attention_bwd":  # the gradients: dO and dQ in q's shape and strides, dK and dV in k's
        call.update(GRAD_ADDR, dout_strides=call["q_strides"], dq_strides=call["q_strides"],
                    dk_strides=call["k_strides"], dv_strides=call["k_strides"], deterministic=0)
        del call["tail_split"], call["num_cus"]
    mods = {"plain": (), "softcap": ("softcap",), "alibi": ("alibi",), "softcap_alibi": ("softcap", "alibi")}
    if "softcap" in mods[v["score_mod"]]:
        call.update(softcap=SOFTCAP)
    if "alibi" in mods[v["score_mod"]]:  # fp32 [batch, heads]
        call.update(alibi_slopes=ALIBI, alibi_strides=[h, 1])
    if v["dropout"] == "dropout":
        call.update(dropout_p=DROPOUT_P, rng_state=RNG_STATE)
    kv_dtype = dict(v.values).get("kv_dtype", "same")
    if kv_dtype != "same":  # the axis's value in the block; FP8: per (sequence, head) descales; FP4: HND bytes
        call.update(kv_dtype=manifest.load().op(v.op).axis("kv_dtype").define_value(kv_dtype))
        if kv_dtype == "fp4_e2m1":
            rows = call["k_strides"][0] // (hk * d) if v["kv"] == "paged" else 0
            hnd = [rows * hk * d // 2, d // 2, rows * d // 2] if v["kv"] == "paged" else [0, hk * d // 2, d // 2]
            scales = [rows * hk, hk, 1] if v["kv"] == "paged" else [0, hk, 1]
            call.update(k_strides=hnd, v_strides=hnd, k_scale=QUANT["k_scale"], v_scale=QUANT["v_scale"],
                        k_scale_strides=scales, v_scale_strides=scales)
        else:
            call.update(k_descale=QUANT["k_descale"], v_descale=QUANT["v_descale"], k_descale_strides=[hk, 1],
                        v_descale_strides=[0, 0])
    return call


# ---- the child: builds every variant, then launches each through the stand-in ---------------------

def _child(cfg_path: str) -> None:
    cfg = json.load(open(cfg_path))
    from rtcattn.runtime import dispatch
    lib = dispatch.lib()
    m = manifest.load()
    # Archs taken in turn: each arch's compiler may be serialized (hipRTC is, per process), so a
    # pool of two keeps both cores busy only while the archs alternate.
    by_arch = [[v for v in VARIANTS if v.arch == a] for a in ARCHS]
    order = [v for group in itertools.zip_longest(*by_arch) for v in group if v is not None]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:  # ctypes drops the GIL in rtc_build
        built = dict(zip(order, pool.map(dispatch.build, order)))
    results = [built[v] for v in VARIANTS]
    t_build = time.perf_counter() - t0
    # Only now does the stand-in go on the library path: from the start, the hipRTC compiler would
    # open it too (it tries libamdhip64.so after libhiprtc.so*), find no hiprtc symbols and leave
    # gfx90a to clang, i.e. other code objects than `warm` builds on this machine.
    os.environ["RTCATTN_LIBRARY_PATH"] = cfg["standin_dir"]
    assert lib.device_count("hip") == 1, "the stand-in libamdhip64 was not the one loaded"
    out, t1 = [], time.perf_counter()
    for i, (v, r) in enumerate(zip(VARIANTS, results)):
        values = _problem(v)
        args = lib.op_args(v.op, **values)
        ws = lib.op_workspace_bytes(v.op, v.kernel, args)
        if ws > 0:
            values.update(workspace=WORKSPACE, workspace_bytes=ws)
            args.workspace, args.workspace_bytes = WORKSPACE, ws
        plan = lib.op_plan(v.op, v.kernel, args)
        with open(os.path.join(cfg["log_dir"], f"expected{i}.co"), "wb") as f:
            f.write(r.code())
        lib.op_launch(r.program, v.op, v.kernel, args, "hip", 0, STREAM)
        out.append(dict(op=v.op, kernel=v.kernel, arch=v.arch, name=v.name, symbol=m.op(v.op).kernel(v.kernel).symbol,
                        values=values, plan=plan, compiler=r.compiler_id, origin=r.origin, code=f"expected{i}.co"))
    with open(cfg["result"], "w") as f:
        json.dump({"variants": out, "build_s": t_build, "launch_s": time.perf_counter() - t1}, f)


# ---- the parent: tools, the stand-in, the parameter layout, the child's records ---------------------

def _tool(*names):
    for n in names:
        if n and shutil.which(n):
            return shutil.which(n)
    return None


GCC, GXX = _tool("gcc", "cc"), _tool("g++", "c++")
CLANG = _tool(os.environ.get("RTCATTN_CLANG"), "clang++-19", "clang++")
READELF = _tool("llvm-readelf-19", "llvm-readelf")


def _need_tools():
    missing = [n for n, t in (("gcc", GCC), ("g++", GXX), ("clang++", CLANG), ("llvm-readelf", READELF)) if not t]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def _struct_fields(text: str, name: str):
    """(base struct or None, member names in order) of `struct name [: base] { ... };` in a header; a member whose
    type is another struct of the headers is named by its own members (`a.q`, `a.k`, ...)."""
    m = re.search(rf"struct\s+{name}\s*(?::\s*(\w+)\s*)?\{{(.*?)\}};", text, re.S)
    assert m, f"struct {name} not found"
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", m.group(2), flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        assert not re.search(r"[\[\(\{=]", decl), f"struct {name}: cannot read the member declaration {decl!r}"
        first, *rest = decl.split(",")
        words = re.findall(r"\w+", first)
        if len(words) == 2 and re.search(rf"struct\s+{words[0]}\b", text):  # a struct member: its fields
            names += [f"{words[1]}.{f}" for f in _struct_fields(text, words[0])[1]]
            continue
        names += [words[-1]] + [r.strip() for r in rest]
    return m.group(1), names


def _param_members() -> dict:
    """{struct: [member, ...]} with a derived struct's base members first, read from the headers."""
    text = "\n".join(open(_header(h)).read() for h in PARAM_HEADERS)
    own = {s: _struct_fields(text, s) for s in PARAM_STRUCT.values()}
    return {s: (own[base][1] if base else []) + names for s, (base, names) in own.items()}


@pytest.fixture(scope="session")
def param_layout(tmp_path_factory):
    """{struct: {"size", "fields": [[name, offset, size, kind], ...]}}: offsets from g++ on the host,
    then asserted (static_assert) for the amdgcn targets by clang, so host and kernel agree."""
    _need_tools()
    work = tmp_path_factory.mktemp("kernarg_layout")
    members = _param_members()
    lines = ["#include <cstdio>", "#include <type_traits>", *[f'#include "{h}"' for h in PARAM_HEADERS],
             "template <class T> const char* kind() { return std::is_pointer<T>::value ? \"ptr\" : "
             "std::is_floating_point<T>::value ? \"f\" : std::is_signed<T>::value ? \"i\" : \"u\"; }",
             "int main() {", 'std::printf("{");']
    for si, (s, names) in enumerate(members.items()):
        lines.append(f'std::printf("%s\\"{s}\\":{{\\"size\\":%zu,\\"fields\\":[", "{"," if si else ""}", sizeof({s}));')
        for fi, f in enumerate(names):
            lines.append(f'std::printf("%s[\\"{f}\\",%zu,%zu,\\"%s\\"]", "{"," if fi else ""}", '
                         f"(size_t)__builtin_offsetof({s}, {f}), sizeof((({s}*)0)->{f}), "
                         f"kind<decltype((({s}*)0)->{f})>());")
        lines.append('std::printf("]}");')
    lines += ['std::printf("}\\n");', "return 0; }"]
    src, exe = work / "layout.cpp", work / "layout"
    src.write_text("\n".join(lines) + "\n")
    inc = INCLUDES
    subprocess.run([GXX, "-std=c++17", "-Wno-invalid-offsetof", *inc, str(src), "-o", str(exe)], check=True)
    layout = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    checks = [f'#include "{h}"' for h in PARAM_HEADERS]
    for s, lay in layout.items():
        checks.append(f'static_assert(sizeof({s}) == {lay["size"]}, "sizeof {s}");')
        checks += [f"static_assert(__builtin_offsetof({s}, {f}) == {off} && sizeof((({s}*)0)->{f}) == {n}, "
                   f'"{s}.{f}");' for f, off, n, _ in lay["fields"]]
    dev = work / "layout_check.hip"
    dev.write_text("\n".join(checks) + "\n")
    p = subprocess.run([CLANG, "-x", "hip", "--cuda-device-only", *[f"--offload-arch={a}" for a in ARCHS],
                        "-nogpulib", "-nogpuinc", "-fsyntax-only", "-Wno-invalid-offsetof", *inc, str(dev)],
                       capture_output=True, text=True)
    assert p.returncode == 0, f"the parameter structs lay out differently for {ARCHS} than on the host:\n{p.stderr}"
    return layout


@pytest.fixture(scope="session")
def hip_cache_dir(tmp_path_factory):
    """One code-object cache for the whole run (RTCATTN_CACHE_DIR of the child)."""
    return tmp_path_factory.mktemp("rtcattn_cache")


def _user_cache_dir() -> str:
    """This process's user code-object cache (where tests/cpu/test_gfx942_isa.py compiled the fast kernel's variants),
    given to the child as a read-only cache: an entry is used only under its full key (compiler, source, options),
    so what it builds is what it would compile, and it compiles what is missing into its own cache."""
    from rtcattn.runtime import _lib
    return _lib.info()["user_cache"]["path"]


@pytest.fixture(scope="session")
def hip_run(tmp_path_factory, hip_cache_dir):
    """Runs the child once; returns its result and the stand-in's records."""
    _need_tools()
    work = tmp_path_factory.mktemp("hip_launch")
    standin, log = work / "standin", work / "log"
    standin.mkdir()
    log.mkdir()
    subprocess.run([GCC, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(standin / "libamdhip64.so"),
                    STANDIN_SRC, "-lpthread"], check=True)
    cfg = work / "cfg.json"
    cfg.write_text(json.dumps({"standin_dir": str(standin), "log_dir": str(log), "result": str(work / "result.json")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCATTN_")}  # no knob of the caller's
    env.update(PYTHONPATH=os.pathsep.join(p for p in (os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH"))
                                          if p),
               RTCATTN_CACHE_DIR=str(hip_cache_dir), RTCATTN_SYSTEM_CACHE=_user_cache_dir(), STANDIN_HIP_LOG=str(log))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), str(cfg)], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    wall = time.perf_counter() - t0
    assert p.returncode == 0, f"child failed (rc {p.returncode}):\n{p.stdout}\n{p.stderr}"
    result = json.loads((work / "result.json").read_text())
    calls = [json.loads(line) for line in (log / "calls.jsonl").read_text().splitlines()]
    compilers = sorted({(r["arch"], r["compiler"]) for r in result["variants"]})
    print(f"\nhip launch child: {wall:.1f} s ({result['build_s']:.1f} s building {len(VARIANTS)} variants with "
          f"{', '.join(f'{a}: {c}' for a, c in compilers)}; {result['launch_s']:.2f} s launching)")
    return {"result": result, "calls": calls, "log": log, "wall_s": wall}


def _by_call(calls, name):
    return [c for c in calls if c["call"] == name]


def _kernel_notes(path: str, symbol: str) -> dict:
    """The amdhsa.kernels entry named symbol in the code object's AMDGPU metadata note."""
    import yaml
    text = subprocess.run([READELF, "--notes", path], check=True, capture_output=True, text=True).stdout
    m = re.search(r"^\s*---\s*$(.*?)^\.\.\.\s*$", text, re.S | re.M)
    assert m, f"no AMDGPU metadata in {path}:\n{text}"
    kernels = yaml.safe_load(m.group(1))["amdhsa.kernels"]
    hits = [k for k in kernels if k[".name"] == symbol]
    assert len(hits) == 1, f"{path}: kernel {symbol!r} among {[k['.name'] for k in kernels]}"
    assert hits[0][".symbol"] == symbol + ".kd"
    return hits[0]


_FORMATS = {("ptr", 8): "<Q", ("i", 4): "<i", ("i", 8): "<q", ("u", 4): "<I", ("u", 8): "<Q", ("f", 4): "<f"}


def _decode(blob: bytes, layout: dict) -> dict:
    return {f: struct.unpack_from(_FORMATS[(kind, n)], blob, off)[0] for f, off, n, kind in layout["fields"]}


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _expected_params(rec: dict, stage: int) -> dict:
    """Every field of the kernel's parameter struct, from the call's arguments (and, for the fast kernel, its plan)."""
    a, plan = rec["values"], rec["plan"]
    if rec["op"] == "attention_bwd":  # the forward's block (as the forward baseline's), then the gradients'
        want = {f"a.{f}": x for f, x in _expected_params(dict(rec, op="attention_fwd", kernel="baseline"), 0).items()}
        want.update(dout=a["dout"], dlse=0, dq=a["dq"], dk=a["dk"], dv=a["dv"], delta=a["workspace"], stage=stage,
                    dq_accum=0)  # the fused dQ's sums: the sm90 kernel's alone
        for t, name in (("do", "dout"), ("dq", "dq"), ("dk", "dk"), ("dv", "dv")):
            want.update(zip((f"{t}_sb", f"{t}_ss", f"{t}_sh"), a[f"{name}_strides"]))
        return want
    scale = _f32(a["softmax_scale"])
    want = {f: a[f] for f in ("q", "k", "v", "o", "lse", "batch", "heads", "seq_q", "seq_k", "head_dim", "heads_k",
                              "window_left", "window_right")}
    want.update(workspace=a.get("workspace", 0), workspace_bytes=a.get("workspace_bytes", 0), scale=scale,
                scale_log2=_f32(scale * LOG2E), tail_split=0)
    for t in "qkvo":
        want.update(zip((f"{t}_sb", f"{t}_ss", f"{t}_sh"), a[f"{t}_strides"]))
    want.update(cu_q=a.get("cu_seqlens_q", 0), cu_k=a.get("cu_seqlens_k", 0), block_table=a.get("block_table", 0),
                seqused_k=a.get("seqused_k", 0))
    want.update({f: a.get(f, 0) for f in ("total_q", "total_k", "page_size", "num_pages", "pages_per_seq",
                                           "table_stride", *QUANT)})
    cap = a.get("softcap", 0.0)  # the cap's two factors, float32 (0 when off); ALiBi's slopes; dropout's state
    want.update(softcap_log2=_f32(cap * LOG2E) if cap else 0.0,
                softcap_exp2=_f32(2.0 * scale / cap * LOG2E) if cap else 0.0,
                alibi_slopes=a.get("alibi_slopes", 0), rng_state=a.get("rng_state", 0))
    want.update(zip(("alibi_sb", "alibi_sh"), a.get("alibi_strides", (0, 0))))
    p = a.get("dropout_p", 0.0)
    want.update(drop_threshold=round(p * 65536) if p else 0, drop_scale=_f32(1.0 / (1.0 - p)) if p else 0.0)
    for t in "kv":  # a quantized cache's descale / scale strides (zeros when the call has none)
        want.update(zip((f"{t}d_sb", f"{t}d_sh"), a.get(f"{t}_descale_strides", (0, 0))))
        want.update(zip((f"{t}s_sb", f"{t}s_ss", f"{t}s_sh"), a.get(f"{t}_scale_strides", (0, 0, 0))))
    if rec["kernel"] == "gfx942":
        want.update({f: plan[f] for f in ("nqb", "nkb", "n_prefix", "tail", "split_g", "n_swz", "vt_bytes")})
        want.update(tail_split=plan["split_g"], stage=stage, vt_head_blocks=plan["vt_head_blocks"])
    if rec["kernel"] == "gfx942_decode":
        want.update(tail_split=plan["splits"], stage=stage, group=plan["group"], chunks=plan["chunks"],
                    splits=plan["splits"])
    return want


def test_every_variant_loaded_once_through_the_standin(hip_run):
    calls, res = hip_run["calls"], hip_run["result"]
    assert calls[0]["call"] == "hipInit", calls[:3]
    assert [r["name"] for r in res["variants"]] == [v.name for v in VARIANTS]
    assert [r["arch"] for r in res["variants"]] == [v.arch for v in VARIANTS]
    assert not [c for c in calls if "error" in c], [c for c in calls if "error" in c]
    loads, fns = _by_call(calls, "hipModuleLoadData"), _by_call(calls, "hipModuleGetFunction")
    assert len(loads) == len(fns) == len(VARIANTS)
    assert {c["device"] for c in _by_call(calls, "hipSetDevice") + _by_call(calls, "hipGetDevice")} <= {0}
    # gfx942: V^T, attention and (the dense problem splits its tail) the merge; packed calls never split.
    # gfx942_decode: attention and (the problem splits) the merge.
    # attention_bwd: delta, dK / dV, dQ.
    n_launches = sum(3 if r["op"] == "attention_bwd" else
                     (3 if "-dense-" in r["name"] else 2) if r["kernel"] == "gfx942" else
                     2 if r["kernel"] == "gfx942_decode" else 1 for r in res["variants"])
    assert len(_by_call(calls, "hipModuleLaunchKernel")) == n_launches


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=[f"{v.arch}-{v.name}" for v in VARIANTS])
def test_launch_matches_code_object(hip_run, param_layout, index):
    calls, log = hip_run["calls"], hip_run["log"]
    rec = hip_run["result"]["variants"][index]
    tag = f"{rec['arch']} {rec['name']}"
    load = _by_call(calls, "hipModuleLoadData")[index]
    fn = _by_call(calls, "hipModuleGetFunction")[index]
    launches = [c for c in _by_call(calls, "hipModuleLaunchKernel") if c["function"] == fn["function"]]

    # The image the loader handed over is the built code object, whole (its ELF size is its length).
    image = (log / load["file"]).read_bytes()
    assert image == (log / rec["code"]).read_bytes(), f"{tag}: loaded image differs from the built code object"
    assert fn["module"] == load["module"] and fn["symbol"] == rec["symbol"], (tag, fn)
    notes = _kernel_notes(str(log / load["file"]), fn["symbol"])
    assert notes[".wavefront_size"] == 64, (tag, notes)

    plan, a = rec["plan"], rec["values"]
    if rec["op"] == "attention_fwd" and rec["kernel"] == "gfx942":
        # the bucket's work item: 3 q tiles of 16 rows per wave up to 128, 2 at 192, 1 at 256
        assert plan["bucket"] == a["head_dim"], plan
        assert plan["q_rows"] == {64: 384, 96: 384, 128: 384, 192: 256, 256: 128}[plan["bucket"]], plan
    if rec["op"] == "attention_bwd":  # delta a thread a row; dK / dV a block per key tile; dQ a block per row tile
        rows, keys, block = {"baseline": (16, 16, 128), "gfx942": (64, 64, 256)}[rec["kernel"]]
        grids = [(math.ceil(a["seq_q"] / block), a["heads"], a["batch"]),
                 (math.ceil(a["seq_k"] / keys), a["heads_k"], a["batch"]),
                 (math.ceil(a["seq_q"] / rows), a["heads"], a["batch"])]
        assert [plan["delta_grid_x"], plan["dkdv_grid_x"], plan["dq_grid_x"]] == [g[0] for g in grids], plan
        assert plan["block"] == block and a["workspace_bytes"] == plan["workspace_bytes"] > 0, (a, plan)
        want = [(g, (block, 1, 1)) for g in grids]
    elif rec["kernel"] == "gfx942" and "-dense-" not in rec["name"]:
        # Packed sequences: no tail split; V^T then attention over every (q block, head, sequence) of the
        # longest sequence (blocks past a sequence's end exit at once).
        assert plan["split_g"] == 1 and plan["tail"] == 0 and "grid_merge" not in plan, plan
        assert plan["grid_attn"] == a["batch"] * a["heads"] * math.ceil(a["seq_q"] / plan["q_rows"]), plan
        want = [((g, 1, 1), (plan["block"], 1, 1)) for g in (plan["grid_vt"], plan["grid_attn"])]
    elif rec["kernel"] == "gfx942":
        assert plan["split_g"] > 1 and plan["tail"] > 0, f"{tag}: the problem must split the tail: {plan}"
        assert plan["nqb"] == math.ceil(a["seq_q"] / plan["q_rows"]) and plan["nkb"] == math.ceil(a["seq_k"] / 64), plan
        assert plan["n_prefix"] + plan["tail"] == a["batch"] * a["heads"] * plan["nqb"], plan
        assert a["workspace_bytes"] == plan["workspace_bytes"] > plan["vt_bytes"], (a, plan)
        grids = [plan["grid_vt"], plan["grid_attn"], plan["grid_merge"]]
        assert grids == [a["batch"] * a["heads"] * plan["nkb"], plan["n_prefix"] + plan["tail"] * plan["split_g"],
                         plan["tail"] * plan["q_rows"] // 16], plan
        want = [((g, 1, 1), (plan["block"], 1, 1)) for g in grids]
        assert plan["block"] == 512
    elif rec["kernel"] == "gfx942_decode":
        # Every q head of a K/V head and every query row packed into one 16-row item per (sequence, K/V head); the
        # KV split's parts, then the merge per item and 16-column tile of O.
        assert plan["group"] == 4 and plan["chunks"] == 1 and plan["items"] == a["batch"] * a["heads_k"], plan
        assert plan["splits"] > 1 and a["workspace_bytes"] == plan["workspace_bytes"] > 0, (a, plan)
        grids = [plan["grid_attn"], plan["grid_merge"]]
        assert grids == [plan["items"] * plan["splits"], plan["items"] * math.ceil(a["head_dim"] / 16)], plan
        want = [((g, 1, 1), (plan["block"], 1, 1)) for g in grids]
        assert plan["block"] == 64
    else:
        assert (plan["grid_x"], plan["grid_y"], plan["grid_z"]) == (math.ceil(a["seq_q"] / 16), a["heads"],
                                                                   a["batch"]), plan
        want = [((plan["grid_x"], plan["grid_y"], plan["grid_z"]), (plan["block"], 1, 1))]
    assert [(tuple(c["grid"]), tuple(c["block"])) for c in launches] == want, f"{tag}: launches {launches}"

    struct_name = PARAM_STRUCT[(rec["op"], rec["kernel"])]
    layout = param_layout[struct_name]
    for stage, c in enumerate(launches):
        size, what = c["size"], f"{tag} launch {stage}"
        assert c["stream"] == STREAM and c["shared_bytes"] == 0, (what, c)
        # The kernel's arguments: the one by-value block at offset 0, exactly the bytes passed;
        # hidden arguments (if any) come after it and are the HIP runtime's to fill.
        explicit = [x for x in notes[".args"] if not x[".value_kind"].startswith("hidden_")]
        hidden = [x for x in notes[".args"] if x[".value_kind"].startswith("hidden_")]
        assert explicit[0][".offset"] == 0 and explicit[0][".value_kind"] == "by_value", (what, notes[".args"])
        assert max(x[".offset"] + x[".size"] for x in explicit) == size == explicit[0][".size"], \
            f"{what}: kernarg block of {size} bytes passed, the kernel's explicit args {explicit}"
        assert all(x[".offset"] >= size for x in hidden), (what, notes[".args"])
        assert notes[".kernarg_segment_size"] >= size, (what, notes[".kernarg_segment_size"], size)
        assert size == layout["size"], f"{what}: {size} bytes passed, sizeof {struct_name} = {layout['size']}"
        threads = c["block"][0] * c["block"][1] * c["block"][2]
        assert threads <= notes[".max_flat_workgroup_size"], (what, threads, notes[".max_flat_workgroup_size"])
        if rec["op"] == "attention_bwd":
            assert threads == notes[".max_flat_workgroup_size"], (what, threads)
        elif rec["kernel"] == "gfx942":
            assert threads == notes[".max_flat_workgroup_size"] == 512, (what, threads)
        if rec["kernel"] == "gfx942_decode":
            assert threads == notes[".max_flat_workgroup_size"] == 64, (what, threads)
        assert notes[".group_segment_fixed_size"] + c["shared_bytes"] <= LDS_LIMIT, (what, notes)
        # The bytes decode, field by field of the kernel's struct, to the call's values.
        blob = (log / c["file"]).read_bytes()
        assert len(blob) == size
        got, expected = _decode(blob, layout), _expected_params(rec, stage)
        assert got.keys() == expected.keys(), f"{what}: fields {sorted(got)} vs expected {sorted(expected)}"
        bad = {f: (got[f], expected[f]) for f in got if got[f] != expected[f]}
        assert not bad, f"{what}: kernarg fields (got, expected): {bad}"


if __name__ == "__main__":
    _child(sys.argv[1])
