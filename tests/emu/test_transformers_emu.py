"""Hugging Face transformers on rtcattn (rtcattn.integrations.transformers), on the emulated gfx942: tiny
random-initialised models of the families the integration serves (Llama at D 128 and D 64, Mistral with a sliding
window, Qwen2, Gemma 2 with its soft cap, alternating sliding layers and D 256), two layers each, run in bf16 on
rtcattn against the same weights in fp32 (eager: the exact math) and against the bf16 model on transformers' SDPA
(Gemma 2: eager bf16, since SDPA drops its soft cap): on a left-padded and a right-padded batch and through
`generate` (8 greedy tokens, left-padded prompts, the cache: prefill, then decode steps), rtcattn's logits agree
with fp32's at least as well as the peer's, and no call went to SDPA."""
import pytest
import torch

import transformers_suite as ts
from rtcattn.integrations import transformers as rt
from rtcattn.ops import attention_fwd
from rtcattn.runtime import dispatch
from transformers_suite import CONFIGS, VOCAB, agreement, fallbacks_since, models, padded_batch

pytestmark = pytest.mark.emu


@pytest.fixture(autouse=True)
def emulate(monkeypatch):
    monkeypatch.setenv("RTCATTN_EMULATE", "gfx942")


@pytest.fixture(scope="module", autouse=True)
def registered():
    rt.register()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_padded_batches_and_generate(name):
    ref, peer, ours = models(name)
    before = rt.fallback_counts()
    with torch.no_grad():
        for side in ("left", "right"):
            ts.check_padded(name, ref, peer, ours, *padded_batch(side), side)
        ids, mask = padded_batch("left", seed=2)
        ts.check_generate(name, ref, peer, ours, ids, mask)
    assert fallbacks_since(before) == {}, f"{name}: calls went to SDPA: {fallbacks_since(before)}"


def test_fp16_model():
    """An fp16 model (Llama D 64; Gemma 2 D 256 with its soft cap): the same rule against fp32, the peer in fp16."""
    for name in ("llama_d64", "gemma2"):
        ref, peer, ours = models(name, dtype=torch.float16)
        before = rt.fallback_counts()
        with torch.no_grad():
            ts.check_padded(name + " fp16", ref, peer, ours, *padded_batch("left"), "left")
            ts.check_generate(name + " fp16", ref, peer, ours, *padded_batch("left", seed=2))
        assert fallbacks_since(before) == {}


def test_unpadded_batch_runs_dense_with_no_copy():
    """Without padding transformers passes no mask: the dense call on the model's [B, H, S, D] tensors, prefill
    and decode steps alike (the decode kernel for the steps, by rtcattn's dispatch)."""
    ref, peer, ours = models("llama_d64")
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    seen = []
    real = rt._dense
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(rt, "_dense", lambda *a: seen.append(a[0].shape) or real(*a))
        out = ours.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True,
                            pad_token_id=0)
    assert seen[0][2] == 16 and all(s[2] == 1 for s in seen[2:]), seen
    q, k = torch.zeros(2, 4, 1, 64, dtype=torch.bfloat16), torch.zeros(2, 1, 19, 64, dtype=torch.bfloat16)
    assert attention_fwd.selection(q, k, k, layout="bhsd", window=(-1, 0)).kernel.name == "gfx942_decode"
    want = ref(out.sequences).logits[:, 15:-1]
    top1, worst, *_ = agreement(torch.stack(out.logits, 1), want, torch.ones(2, 4, dtype=torch.bool))
    assert top1 == 1.0 and worst < 0.5, (top1, worst)


