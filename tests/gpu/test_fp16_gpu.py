"""fp16 q, k, v on a GPU: the kernel dispatch picks (the arch's fast kernel, sm90 on Hopper) and the baseline
each meet the fp16 part of the numerics contract (docs/numerics.md §9), dense, masked, GQA, packed and paged, and
sit beside torch SDPA's fp16 backends as bf16 does."""
import math

import pytest
import torch

import numerics_suite as suite
import varlen_suite as vs
from rtcattn.ops import attention_fwd
from rtcattn.ops.attention_fwd import reference as ref
from rtcattn.runtime import dispatch, manifest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")]

F16 = torch.float16
DEV = "cuda"
SIZES = (1, 17, 128, 1000, 4096)
WINDOWS = [(-1, 0), (17, 3), (200, 0), (-1, 5)]
HEADS = [(8, 8), (8, 2), (4, 1)]


def run(q, k, v, layout, round_mode, softmax_scale, return_lse, window=(-1, -1)):
    import rtcattn
    return rtcattn.forward(q, k, v, layout=layout, round_mode=round_mode, softmax_scale=softmax_scale,
                           return_lse=return_lse, window_size=window)


@pytest.fixture(autouse=True, params=["dispatch", "baseline"])
def kernel(request):
    """Every test twice: on the kernel dispatch picks, and pinned to the baseline."""
    if request.param == "baseline":
        with dispatch.pinned(kernel="baseline"):
            yield request.param
    else:
        yield request.param


def test_fp16_runs_the_fast_kernel(kernel):
    q, k, v = suite.make_qkv("bshd", 1, 2, 200, 300, 128, DEV, dtype=F16)
    sel = attention_fwd.selection(q, k, v)
    arch = dispatch.arch_of(torch.device(DEV))
    # 200 query rows: the arch's first fast kernel that does not leave such calls to another at run time (a decode
    # kernel takes at most 16).
    fast = [k.name for k in manifest.load().op("attention_fwd").kernels
            if arch in k.archs and k.name != "baseline" and not k.declines_at_run_time]
    expected = "baseline" if kernel == "baseline" or not fast else fast[0]
    assert sel.kernel.name == expected and sel.variant["dtype"] == "fp16", (sel.kernel.name, sel.why)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_sizes_and_cross_attention(layout):
    suite.check_sizes(run, DEV, layout, "rtne", SIZES, dtype=F16)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_special_values(layout):
    suite.check_special_values(run, DEV, layout, "rtne", dtype=F16)
    suite.check_window_special_values(run, DEV, layout, "rtne", (-1, 0), sq=30, sk=20, hk=1, dtype=F16)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
def test_strided_views_and_determinism(layout):
    kernel_of = lambda q, k, v, layout: attention_fwd.selection(q, k, v, layout).kernel.name  # noqa: E731
    suite.check_strided(run, DEV, layout, "rtne", dtype=F16, kernel_of=kernel_of)
    suite.check_determinism(run, DEV, layout, "rtne", sq=1000, sk=4096, repeats=3, dtype=F16)


def test_every_head_dim():
    suite.check_head_dims(run, DEV, "bshd", "rtne", range(64, 257, 8), dtype=F16)


def test_round_mode_does_not_apply():
    q, k, v = suite.make_qkv("bhsd", 2, 4, 300, 500, 128, DEV, seed=4, dtype=F16)
    outs = [ref.bf16_bits(run(q, k, v, "bhsd", m, None, False)) for m in suite.MODES]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("heads", HEADS)
def test_masks_and_gqa(window, heads):
    hq, hk = heads
    for sq, sk in ((45, 1030), (700, 700), (1030, 45)):
        q, k, v = suite.make_qkv("bshd", 2, hq, sq, sk, 128, DEV, seed=sq + hk, hk=hk, dtype=F16)
        suite.check_accuracy(run, q, k, v, "bshd", "rtne", what="fp16 mask", window=window)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
@pytest.mark.parametrize("page", [16, 128])
def test_varlen_and_paged(window, page):
    lens_q, lens_k = [130, 1, 0, 40, 513], [700, 1, 77, 300, 513]
    b = vs.make_batch(lens_q, lens_k, 8, 2, 128, DEV, seed=page, dtype=F16)
    vs.check_accuracy(b, "rtne", window, what="fp16 varlen")
    vs.check_paged_equals_packed(b, page, "rtne", window, seed=page)
    vs.check_accuracy(vs.to_paged(b, page, seed=page), "rtne", window, what="fp16 paged")


def test_output_past_65504_is_inf(kernel):
    """As on the emulator (tests/emu/test_fp16_emu.py): V at +-65504 with P rounded up by fp16 gives +-Inf, where R
    does, on a kernel that rounds each p against the row's running max over all its keys in order: the prefill
    kernel (3 query rows would go to the decode kernel: pinned here) and the baseline. The decode kernel's case is
    test_sm90_decode_gpu.py::test_output_near_65504_stays_within_the_contract."""
    n = 100
    q = torch.zeros(1, 3, 1, 64, dtype=F16, device=DEV)
    k = torch.zeros(1, n + 1, 1, 64, dtype=F16, device=DEV)
    q[0, :, 0, 0] = torch.tensor([1.0, 0.0, -1.0])
    k[0, 1:, 0, 0] = -(1 - 2**-10)
    v = torch.randn(1, n + 1, 1, 64, device=DEV).to(F16)
    v[..., 0], v[..., 1] = 65504.0, -65504.0
    arch = dispatch.arch_of(torch.device(DEV))
    prefill = [k.name for k in manifest.load().op("attention_fwd").kernels
               if arch in k.archs and not k.declines_at_run_time][0]
    with dispatch.pinned(kernel="baseline" if kernel == "baseline" else prefill):
        out = run(q, k, v, "bshd", "rtne", math.log(2.0), False)
    bits = ref.bf16_bits(out.cpu())[0, :, 0]
    assert bits[0, :2].tolist() == [0x7C00, 0xFC00] and bits[1:, 0].tolist() == [0x7BFF, 0x7BFF]
    r = ref.reference_r(q, k, v, "bshd", "rtne", math.log(2.0))
    assert torch.equal(torch.isinf(out), torch.isinf(r))


@pytest.mark.parametrize("sq,sk", [(1000, 1000), (4096, 4096), (128, 4096), (4096, 17)])
def test_side_by_side_with_sdpa(sq, sk, record_property):
    """fp16 ours no worse than 1.25x the better of SDPA flash and cuDNN in fp16 on the same inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = suite.make_qkv("bhsd", 2, 8, sq, sk, 128, DEV, seed=sq + sk, dtype=F16)
    o64, _ = ref.reference_fp64(q, k, v, "bhsd")
    ours = run(q, k, v, "bhsd", "rtne", None, False)
    stats = {"ours": ref.errors(ours, o64)}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                other = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        except RuntimeError as e:
            record_property(f"fp16_{name}_unavailable", str(e)[:200])
            continue
        stats[name] = ref.errors(other, o64)
        record_property(f"fp16_within_1ulp_of_{name}", ref.share_within_ulp(ours, other))
    for key, value in stats.items():
        record_property(f"fp16_{key}_err_normwise", value)
    others = [n for n in stats if n != "ours"]
    if not others:
        pytest.skip("neither SDPA flash nor cuDNN runs here")
    err, nrm = stats["ours"]
    assert err <= 1.25 * min(stats[n][0] for n in others), stats
    assert nrm <= 1.25 * min(stats[n][1] for n in others), stats
