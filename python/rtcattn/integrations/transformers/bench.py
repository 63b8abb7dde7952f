"""`python -m rtcattn bench --suite transformers`: a random-initialised Llama (GQA 16/4, D 128, hidden 2048, 8 layers,
bf16) through Hugging Face transformers, with attn_implementation "rtcattn" against "sdpa" and, where they load
(their package imports and transformers accepts them), "flash_attention_2" and "flash_attention_4", in the same
rounds (each round runs every implementation once, in rotating order):

- prefill: one forward of 4 prompts of 1024, 896, 768 and 640 tokens, left-padded (the padded path), and of
  4 x 1024 unpadded (the dense path);
- decode step: `generate` with the cache, greedy, from the padded prompts: (time of 33 new tokens - time of 1) / 32,
  so the prefill cancels and what is left is the per-token step (attention over the growing cache, the rest of the
  model, generate's own host work);
- training step: forward + backward with labels (no optimizer), padded and unpadded 4 x 1024.

Wall-clock times with the device synchronised around each call (generate is host-driven: CUDA events would not
bracket it); the median over the rounds and, per implementation, its time over rtcattn's (median of per-round
ratios). transformers is imported when the suite runs, not when `bench` starts."""
from __future__ import annotations

import copy
import statistics
import time

from ...tools import bench as driver, timing

CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
              num_key_value_heads=4, head_dim=128, max_position_embeddings=4096)
LENGTHS = (1024, 896, 768, 640)
IMPLS = ("rtcattn", "sdpa", "flash_attention_2", "flash_attention_4")
STEPS = 32


def _models(torch, transformers):
    """{impl: model} for every implementation that loads, with the same weights."""
    from . import register
    register()
    config = transformers.LlamaConfig(**CONFIG)
    torch.manual_seed(0)
    models, why_not = {}, {}
    weights = None
    for impl in IMPLS:
        try:  # the package may be missing, transformers may refuse it here, or its first call may fail
            m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl,
                                                              dtype=torch.bfloat16)  # from_config sets its config
            if weights is None:
                weights = m.state_dict()
            else:
                m.load_state_dict(weights)
            m = m.cuda().eval()
            with torch.no_grad():
                m(torch.ones(1, 8, dtype=torch.long, device="cuda"))
        except Exception as e:  # any failure: that implementation is not run, and the table says why
            why_not[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
            continue
        models[impl] = m
    return models, why_not


def _batch(torch, padded: bool):
    s = max(LENGTHS)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, CONFIG["vocab_size"], (len(LENGTHS), s), generator=g)
    mask = torch.ones(len(LENGTHS), s, dtype=torch.long)
    if padded:
        for b, n in enumerate(LENGTHS):
            mask[b, :s - n] = 0
    return ids.cuda(), mask.cuda()


def _timed(torch, fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def run(args):
    import torch
    import transformers
    models, why_not = _models(torch, transformers)
    padded, dense = _batch(torch, True), _batch(torch, False)

    def prefill(m, batch):
        with torch.no_grad():
            m(batch[0], attention_mask=batch[1])

    def generate(m, n):
        with torch.no_grad():
            m.generate(padded[0], attention_mask=padded[1], max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       pad_token_id=0)

    def train(m, batch):
        m.zero_grad(set_to_none=True)
        labels = batch[0].masked_fill(batch[1] == 0, -100)
        m(batch[0], attention_mask=batch[1], labels=labels).loss.backward()

    cases = {
        "prefill 4 x <=1024, left-padded": lambda m: _timed(torch, lambda: prefill(m, padded)),
        "prefill 4 x 1024": lambda m: _timed(torch, lambda: prefill(m, dense)),
        f"decode step (generate, {STEPS} tokens)": lambda m: (_timed(torch, lambda: generate(m, STEPS + 1))
                                                            - _timed(torch, lambda: generate(m, 1))) / STEPS,
        "training step 4 x <=1024, left-padded": lambda m: _timed(torch, lambda: train(m, padded)),
        "training step 4 x 1024": lambda m: _timed(torch, lambda: train(m, dense)),
    }
    reps = max(3, min(args.reps, 10))
    rows = []
    names = list(models)
    for case, fn in cases.items():
        for m in models.values():  # warm: compiles, allocator, autotuning
            fn(m)
        times = {n: [] for n in names}
        for order in timing.round_orders(len(names), reps):
            for n in (names[i] for i in order):
                times[n].append(fn(models[n]))
        row = {"case": case}
        for n in names:
            row[n] = statistics.median(times[n])
            row[f"{n}/rtcattn"] = statistics.median(a / b for a, b in zip(times[n], times["rtcattn"]))
        rows.append(row)
    width = max(len(c) for c in cases)
    print(f"{'case':{width}}  " + "  ".join(f"{n + ' ms':>22}" for n in names))
    for row in rows:
        print(f"{row['case']:{width}}  " + "  ".join(
            f"{row[n]:>10.2f} ({row[f'{n}/rtcattn']:.2f}x)".rjust(22) for n in names))
    for impl, why in why_not.items():
        print(f"{impl}: not run ({why})")
    print("(x: the implementation's time over rtcattn's, median of per-round ratios; Llama 8 layers, hidden 2048, "
          "GQA 16/4, D 128, bf16)")
    return {"rows": rows, "not_run": why_not}


driver.register("transformers", run, "a Llama through Hugging Face transformers: prefill, decode step, training "
                "step against SDPA and the FlashAttention paths that load")
