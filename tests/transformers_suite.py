"""What the transformers tests share (tests/emu/test_transformers_emu.py on the emulator, tests/gpu/
test_transformers_gpu.py on a GPU): the model configs of the families rtcattn.integrations.transformers serves,
the padded batches, and the accuracy rule: logits of the bf16 model on rtcattn against the same weights in fp32
(eager, the exact math), judged against the bf16 model on transformers' SDPA (Gemma 2: eager bf16, SDPA drops the
attention soft cap)."""
import copy

import torch
import transformers

from rtcattn.integrations import transformers as rt

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, intermediate_size=192, max_position_embeddings=256,
              initializer_range=0.2)  # larger weights than the default: peaked logits, a top-1 that means something
CONFIGS = {
    "llama_d128": ("LlamaConfig", dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128)),
    "llama_d64": ("LlamaConfig", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=64)),
    "mistral_window": ("MistralConfig", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=64, sliding_window=6)),
    "qwen2": ("Qwen2Config", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2)),
    "gemma2": ("Gemma2Config", dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                                    attn_logit_softcapping=4.0, final_logit_softcapping=30.0, sliding_window=6,
                                    query_pre_attn_scalar=256,
                                    layer_types=["sliding_attention", "full_attention"])),
}
PEER = {"gemma2": "eager"}  # transformers' SDPA function ignores the attention soft cap
LENGTHS = (19, 12, 7)       # prompt lengths of the padded batch (the longest sets the padded length)
NEW_TOKENS = 8


def config_of(name, **overrides):
    cls_name, extra = CONFIGS[name]
    return getattr(transformers, cls_name)(**{**COMMON, **extra, **overrides})


def models(name, device="cpu", dtype=torch.bfloat16, **overrides):
    """(fp32 eager reference, peer, rtcattn) with the same weights, the last two in dtype (bf16 or fp16), on device;
    overrides: config fields (a bigger model on a GPU)."""
    config = config_of(name, **overrides)
    cls = transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    ref = cls.from_config(copy.deepcopy(config), attn_implementation="eager", dtype=torch.float32).to(device).eval()
    weights = ref.state_dict()

    def make(impl):
        m = cls.from_config(copy.deepcopy(config), attn_implementation=impl, dtype=dtype).to(device).eval()
        m.load_state_dict(weights)
        return m
    return ref, make(PEER.get(name, "sdpa")), make("rtcattn")


def padded_batch(side: str, seed: int = 1, lengths=LENGTHS, vocab=VOCAB, device="cpu"):
    """(input ids, attention mask) of prompts of the given lengths padded on one side to the longest."""
    g = torch.Generator().manual_seed(seed)
    s = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), s), generator=g)
    mask = torch.zeros(len(lengths), s, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "left":
            mask[b, s - n:] = 1
        else:
            mask[b, :n] = 1
    return ids.to(device), mask.to(device)


def agreement(logits, ref_logits, keep):
    """(top-1 agreement with the reference, max and mean |logit error|, per position: whether the top-1s agree,
    the reference's margin between its two largest logits, the largest error) over the kept positions."""
    a, r = logits.float()[keep], ref_logits.float()[keep]
    err = (a - r).abs()
    agree = a.argmax(-1) == r.argmax(-1)
    top2 = r.topk(2, -1).values
    return (agree.float().mean().item(), err.max().item(), err.mean().item(), agree, top2[:, 0] - top2[:, 1],
            err.max(-1).values)


def check_at_least_as_good(what, ours, peer):
    """ours / peer: agreement() tuples. The errors: max error at most the peer's with the slack of one bf16 ulp at
    the logits' magnitude (both models round their logits to bf16: the same error lands on either side of a rounding
    boundary), mean error at most the peer's plus 10%. Top-1: every position whose fp32 margin is more than twice
    the peer's largest error there (where a model as accurate as the peer cannot flip) agrees, and the overall
    agreement is at least the peer's less the near ties (positions inside that margin, where bf16 noise decides
    either model's pick)."""
    top1, worst, mean, agree, margin, _ = ours
    p_top1, p_worst, p_mean, _, _, p_pos = peer
    ulp = 2.0 ** -7 * max(p_worst, 1.0) * 8  # bf16 has 8 significant bits: one ulp at a logit of 8 * max(err, 1)
    decisive = margin > 2 * p_pos
    ties = 1.0 - decisive.float().mean().item()
    shown = (f"{what}: rtcattn top-1 {top1:.4f}, max err {worst:.4f}, mean err {mean:.5f}; peer top-1 {p_top1:.4f}, "
             f"max err {p_worst:.4f}, mean err {p_mean:.5f}; near ties {ties:.3f}")
    assert worst <= p_worst + ulp and mean <= 1.1 * p_mean, shown
    assert bool(agree[decisive].all()) and top1 >= p_top1 - ties, shown
    assert decisive.float().mean().item() >= 0.5, shown + " (too few decisive positions to judge the top-1)"


def fallbacks_since(before: dict) -> dict:
    now = rt.fallback_counts()
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}




