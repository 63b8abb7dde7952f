"""Packed calls with unusual but valid inputs, and bad ones, on the GPU (sm90 for D = 128 on Hopper, the
baseline elsewhere): a block table expanded from one row, rows that no sequence owns, a batch without
sequences, and out= over the metadata."""
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

import rtcattn  # noqa: E402
import varlen_suite as vs  # noqa: E402

pytestmark = pytest.mark.gpu

I32 = torch.int32


@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("page", [16, 64])
def test_expanded_block_table_equals_the_materialised_one(d, page):
    b = vs.shared_pages([300, 1, 0, 129], [1000, 17, 40, 700], 8, 2, d, page, "cuda", seed=page + d)
    for window, mode in (((-1, -1), "rtne"), ((-1, 0), "rtna"), ((100, 0), "rtz")):
        vs.check_expanded_table_equals_materialised(b, mode, window)
    vs.check_accuracy(b, "rtne", (-1, 0), what="expanded table")


def test_unowned_rows_are_zero_and_an_empty_batch_launches_nothing():
    b = vs.make_batch([100, 0, 33], [200, 5, 33], 8, 2, 128, "cuda", seed=1)
    padded = torch.cat([b.q, torch.randn(64, 8, 128, device="cuda").to(torch.bfloat16)])
    torch.full((padded.numel() // 2,), float("nan"), device="cuda")  # stale bytes for the next allocation
    out, lse = rtcattn.forward_varlen(padded, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, causal=True,
                                      return_lse=True)
    want, want_lse = vs.run(b, "rtne", (-1, 0))
    rows = b.q.shape[0]
    assert torch.equal(out[:rows].view(torch.int16), want.view(torch.int16)) and torch.equal(lse[:, :rows], want_lse)
    assert not out[rows:].any() and bool((lse[:, rows:] == -torch.inf).all())
    one = torch.zeros(1, dtype=I32, device="cuda")
    out, lse = rtcattn.forward_varlen(padded, b.k, b.v, one, one, 1, 1, return_lse=True)
    assert not out.any() and bool((lse == -torch.inf).all())


def test_out_over_the_metadata_is_refused():
    b = vs.to_paged(vs.make_batch([40, 9], [70, 20], 8, 2, 128, "cuda", seed=2), 16, seed=2)
    buf = torch.zeros(b.q.numel() * 2, dtype=torch.uint8, device="cuda")
    out = buf.view(torch.bfloat16).view(b.q.shape)
    for name in ("cu_q", "cu_k", "block_table"):
        meta = getattr(b, name)
        inside = buf[256:256 + meta.numel() * 4].view(I32).view(meta.shape)
        inside.copy_(meta)
        bad = replace(b, **{name: inside})
        with pytest.raises(ValueError, match="out overlaps .* in memory"):
            vs.run(bad, out=out)
        assert torch.equal(inside, meta)
