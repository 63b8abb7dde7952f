"""Hugging Face transformers on rtcattn's kernels: `register()` makes `attn_implementation="rtcattn"` available to
`from_pretrained` / `from_config` (and `model.set_attn_implementation`).

What a layer's attention call becomes (the decision is made per call, from the shapes and the mask alone):
- No padding mask (transformers passes None when every token is kept, as it does for FlashAttention):
  `rtcattn.forward` on the [B, H, S, D] tensors the model holds, layout "bhsd", with no copy in. Calls with few query
  rows (decode steps) go to the decode kernels by rtcattn's own dispatch.
- A left-padded causal batch (every row keeps its last keys: `generate`'s prompts and every decode step after them),
  in inference: the packed op over the model's key / value read in place as rows (flash_attn_with_kvcache's
  cache_leftpad form: each row's keys from its first kept one, seqused_k), no copy of K / V; the offsets are made
  once per mask and key layout, so a layer's call is a repeat of the op's (ops/repeat.py). Causal only: there a
  padding query row sees no key (zeros, as below); a bidirectional layer's padding rows would see the kept keys.
- Any other 2-D padding mask [B, Sk] (right padding; left padding when not causal or when a gradient or dropout is
  wanted): the batch
  becomes packed sequences for `rtcattn.forward_varlen`. Each row's kept keys must be one run
  (what tokenizers' padding gives); row b is cut into five sequences, (query padding before, no keys),
  (no queries, key padding before), (the kept queries, the kept keys), (query padding after, no keys),
  (no queries, key padding after), so the padding rows come back as zeros (as FlashAttention's unpadding
  gives) and no row is gathered, scattered or read on the host. The offsets are computed once per mask
  tensor and reused by every layer that gets the same mask; checking that each row is one run costs one
  host read per mask (per forward pass, not per layer). q, k and v are copied into the packed row layout
  (as FlashAttention's unpadding copies them).
- Packed sequences of one row (transformers' `cu_seq_lens_q` / `cu_seq_lens_k` keywords, or position ids that
  restart, as DataCollatorWithFlattening gives): `rtcattn.forward_varlen` over them.
- Continuous batching (`model.generate_batch`, transformers' paged KV cache): "paged|rtcattn", paged.py.
- `sliding_window` (Mistral, Qwen2/3, Gemma 2/3 local layers): window (W - 1, 0) when causal, (W - 1, W - 1) when
  not, transformers' convention; `softcap` (Gemma 2); `dropout` in training; `scaling`; GQA / MQA natively; a
  value head dim below the query's padded to it and sliced back.

What rtcattn cannot express goes to transformers' SDPA function: a 4-D mask or a BlockMask, fp32 (or any dtype
but bf16 / fp16) without autocast, attention sinks (`s_aux`), a position bias, a head dim above 256, a padding
mask whose kept keys are not one run per row, a device rtcattn has no kernel for (CPU without
RTCATTN_EMULATE). Each reason is logged once per process (logger "rtcattn.transformers", level WARNING);
with RTCATTN_LOG=1 every fallback is logged with its running count. `fallback_counts()` returns the counts.
"""
from __future__ import annotations

import logging
import threading
import weakref
from collections import Counter

import torch

from ... import api
from ...ops import checks
from ...runtime import dispatch

NAME = "rtcattn"
MAX_HEAD_DIM = 256
DTYPES = (torch.bfloat16, torch.float16)

_logger = logging.getLogger("rtcattn.transformers")
_lock = threading.Lock()
_fallbacks: Counter = Counter()
_plans: dict = {}        # (id(tensor), extra key) -> (weakref to it, its version, plan): a mask's or position ids' plan
_PLANS_KEPT = 8