def test_training_step_gradients_and_dropout():
    """A training step through rtcattn's backward: the loss and the gradients of the attention's projections agree
    with fp32 at least as well as SDPA's bf16 model's (relative error of each gradient); with attention dropout
    the step runs on rtcattn's dropout (no fallback), repeats bit for bit under the same seed, and differs from
    the step without dropout."""
    ref, peer, ours = models("llama_d64")
    ids, mask = padded_batch("right", seed=4)
    before = rt.fallback_counts()
    loss_ours = ts.check_training_step(ref, peer, ours, ids, mask)

    for m in ours.model.layers:
        m.self_attn.attention_dropout = 0.25
    torch.manual_seed(7)
    first, g1 = ts.training_grads(ours, ids, mask)
    torch.manual_seed(7)
    again, g2 = ts.training_grads(ours, ids, mask)
    assert first == again and all(torch.equal(a, b) for a, b in zip(g1, g2))
    assert first != loss_ours
    assert fallbacks_since(before) == {}


def test_fallbacks_are_counted_and_logged_once(caplog):
    """A padding mask with holes and a 4-D mask go to SDPA (the result is SDPA's: the peer's up to bf16 noise): one
    log line per reason, every call counted; RTCATTN_LOG is not needed for the count."""
    ref, peer, ours = models("llama_d64")
    ids, mask = padded_batch("left", seed=5)
    holes = mask.clone()
    holes[0, -3] = 0  # a kept run broken in two
    s = ids.shape[1]
    four_d = torch.ones(s, s, dtype=torch.bool).tril()[None, None].expand(ids.shape[0], 1, s, s)
    before = rt.fallback_counts()
    with torch.no_grad(), caplog.at_level("WARNING", logger="rtcattn.transformers"):
        got = ours(ids, attention_mask=holes).logits
        ours(ids, attention_mask=holes)
        got_4d = ours(ids, attention_mask=four_d).logits
    counted = fallbacks_since(before)
    assert sorted(counted.values()) == [2, 4], counted
    assert any("one run per row" in k for k in counted) and any("4-D" in k for k in counted), counted
    assert sum("goes to SDPA" in r.message for r in caplog.records) == 2
    with torch.no_grad():
        want, want_4d = peer(ids, attention_mask=holes).logits, peer(ids, attention_mask=four_d).logits
    assert agreement(got, want, holes.bool())[1] < 0.5
    assert agreement(got_4d, want_4d, torch.ones(ids.shape, dtype=torch.bool))[1] < 0.5


def test_fp32_model_falls_back_and_cpu_needs_the_emulator(monkeypatch):
    ref, _, _ = models("llama_d64")
    m = ts.transformers.AutoModelForCausalLM.from_config(ts.config_of("llama_d64"), attn_implementation="rtcattn",
                                                         dtype=torch.float32)
    m.load_state_dict(ref.state_dict())
    m.eval()
    ids = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(6))
    before = rt.fallback_counts()
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert any("float32" in k for k in fallbacks_since(before))
    monkeypatch.delenv("RTCATTN_EMULATE")
    dispatch.check_knobs()
    assert rt._unsupported(None, *(torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16),) * 3, None, {}).startswith("CPU")


class _Module(torch.nn.Module):
    """What transformers' attention functions read off the layer."""
    def __init__(self, causal: bool):
        super().__init__()
        self.is_causal = causal


