"""Kernel selection through rtcattn.forward on the emulator: the fast kernel for every head dim, RTCATTN_KERNEL."""
import pytest
import torch

import numerics_suite as suite
import rtcattn
from rtcattn.ops import attention_fwd

pytestmark = pytest.mark.emu


def run(q, k, v, layout, mode, scale, lse):
    return rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=lse)


def _qkv(sq, sk, d, layout="bshd"):
    shape = (lambda s: (1, s, 2, d)) if layout == "bshd" else (lambda s: (1, 2, s, d))
    g = torch.Generator().manual_seed(7)
    return [torch.randn(shape(s), generator=g).to(torch.bfloat16) for s in (sq, sk, sk)]


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a"])
def test_fast_kernel_is_chosen_for_d128_and_meets_the_contract(monkeypatch, arch):
    monkeypatch.setenv("RTCATTN_EMULATE", arch)
    monkeypatch.delenv("RTCATTN_KERNEL", raising=False)
    q, k, v = _qkv(100, 385, 128)
    suite.check_accuracy(run, q, k, v, "bshd", "rtne", what="dispatch")
    assert attention_fwd.selection(q, k, v).kernel.name == "gfx942"


@pytest.mark.parametrize("d,kernel", [(128, "gfx942"), (40, "gfx942"), (64, "baseline")])
def test_both_layouts_run_one_variant_bit_for_bit(monkeypatch, d, kernel):
    """The layout is no compile-time axis (the strides carry it): a bhsd call with the transposed tensors of a
    bshd call selects the same variant and gives the same output and LSE, bit for bit (the baseline pinned)."""
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.delenv("RTCATTN_KERNEL", raising=False)
    if kernel == "baseline":
        monkeypatch.setenv("RTCATTN_KERNEL", "baseline")
    q, k, v = _qkv(40, 70, d)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    sel, sel_t = attention_fwd.selection(q, k, v), attention_fwd.selection(qt, kt, vt, layout="bhsd")
    assert sel.kernel.name == kernel and sel.variant == sel_t.variant, (sel, sel_t)
    o, lse = run(q, k, v, "bshd", "rtz", None, True)
    o_t, lse_t = run(qt, kt, vt, "bhsd", "rtz", None, True)
    assert torch.equal(o.transpose(1, 2), o_t) and torch.equal(lse, lse_t)


def test_other_head_dims_take_the_fast_kernel_at_their_bucket(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.delenv("RTCATTN_KERNEL", raising=False)
    q, k, v = _qkv(17, 17, 64)
    run(q, k, v, "bshd", "rtne", None, False)
    sel = attention_fwd.selection(q, k, v)
    assert sel.kernel.name == "gfx942" and sel.variant.name == "gfx942-rtne-none-dense-d64-bf16-same-plain-nodrop", sel
    # Only the NVIDIA kernels and gfx950's native FP4 entry (other archs) and the decode kernel (17 query rows) were
    # passed over.
    assert sel.why == ("fallback; sm90_decode: arch gfx942-emu not in ['sm_90a']; sm90: arch gfx942-emu not in "
                       "['sm_90a']; gfx950_decode: arch gfx942-emu not in ['gfx950', 'gfx950-emu']; "
                       "gfx942_decode: seq_q=17 is not accepted "
                       "by the gfx942_decode kernel; accepted: at most 16 query rows per sequence (decode; longer "
                       "calls go to the prefill kernel)"), sel.why


def test_rtcattn_kernel_forces_one_kernel_without_fallback(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")
    monkeypatch.setenv("RTCATTN_KERNEL", "baseline")
    q, k, v = _qkv(17, 17, 128)
    run(q, k, v, "bshd", "rtne", None, False)
    assert attention_fwd.selection(q, k, v).kernel.name == "baseline"
    monkeypatch.setenv("RTCATTN_KERNEL", "sm90")  # an NVIDIA kernel cannot serve an emulated gfx942 call
    with pytest.raises(ValueError, match="RTCATTN_KERNEL='sm90'"):
        run(q, k, v, "bshd", "rtne", None, False)
    monkeypatch.setenv("RTCATTN_KERNEL", "fastest")
    with pytest.raises(ValueError, match="RTCATTN_KERNEL"):
        run(q, k, v, "bshd", "rtne", None, False)