def register() -> None:
    """Makes attn_implementation="rtcattn" available to transformers' models (its attention function and its
    mask function, FlashAttention's: a 2-D padding mask or None). Raises ImportError without transformers."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import flash_attention_mask
    except ImportError as e:
        raise ImportError("rtcattn.integrations.transformers needs transformers >= 5.0: "
                          "pip install 'rtcattn[transformers]'") from e
    from .paged import paged_attention_forward
    AttentionInterface.register(NAME, attention_forward)
    AttentionInterface.register(f"paged|{NAME}", paged_attention_forward)  # continuous batching (generate_batch)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


def fallback_counts() -> dict:
    """{reason: number of attention calls that went to SDPA for it} in this process."""
    with _lock:
        return dict(_fallbacks)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, **kwargs):
    """transformers' attention function signature: query [B, Hq, Sq, D], key / value [B, Hk, Sk, D(v)];
    returns (attn_output [B, Sq, Hq, Dv], None)."""
    why = _unsupported(module, query, key, value, attention_mask, kwargs)
    if why:
        return _fallback(why, module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap,
                         is_causal, kwargs)
    query, key, value = _cast_for_autocast(query, key, value)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    common = dict(softmax_scale=scaling, causal=causal, window_size=_window(sliding_window, causal),
                  softcap=float(softcap or 0.0), dropout_p=float(dropout))
    dv = value.shape[-1]
    if dv != query.shape[-1]:  # FlashAttention's way with a smaller value head dim (MLA): pad, slice back
        value = torch.nn.functional.pad(value, [0, query.shape[-1] - dv])
    if attention_mask is not None:
        plan = _padding_plan(attention_mask, query.shape[2])
        if plan is None:
            return _fallback("a padding mask whose kept keys are not one run per row", module, query, key,
                             value[..., :dv], attention_mask, dropout, scaling, sliding_window, softcap, is_causal,
                             kwargs)
        if isinstance(plan, _LeftPadded):
            in_place = not (_needs_grad(query, key, value) or common["dropout_p"] > 0 or not common["causal"])
            out = _left_padded(query, key, value, plan, common) if in_place else None
            if out is not None:
                return out[..., :dv], None
            plan = _padding_offsets(attention_mask, query.shape[2])
        out = _packed(query, key, value, *plan, common)
    else:
        packed = _packed_sequences(query, kwargs)
        out = _packed(query, key, value, *packed, common) if packed else _dense(query, key, value, common)
    return out[..., :dv], None


def _unsupported(module, query, key, value, mask, kwargs) -> str | None:
    """Why this call goes to SDPA, or None."""
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 2):
        return "an attention mask that is not a 2-D padding mask (a 4-D mask or a BlockMask)"
    if kwargs.get("s_aux") is not None:
        return "attention sinks (s_aux)"
    if kwargs.get("position_bias") is not None:
        return "a position bias"
    dtype = query.dtype
    if dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
    if dtype not in DTYPES or not (key.dtype == value.dtype == query.dtype):
        return f"dtype {query.dtype} (rtcattn takes bf16 and fp16, or fp32 under autocast to one of them)"
    if query.shape[-1] > MAX_HEAD_DIM or value.shape[-1] > query.shape[-1]:
        return f"head dims {query.shape[-1]} / {value.shape[-1]} (rtcattn takes D <= {MAX_HEAD_DIM}, Dv <= D)"
    if query.device.type == "cpu" and not dispatch.knob("RTCATTN_EMULATE"):
        return "CPU tensors without RTCATTN_EMULATE (rtcattn runs CPU tensors on its emulator only)"
    return None


def _cast_for_autocast(query, key, value):
    """fp32 under autocast (layer norms kept in fp32 promote the rotary product): the autocast dtype, as
    transformers' FlashAttention path casts."""
    if query.dtype == torch.float32:
        dtype = torch.get_autocast_dtype(query.device.type)
        return query.to(dtype), key.to(dtype), value.to(dtype)
    return query, key, value


def _window(sliding_window, causal: bool) -> tuple:
    """transformers' sliding window W keeps W keys up to the query's (i - j < W); not causal, W - 1 on each side."""
    if sliding_window is None:
        return (-1, -1)
    left = int(sliding_window) - 1
    return (left, 0) if causal else (left, left)


def _dense(query, key, value, common):
    """The unpadded batch: rtcattn.forward on the model's [B, H, S, D] tensors, returned as [B, S, H, D] (a view of the
    op's output; the model's reshape copies it). Without out=, so a layer's repeat takes the op's short path
    (ops/repeat.py), which costs the host far less than the copy costs the device."""
    return api.forward(query, key, value, layout="bhsd", **common).transpose(1, 2)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [B * S, H, D], the packed row layout (a view when the tensor is laid out [B, S, H, D])."""
    b, h, s, d = t.shape
    return t.transpose(1, 2).reshape(b * s, h, d)


def _packed(query, key, value, cu_q, cu_k, max_q: int, max_k: int, common):
    """forward_varlen over the rows of the batch with the given offsets; [B, Sq, Hq, D] out."""
    b, h, s, d = query.shape
    out = api.forward_varlen(_rows(query), _rows(key), _rows(value), cu_q, cu_k, max_q, max_k, **common)
    return out.view(b, s, h, d)


def _cached(t: torch.Tensor, extra, make):
    """make() once per tensor (and version, and extra key) for the layers of a forward pass that share it. One tensor
    may have several plans (a padding mask's kind and its packed offsets, both asked by each layer of a training
    step): each is kept under its own key."""
    if torch.compiler.is_compiling():
        return make()
    key = (id(t), extra)
    with _lock:
        hit = _plans.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    plan = make()
    with _lock:
        if len(_plans) >= _PLANS_KEPT:
            _plans.pop(next(iter(_plans)))
        _plans[key] = (weakref.ref(t), t._version, plan)
    return plan


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _padding_plan(mask: torch.Tensor, sq: int):
    """For a [B, Sk] padding mask: _LeftPadded when every row keeps its last keys, else the packed form's offsets
    (_padding_offsets), or None when some row's kept keys are not one run."""
    def make():
        m = mask.to(torch.int32)
        sk = m.shape[1]
        kept = m.sum(1, dtype=torch.int32)
        runs = m[:, :1].sum(1) + (m[:, 1:] > m[:, :-1]).sum(1)
        start = torch.where(kept > 0, m.argmax(1).to(torch.int32), sk)
        end = start + kept
        holes, right = torch.stack([(runs > 1).any(), (end < sk).any()]).tolist()  # the one host read of this mask
        if holes:
            return None
        if not right:  # left padding only: the kvcache form reads the model's tensors in place (_left_padded)
            return _LeftPadded(start)
        return _five_sequences(start, kept, sq, sk)
    return _cached(mask, (sq, mask.device), make)