@pytest.mark.parametrize("causal,window,sq,rows", [
    (True, None, 13, "left"),        # a left-padded prefill
    (True, 5, 13, "right"),          # right padding, sliding window
    (True, None, 1, "left"),         # a decode step over a left-padded cache
    (True, 4, 3, "left"),            # a chunk of 3 new rows after a cache, windowed
    (False, None, 13, "right"),      # an encoder's padded batch
    (False, 3, 13, "left"),          # an encoder with a (symmetric) window
], ids=["prefill", "right-window", "decode", "chunk-window", "encoder", "encoder-window"])
def test_attention_function_against_fp64(causal, window, sq, rows):
    """attention_forward itself, against softmax over the masked scores in fp64: GQA 4/2, D 64, rows of 13 keys with
    0 to 13 kept (an empty row included); padding rows of the output are zero, as FlashAttention's unpadding gives."""
    g = torch.Generator().manual_seed(sq + (window or 0))
    b, hq, hk, sk, d = 4, 4, 2, 13, 64
    q = torch.randn(b, hq, sq, d, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(b, hk, sk, d, generator=g).to(torch.bfloat16) for _ in range(2))
    kept = (13, 9, 0, 4)
    mask = torch.zeros(b, sk, dtype=torch.bool)
    for i, n in enumerate(kept):
        if rows == "left":
            mask[i, sk - n:] = True
        else:
            mask[i, :n] = True
    before = rt.fallback_counts()
    out, weights = rt.attention_forward(_Module(causal), q, k, v, mask, scaling=0.2, sliding_window=window)
    assert weights is None and fallbacks_since(before) == {}
    assert out.shape == (b, sq, hq, d)
    allowed = rt._mask_4d(mask, sq, causal, rt._window(window, causal))     # [B, 1, Sq, Sk]
    kk, vv = (t.double().repeat_interleave(hq // hk, 1) for t in (k, v))
    s = (q.double() @ kk.transpose(2, 3)) * 0.2
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)                               # a row with no key: zeros
    want = (p @ vv).transpose(1, 2)
    q_rows = mask[:, sk - sq:] if rows == "left" or sq == sk else mask[:, :sq]
    want = want * q_rows[:, :, None, None]                                 # padding query rows: zero
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    assert torch.equal(out[~q_rows], torch.zeros_like(out[~q_rows]))


def test_packed_rows_equal_the_sequences_run_alone():
    """One row holding three sequences back to back (DataCollatorWithFlattening's layout): by restarting position
    ids, and by transformers' cu_seq_lens_* keywords; each sequence's logits equal the sequence run alone (same
    kernels, same per-sequence problems: bit for bit up to the model's own bf16 work, which is per token)."""
    _, _, ours = models("llama_d64")
    lengths = (7, 12, 5)
    g = torch.Generator().manual_seed(8)
    seqs = [torch.randint(1, VOCAB, (1, n), generator=g) for n in lengths]
    ids = torch.cat(seqs, 1)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 7, 19, 24], dtype=torch.int32)
    before = rt.fallback_counts()
    with torch.no_grad():
        alone = torch.cat([ours(s).logits for s in seqs], 1)
        by_pos = ours(ids, position_ids=pos).logits
        by_cu = ours(ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12, max_length_k=12).logits
        whole = ours(ids).logits                                # one causal sequence: differs after the first
    assert torch.equal(by_pos, alone) and torch.equal(by_cu, alone)
    assert not torch.equal(whole[:, 7:], alone[:, 7:])
    assert fallbacks_since(before) == {}


def test_continuous_batching_paged_cache():
    """generate_batch (transformers' continuous batching over its paged cache) on "paged|rtcattn": prompts of 5, 9
    and 20 tokens, 6 greedy tokens each, no call going to SDPA; every token it picks is the fp32 model's pick on the
    same sequence, or within twice the bf16 SDPA model's largest logit error of it there (a near tie, which bf16
    noise decides)."""
    ref, peer, ours = models("llama_d64")
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15], [5] * 20]
    gen = ts.transformers.GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ts.transformers.ContinuousBatchingConfig(block_size=16, num_blocks=16, max_batch_tokens=64,
                                                  use_cuda_graph=False)
    before = rt.fallback_counts()
    out = ours.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb, warmup=False)
    assert fallbacks_since(before) == {}
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            tokens = out[f"req_{i}"].generated_tokens
            assert len(tokens) == 6
            seq = torch.tensor([prompt + tokens])
            want = ref(seq).logits[0, len(prompt) - 1:-1].float()
            noise = (peer(seq).logits[0, len(prompt) - 1:-1].float() - want).abs().max()
            picked = want.gather(1, torch.tensor(tokens)[:, None])[:, 0]
            assert bool((picked >= want.max(1).values - 2 * noise).all()), (i, tokens, want.argmax(1).tolist())