def check_generate(name, ref, peer, ours, ids, mask, new_tokens=NEW_TOKENS):
    """Greedy generate of new_tokens with the cache (prefill, then decode steps) on both bf16 models: each step's
    logits against the fp32 model's on the same sequence (teacher-forced), by check_at_least_as_good."""
    kw = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    results = {}
    for who, model in (("ours", ours), ("peer", peer)):
        out = model.generate(ids, **kw)
        steps = torch.stack(out.logits, 1)                   # [B, new tokens, vocab]: each step's logits
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], steps.shape[1])], 1)
        want = ref(out.sequences, attention_mask=full_mask).logits[:, ids.shape[1] - 1:-1]
        results[who] = agreement(steps, want, torch.ones(steps.shape[:2], dtype=torch.bool, device=steps.device))
    check_at_least_as_good(f"{name} generate", results["ours"], results["peer"])


def check_padded(name, ref, peer, ours, ids, mask, side):
    """One forward of a padded batch: the kept positions' logits, by check_at_least_as_good."""
    keep = mask.bool()
    want = ref(ids, attention_mask=mask).logits
    check_at_least_as_good(f"{name} {side}-padded", agreement(ours(ids, attention_mask=mask).logits, want, keep),
                           agreement(peer(ids, attention_mask=mask).logits, want, keep))


def training_grads(model, ids, mask=None):
    """(loss, gradients of layer 0's q/k/v projections) of one training step (labels = the ids, padding -100)."""
    model.train()
    model.zero_grad()
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
    loss = model(ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    attn = model.model.layers[0].self_attn
    return loss.item(), [p.grad.float() for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)]


def check_training_step(ref, peer, ours, ids, mask=None) -> float:
    """The bf16 model on rtcattn's backward against fp32 at least as well as the peer: each gradient's relative
    error at most the peer's plus 10% (and 1e-3, for errors at the level of bf16's rounding of the gradient
    itself), the loss's error likewise (plus 1e-2); returns rtcattn's loss."""
    loss_ref, g_ref = training_grads(ref, ids, mask)
    loss_ours, g_ours = training_grads(ours, ids, mask)
    loss_peer, g_peer = training_grads(peer, ids, mask)
    for name, a, p, r in zip(("q_proj", "k_proj", "v_proj"), g_ours, g_peer, g_ref):
        ours_err, peer_err = ((a - r).norm() / r.norm()).item(), ((p - r).norm() / r.norm()).item()
        assert ours_err <= 1.1 * peer_err + 1e-3, f"{name}.grad: rtcattn {ours_err:.5f}, peer {peer_err:.5f}"
    assert abs(loss_ours - loss_ref) <= 1.1 * abs(loss_peer - loss_ref) + 1e-2, (loss_ours, loss_peer, loss_ref)
    return loss_ours