def _padding_offsets(mask: torch.Tensor, sq: int):
    """(cu_seqlens_q, cu_seqlens_k, Sq, Sk) of the packed form for a mask whose rows are one run each (checked)."""
    def make():
        m = mask.to(torch.int32)
        kept = m.sum(1, dtype=torch.int32)
        start = torch.where(kept > 0, m.argmax(1).to(torch.int32), m.shape[1])
        return _five_sequences(start, kept, sq, m.shape[1])
    return _cached(mask, ("offsets", sq, mask.device), make)


def _five_sequences(start, kept, sq: int, sk: int):
    """(cu_seqlens_q, cu_seqlens_k, Sq, Sk) cutting each row into five sequences (the module's docstring). Query row
    i sits at key position i + Sk - Sq (bottom-right, as the kernels align)."""
    end = start + kept
    shift = sk - sq
    q0, q1 = (start - shift).clamp(0, sq), (end - shift).clamp(0, sq)
    zero = torch.zeros_like(kept)
    q_len = torch.stack([q0, zero, q1 - q0, sq - q1, zero], 1)
    k_len = torch.stack([zero, start, kept, zero, sk - end], 1)
    return _offsets(q_len), _offsets(k_len), sq, sk


class _LeftPadded:
    """A padding mask whose rows keep their last keys (left padding: generate's prompts and decode steps), and the
    packed call's offsets over the model's key / value in place, per key layout (made once: every layer of a forward
    pass has the same)."""

    def __init__(self, start: torch.Tensor):
        self.start = start  # int32 [B]: each row's first kept key
        self.calls: dict = {}  # (Sq, key's shape and strides) -> (cu_seqlens_q, cu_seqlens_k, seqused_k)

    def offsets(self, query, key) -> tuple:
        """(cu_seqlens_q, cu_seqlens_k, seqused_k) for rows_in_place(query's rows, key): sequence b's queries are
        rows b Sq .., its keys rows b R + start[b] .. (R rows between batches), Sk - start[b] of them."""
        b, _, sq, _ = query.shape
        at = (sq, tuple(key.shape), key.stride())
        hit = self.calls.get(at)
        if hit is None:
            per_batch = key.stride(0) // key.stride(2)
            first = torch.arange(b, dtype=torch.int32, device=key.device) * per_batch + self.start
            hit = (torch.arange(b + 1, dtype=torch.int32, device=key.device) * sq,
                   torch.cat((first, first.new_zeros(1))), (key.shape[2] - self.start).to(torch.int32))
            self.calls[at] = hit
        return hit