def test_left_padding_reads_the_cache_in_place(monkeypatch):
    """Left-padded causal inference (generate's prompts and decode steps) runs the kvcache form on the model's own
    key / value tensors; right padding, and left padding with a gradient, the packed form."""
    ref, peer, ours = models("llama_d64")
    used = []
    for name in ("_left_padded", "_packed"):
        real = getattr(rt, name)
        monkeypatch.setattr(rt, name, lambda *a, _n=name, _r=real: used.append(_n) or _r(*a))
    ids, mask = padded_batch("left", seed=7)
    with torch.no_grad():
        ours.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert used and set(used) == {"_left_padded"}, used
    used.clear()
    with torch.no_grad():
        ours(*padded_batch("right", seed=7))
    assert set(used) == {"_packed"}, used
    used.clear()
    ours.train()
    ours(ids, attention_mask=mask).logits.sum().backward()
    assert set(used) == {"_packed"}, used


@pytest.mark.parametrize("sq", [13, 1])
def test_left_padded_in_place_rows_equal_the_kvcache_form(sq):
    """The left-padded path's packed call over key / value read in place (its offsets made once per mask, reused by the
    next layer's call) gives the bits of flash_attn_with_kvcache's cache_leftpad form on the same tensors; key / value
    laid out [B, Sk, Hk, D] are read in place too; a pair whose batches lie a different number of rows apart is
    declined (None: attention_forward packs them, and still matches the fp64 rule)."""
    g = torch.Generator().manual_seed(3 + sq)
    b, hq, hk, sk, d = 4, 4, 2, 13, 64
    q = torch.randn(b, hq, sq, d, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(b, hk, sk, d, generator=g).to(torch.bfloat16) for _ in range(2))
    mask = torch.zeros(b, sk, dtype=torch.bool)
    for i, n in enumerate((13, 9, 0, 4)):
        mask[i, sk - n:] = True
    plan = rt._padding_plan(mask, sq)
    assert isinstance(plan, rt._LeftPadded)
    common = dict(softmax_scale=0.2, causal=True, window_size=(-1, -1), softcap=0.0, dropout_p=0.0)
    want = rt.api.flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          cache_leftpad=plan.start, softmax_scale=0.2, causal=True, how_v3_bf16_cvt=0)
    assert torch.equal(rt._left_padded(q, k, v, plan, common), want)
    assert torch.equal(rt._left_padded(q, k, v, plan, common), want)  # the second layer: the kept offsets
    assert len(plan.calls) == 1
    bshd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v)]  # [B, Sk, Hk, D] storage
    assert torch.equal(rt._left_padded(q, *bshd, plan, common), want)
    assert len(plan.calls) == 2
    assert rt._left_padded(q, k, bshd[1], plan, common) is None
    out, _ = rt.attention_forward(_Module(True), q, k, bshd[1], mask, scaling=0.2)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)


def test_a_mask_s_plans_are_made_once_for_the_layers_that_share_it(monkeypatch):
    """A left-padded mask with a gradient asks two plans of the same mask each layer (its kind, then the packed
    offsets): both are kept, so a second layer's call makes neither again (each making reads the mask back: a host
    sync a layer otherwise); a new mask makes them anew."""
    g = torch.Generator().manual_seed(5)
    b, hq, hk, s, d = 2, 4, 2, 12, 64
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(torch.bfloat16).requires_grad_() for h in (hq, hk, hk))
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[1, :5] = False
    made = []
    five, init = rt._five_sequences, rt._LeftPadded.__init__
    monkeypatch.setattr(rt, "_five_sequences", lambda *a: made.append("_five_sequences") or five(*a))
    monkeypatch.setattr(rt._LeftPadded, "__init__", lambda self, *a: made.append("_LeftPadded") or init(self, *a))
    for _ in range(3):  # three layers
        out, _ = rt.attention_forward(_Module(True), q, k, v, mask)
        out.float().sum().backward()
    assert sorted(made) == ["_LeftPadded", "_five_sequences"], made
    rt.attention_forward(_Module(True), q, k, v, mask.clone())
    assert len(made) == 4, made
