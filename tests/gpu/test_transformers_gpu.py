"""Hugging Face transformers on rtcattn on a GPU (rtcattn.integrations.transformers): the emulator test's model
families at 8 layers with 4 prompts of up to 1024 tokens, left- and right-padded, and `generate` of 8 tokens from
left-padded prompts (prefill, then decode steps through the decode kernel): the bf16 model on rtcattn against the
same weights in fp32 (eager) at least as well as the bf16 model on SDPA (Gemma 2: eager bf16) by the rule of
tests/transformers_suite.py, with no call going to SDPA; an unpadded training step's gradients likewise."""
import pytest
import torch

import transformers_suite as ts
from rtcattn.integrations import transformers as rt

pytestmark = pytest.mark.gpu

DEV = "cuda"
# transformers' default initializer: at 8 layers the emulator tests' 0.2 makes the residual stream chaotic (bf16 and
# fp32 models part ways: logit errors of ~29, losses of ~24 where uniform is 8.3)
BIG = dict(num_hidden_layers=8, vocab_size=4096, max_position_embeddings=2048, initializer_range=0.02)
WIDTH = {"llama_d128": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2),
         "llama_d64": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4),
         "mistral_window": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, sliding_window=256),
         "qwen2": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=2),
         "gemma2": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, sliding_window=256,
                        layer_types=["sliding_attention", "full_attention"] * 4)}
LENGTHS = (1024, 900, 700, 333)


@pytest.fixture(scope="module", autouse=True)
def registered():
    rt.register()


def big(name):
    return ts.models(name, DEV, **BIG, **WIDTH[name])


@pytest.mark.parametrize("name", list(ts.CONFIGS))
def test_padded_batches_and_generate(name):
    ref, peer, ours = big(name)
    before = rt.fallback_counts()
    with torch.no_grad():
        for side in ("left", "right"):
            ts.check_padded(name, ref, peer, ours, *ts.padded_batch(side, lengths=LENGTHS, vocab=BIG["vocab_size"],
                                                                    device=DEV), side)
        ids, mask = ts.padded_batch("left", seed=2, lengths=LENGTHS, vocab=BIG["vocab_size"], device=DEV)
        ts.check_generate(name, ref, peer, ours, ids, mask)
    assert ts.fallbacks_since(before) == {}, f"{name}: calls went to SDPA: {ts.fallbacks_since(before)}"


def test_training_step_gradients():
    ref, peer, ours = big("llama_d128")
    ids = torch.randint(1, BIG["vocab_size"], (4, 1024), device=DEV, generator=torch.Generator(DEV).manual_seed(4))

    before = rt.fallback_counts()
    ts.check_training_step(ref, peer, ours, ids)
    assert ts.fallbacks_since(before) == {}