def _in_place_rows(t: torch.Tensor) -> torch.Tensor | None:
    """[B, H, S, D] with unit D stride and a batch stride a whole number of rows, as rows [(B - 1) R + S, H, D]
    read in place (batch b's row j is row b R + j); None for another layout."""
    b, h, s, d = t.shape
    if t.stride(3) != 1 or t.stride(2) < d or t.stride(0) % t.stride(2):
        return None
    total = (b - 1) * (t.stride(0) // t.stride(2)) + s
    return t.as_strided((total, h, d), (t.stride(2), t.stride(1), 1))


def _left_padded(query, key, value, plan: _LeftPadded, common):
    """A left-padded causal batch in inference: the packed op with key / value read in place as rows
    (_in_place_rows: no copy of K / V, where the packed form copies them), each row's keys from its first kept one
    (seqused_k, flash_attn_with_kvcache's cache_leftpad form), query rows aligned bottom-right, so query padding rows
    see no key (zeros). The offsets come from the plan (made once per mask); the op's repeat path serves every layer
    after the first. None when key / value cannot be read in place with one set of offsets (the caller packs them)."""
    k_rows, v_rows = _in_place_rows(key), _in_place_rows(value)
    if k_rows is None or v_rows is None or key.stride(0) // key.stride(2) != value.stride(0) // value.stride(2):
        return None
    b, h, sq, d = query.shape
    cu_q, cu_k, used = plan.offsets(query, key)
    left, right = checks.check_window(common["window_size"], common["causal"])
    scale = None if common["softmax_scale"] is None else float(common["softmax_scale"])
    out, _ = torch.ops.rtcattn.fwd_varlen(_rows(query), k_rows, v_rows, cu_q, cu_k, sq, key.shape[2], "rtne", scale,
                                          False, left, right, None, used, softcap=common["softcap"])
    return out.view(b, sq, h, d)


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    flat = lengths.reshape(-1)
    return torch.cat([flat.new_zeros(1), flat.cumsum(0, dtype=torch.int32)]).to(torch.int32)


def _packed_sequences(query, kwargs):
    """(cu_q, cu_k, max_q, max_k) when one row holds several sequences back to back, else None: transformers'
    cu_seq_lens_* keywords, or position ids that restart (read once per position-id tensor)."""
    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs.get("cu_seq_lens_k", kwargs["cu_seq_lens_q"])
        max_q = kwargs.get("max_length_q")
        max_k = kwargs.get("max_length_k", max_q)
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    pos = kwargs.get("position_ids")
    if pos is None or query.shape[0] != 1 or query.shape[2] == 1 or pos.dim() != 2 or pos.shape[0] != 1:
        return None
    if pos.shape[1] != query.shape[2]:
        return None

    def make():
        p = pos[0]
        starts = torch.nonzero(p[1:] != p[:-1] + 1).flatten() + 1
        if starts.numel() == 0:  # the host read of nonzero(): one run, no packing
            return None
        n = p.numel()
        cu = torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), n)]).to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())
        return cu, cu, longest, longest
    return _cached(pos, (query.shape[2], pos.device), make)


def _fallback(reason, module, query, key, value, mask, dropout, scaling, sliding_window, softcap, is_causal, kwargs):
    """transformers' SDPA function for a call rtcattn cannot express; a 2-D padding mask (from rtcattn's mask
    function) becomes the 4-D boolean mask SDPA takes, with the causal and window conditions."""
    with _lock:
        _fallbacks[reason] += 1
        count = _fallbacks[reason]
    if count == 1:
        _logger.warning("rtcattn: attention goes to SDPA for %s (logged once per process; RTCATTN_LOG=1 logs "
                        "every fallback)", reason)
    elif dispatch.knob("RTCATTN_LOG") == "1":
        _logger.warning("rtcattn: attention goes to SDPA for %s (%d calls)", reason, count)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        mask = _mask_4d(mask, query.shape[2], causal, _window(sliding_window, causal))
        causal = False
    elif mask is None and (sliding_window is not None or softcap):
        sk = key.shape[2]
        mask = _mask_4d(torch.ones(query.shape[0], sk, dtype=torch.bool, device=query.device), query.shape[2],
                        causal, _window(sliding_window, causal))
        causal = False
    if softcap:  # SDPA has no soft cap: the same math in torch
        return _capped(query, key, value, mask, scaling, float(softcap), dropout if module.training else 0.0), None
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                  is_causal=causal, **{k: v for k, v in kwargs.items() if k != "is_causal"})


def _capped(query, key, value, mask, scaling, softcap: float, dropout: float) -> torch.Tensor:
    """softmax(softcap * tanh(scale * q k^T / softcap) + mask) v in torch (a bool [B, 1, Sq, Sk] mask or a float
    one to add), as transformers' eager functions compute it; [B, Sq, Hq, Dv]."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = torch.matmul(query, key.transpose(2, 3)) * scale
    s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    p = torch.nn.functional.dropout(p, p=dropout, training=dropout > 0)
    return torch.matmul(p, value).transpose(1, 2).contiguous()


def _mask_4d(mask: torch.Tensor, sq: int, causal: bool, window: tuple) -> torch.Tensor:
    """[B, 1, Sq, Sk] bool: key j kept for query i by the padding mask, causality and the window, bottom-right."""
    sk = mask.shape[1]
    i = torch.arange(sq, device=mask.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=mask.device)[None, :]
    keep = mask[:, None, None, :].expand(-1, 1, sq, -1)
    left, right = window
    cond = torch.ones(sq, sk, dtype=torch.bool, device=mask.device)
    if causal:
        cond &= j <= i
    if left >= 0:
        cond &= j >= i - left
    if right >= 0 and not causal:
        cond &= j <= i + right
    return keep & cond
