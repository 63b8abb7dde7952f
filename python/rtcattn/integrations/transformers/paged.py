"""transformers' continuous batching (`model.generate_batch`, its paged KV cache) on rtcattn: the attention function
registered as "paged|rtcattn", which `generate_batch` switches a model loaded with attn_implementation="rtcattn" to.

transformers hands each layer a batch of sequences packed along one token dimension (q [1, Hq, total_q, D]) with
their offsets and read / write indices into its cache: the cache writes the new keys and values and gathers each
sequence's keys back into packed rows, and the attention is `rtcattn.forward_varlen` over them, causal (bottom-right:
a chunk's rows sit after its cached keys). A batch of decode steps (one new row per sequence) goes to the decode
kernels by rtcattn's dispatch (at most 16 query rows per sequence). transformers 5.17 passes its block table (its
"decode fast path", flash_attn_with_kvcache over the paged cache) only to FlashAttention 2 / 3 on CUDA; a block table
given here is refused by name rather than ignored. A sliding layer's window is (W - 1, 0), transformers' convention."""
from __future__ import annotations

import torch

from ... import api


def paged_attention_forward(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            attention_mask, cache, cu_seq_lens_q: torch.Tensor, cu_seq_lens_k, max_seqlen_q: int,
                            max_seqlen_k, block_table: torch.Tensor | None, **kwargs):
    """transformers' paged attention signature: q [1, Hq, total_q, D], k / v [1, Hk, total_q, Dv] (the new rows);
    returns (attn_output [total_q, Hq, Dv], None)."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv != d:  # a smaller value head dim (MLA): padded, sliced back
        v = torch.nn.functional.pad(v, [0, d - dv])
    window = getattr(module, "sliding_window", None)
    window_size = (window - 1, 0) if window else (-1, -1)
    if isinstance(cu_seq_lens_k, dict):  # one set of key offsets per layer type
        kind = "sliding_attention" if window else "full_attention"
        cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[kind], max_seqlen_k[kind]
    common = dict(softmax_scale=module.scaling, causal=True, window_size=window_size,
                  softcap=float(getattr(module, "attn_logit_softcapping", None) or 0.0))
    if block_table is not None:
        raise NotImplementedError("paged|rtcattn: transformers passed a block table (its decode fast path); rtcattn "
                                  "serves continuous batching through the cache's read / write indices only")
    keys, values = cache.update(key_states=k, value_states=v, layer_idx=module.layer_idx,
                                read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    out = api.forward_varlen(q.transpose(1, 2).squeeze(0), keys, values, cu_seq_lens_q.to(torch.int32),
                             cu_seq_lens_k.to(torch.int32), int(max_seqlen_q), int(max_seqlen_k), **common)
    return out[..., :dv], None

