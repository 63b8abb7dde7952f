"""Bad soft caps and ALiBi slopes are refused before anything launches, each error naming the argument, the value and
what is accepted, through every public entry that takes them (issue 25's bad-input list)."""
import math

import pytest
import torch

import rtcattn

BF = torch.bfloat16


def _dense(b=2, s=8, h=4, d=64):
    return [torch.zeros(b, s, h, d, dtype=BF) for _ in range(3)]


def _packed():
    q, k, v = (torch.zeros(12, 4, 64, dtype=BF) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    return q, k, v, cu


@pytest.mark.parametrize("cap, err, match", [
    (-1.0, ValueError, r"softcap=-1.0 is not supported; accepted: 0.0 \(off\) or a finite float > 0"),
    (math.inf, ValueError, r"softcap=inf is not supported"),
    (math.nan, ValueError, r"softcap=nan is not supported"),
    (1e39, ValueError, r"softcap=1e\+39 is not supported"),
    (True, TypeError, r"softcap=True \(bool\) is not supported"),
    ("2", TypeError, r"softcap='2' \(str\) is not supported"),
])
def test_softcap_refused_by_every_entry(cap, err, match):
    q, k, v = _dense()
    pq, pk, pv, cu = _packed()
    cache = torch.zeros(2, 16, 4, 64, dtype=BF)
    for call in (lambda: rtcattn.forward(q, k, v, softcap=cap),
                 lambda: rtcattn.flash_attn_func(q, k, v, softcap=cap),
                 lambda: rtcattn.forward_varlen(pq, pk, pv, cu, cu, 7, 7, softcap=cap),
                 lambda: rtcattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, 7, 7, softcap=cap),
                 lambda: rtcattn.flash_attn_with_kvcache(q[:, :1], cache, cache, softcap=cap)):
        with pytest.raises(err, match=match):
            call()
    with pytest.raises(err, match=match.replace("softcap", "logits_soft_cap")):
        rtcattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, 7, 7, logits_soft_cap=cap)


def test_aiter_and_flash_attn_names_of_the_cap_must_agree():
    pq, pk, pv, cu = _packed()
    with pytest.raises(ValueError, match=r"logits_soft_cap=2.0 and softcap=3.0 differ"):
        rtcattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, 7, 7, logits_soft_cap=2.0, softcap=3.0)


@pytest.mark.parametrize("slopes, match", [
    (torch.ones(4, dtype=torch.float16), r"alibi_slopes \(shape \(4,\), torch.float16, cpu\) is not supported; "
                                         r"accepted: float32 \[Hq\] = \[4\] or \[B, Hq\] = \[2, 4\] on cpu"),
    (torch.ones(5), r"alibi_slopes \(shape \(5,\), torch.float32, cpu\) is not supported"),
    (torch.ones(3, 4), r"alibi_slopes \(shape \(3, 4\), torch.float32, cpu\) is not supported"),
    (torch.ones(2, 4, 1), r"alibi_slopes \(shape \(2, 4, 1\), torch.float32, cpu\) is not supported"),
])
def test_slopes_of_the_wrong_shape_or_dtype_are_refused(slopes, match):
    q, k, v = _dense()
    for call in (lambda: rtcattn.forward(q, k, v, alibi_slopes=slopes),
                 lambda: rtcattn.flash_attn_func(q, k, v, alibi_slopes=slopes)):
        with pytest.raises(ValueError, match=match):
            call()
    pq, pk, pv, cu = _packed()  # 2 sequences, 4 heads: the same accepted shapes
    with pytest.raises(ValueError, match=match):
        rtcattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, 7, 7, alibi_slopes=slopes)
    cache = torch.zeros(2, 16, 4, 64, dtype=BF)
    with pytest.raises(ValueError, match=match):
        rtcattn.flash_attn_with_kvcache(q[:, :1], cache, cache, alibi_slopes=slopes)


def test_slopes_that_are_not_a_tensor_are_refused():
    q, k, v = _dense()
    with pytest.raises(TypeError, match="alibi_slopes must be a torch.Tensor or None; got list"):
        rtcattn.forward(q, k, v, alibi_slopes=[0.5] * 4)


def test_slopes_may_not_overlap_out():
    q, k, v = _dense(b=1, s=2, h=1, d=64)
    out = torch.zeros_like(q)
    slopes = out.view(torch.float32).reshape(-1)[:1]  # one fp32 inside out's memory
    with pytest.raises(ValueError, match="alibi_slopes"):
        rtcattn.forward(q, k, v, out=out, alibi_slopes=slopes)
