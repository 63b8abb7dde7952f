"""Causal and sliding-window masks and GQA/MQA on the GPU through rtcattn.forward, against the fp64 reference
with the mask: the sm90 kernel for D = 128 on Hopper (which kernel ran is asserted), the baseline elsewhere.

The design is the emulator's (tests/emu/test_masks_emu.py) with sizes that span several 128-row tiles
and K/V blocks, so tiles that see no key, blocks cut by the window and blocks fully inside all occur.
"""
import itertools

import pytest

torch = pytest.importorskip("torch")

import numerics_suite as suite  # noqa: E402

pytestmark = pytest.mark.gpu

WINDOWS = [(-1, 0), (0, 0), (1, 1), (17, 17), (256, 256), (17, 3), (-1, 5), (300, -1)]
HEADS = [(4, 4), (8, 2), (8, 1), (3, 1)]
SIZES = [(300, 1000), (1000, 1000), (1000, 300), (17, 129), (129, 17)]
CASES = [(w, s, HEADS[i % 4], suite.LAYOUTS[i % 2], suite.MODES[(i // 2) % 3])
         for i, (w, s) in enumerate(itertools.product(WINDOWS, SIZES))]


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def run_checked(expect):
    def run(q, k, v, layout, mode, scale, lse, window=(-1, -1)):
        import rtcattn
        from rtcattn.ops import attention_fwd
        sel = attention_fwd.selection(q, k, v, layout=layout, round_mode=mode, window=window)
        assert sel.kernel.name == expect, (sel.kernel.name, sel.why)
        out = torch.empty_like(q)
        out.view(torch.int16).fill_(-1)   # poisoned: a NaN nobody writes on purpose
        res = rtcattn.forward(q, k, v, layout=layout, round_mode=mode, softmax_scale=scale, return_lse=True,
                              window_size=window, out=out)
        return res if lse else res[0]
    return run


@pytest.mark.parametrize("window,sizes,heads,layout,mode", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
@pytest.mark.parametrize("d", [128, 64, 200])
def test_window_gqa_against_fp64(window, sizes, heads, layout, mode, d):
    (sq, sk), (hq, hk) = sizes, heads
    q, k, v = suite.make_qkv(layout, 2, hq, sq, sk, d, "cuda", seed=sq + hk + d, hk=hk)
    expect = "sm90" if _hopper() else "baseline"
    suite.check_accuracy(run_checked(expect), q, k, v, layout, mode, what=f"mask d={d}", window=window)


@pytest.mark.parametrize("layout", suite.LAYOUTS)
@pytest.mark.parametrize("window", [(-1, 0), (3, 2), (200, 0)])
def test_special_values_under_a_window(layout, window):
    expect = "sm90" if _hopper() else "baseline"
    for mode in suite.MODES:
        suite.check_window_special_values(run_checked(expect), "cuda", layout, mode, window, sq=300, sk=260, d=128,
                                          hk=1)


@pytest.mark.parametrize("window", [(-1, 0), (100, 50)])
def test_masked_gqa_is_deterministic(window):
    q, k, v = suite.make_qkv("bshd", 2, 8, 777, 2000, 128, "cuda", seed=4, hk=2)
    run = run_checked("sm90" if _hopper() else "baseline")
    outs = [run(q, k, v, "bshd", "rtz", None, True, window) for _ in range(3)]
    for o, lse in outs[1:]:
        assert torch.equal(o.view(torch.int16), outs[0][0].view(torch.int16))
        assert torch.equal(lse.view(torch.int32), outs[0][1].view(torch.int32))


def test_causal_long_sequence_matches_sdpa_flash():
    """A long causal GQA call next to torch's own causal attention (SDPA on expanded K/V, Sq = Sk)."""
    if not _hopper():
        pytest.skip("the sm90 kernel needs a Hopper GPU")
    import rtcattn
    q, k, v = suite.make_qkv("bhsd", 1, 16, 4096, 4096, 128, "cuda", seed=9, hk=4)
    out = rtcattn.forward(q, k, v, layout="bhsd", causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                                           is_causal=True)
    err = (out.float() - ref.float()).abs().max().item()
    assert err < 2e-2, err


@pytest.mark.parametrize("b,hq,hk,s,d", [(1, 5, 5, 8192, 256), (2, 6, 3, 8192, 256)])
def test_causal_tile_order_sections(b, hq, hk, s, d):
    """The masked tile order goes section by section (sm90/scheduler.h; here sections of 4 pairs after a remainder
    of 1, and of 8 after 4 with GQA): every tile runs once, wherever it falls, so the call equals each (batch, head)
    run alone (one section) bit for bit, O and LSE."""
    import rtcattn
    g = torch.Generator(device="cuda").manual_seed(s + hq)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g).to(torch.bfloat16) for h in (hq, hk, hk))
    o, lse = rtcattn.forward(q, k, v, layout="bshd", window_size=(-1, 0), return_lse=True)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hk)
            one = (x[bi:bi + 1, :, j:j + 1].contiguous() for x, j in ((q, h), (k, kh), (v, kh)))
            o1, lse1 = rtcattn.forward(*one, layout="bshd", window_size=(-1, 0), return_lse=True)
            assert torch.equal(o[bi:bi + 1, :, h:h + 1], o1), (bi, h)
            assert torch.equal(lse[bi:bi + 1, h:h + 1], lse1), (bi, h)
