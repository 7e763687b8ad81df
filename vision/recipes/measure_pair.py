"""Measure the zoo's text pair (shapes-caption-lm + shapes-caption-drafter) and record it in their cards.

    python -m mmspec.vision.recipes.measure_pair [--prompts 200] [--no-write]

The pair is the detailed captioner's language model and its text drafter, so everything is measured on
held-out detailed captions:

- quality of each model: held-out loss, perplexity and teacher-forced next-token accuracy on 2000
  held-out detailed captions (``<bos> caption <eos>``);

- per-token forward latency of each model (1 new token over a KV cache of 20 tokens,
  fp32, inference mode, mean of 100 calls) and the target's 6-token verify forward;
- greedy agreement: the target greedily continues held-out detailed-caption prefixes (up to
  30 new tokens); the drafter, teacher-forced on prompt + that continuation, predicts
  each continuation token; we count argmax matches;
- the mean accepted length tau that exact-match greedy speculative decoding would
  reach at draft length k (replayed from the per-position matches: draft token j is
  accepted iff all earlier ones were and the drafter's argmax equals the target's).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import time

import torch
from transformers import AutoTokenizer, DynamicCache, LlamaForCausalLM

from mmspec.cached_model import cache_argument
from mmspec.world import detailed_examples, heldout_prompts
from mmspec.zoo import resolve

from .train_caption_lm import DRAFTER_DIR, HELDOUT_N, TARGET_DIR, corpus_call, encode, evaluate

CACHE_LEN = 20


def load(folder) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def quality(model: LlamaForCausalLM, tok, seed: int) -> dict:
    """Held-out loss, perplexity and next-token accuracy on ``HELDOUT_N`` detailed captions."""
    captions = [caption for _, caption in detailed_examples(HELDOUT_N, seed, "heldout")]
    return {**evaluate(model, tok, encode(tok, captions)), "measured_on": corpus_call("detailed", HELDOUT_N, seed, "heldout")}


@torch.inference_mode()
def forward_latency_ms(model: LlamaForCausalLM, new_tokens: int, calls: int = 100) -> float:
    """Mean wall time of one forward of ``new_tokens`` over a ``CACHE_LEN``-token cache."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prefix = torch.randint(4, vocab, (1, CACHE_LEN), generator=gen)
    step = torch.randint(4, vocab, (1, new_tokens), generator=gen)
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, **{cache_argument(model): cache}, use_cache=True)
    pos = torch.arange(CACHE_LEN, CACHE_LEN + new_tokens).unsqueeze(0)
    total = 0.0
    for i in range(calls + 5):
        t0 = time.perf_counter()
        model(input_ids=step, **{cache_argument(model): cache}, position_ids=pos, use_cache=True)
        dt = time.perf_counter() - t0
        cache.crop(-new_tokens)  # roll back (negative = tokens to drop in transformers 5.x)
        if i >= 5:  # warm-up calls are not counted
            total += dt
    return 1000 * total / calls


def replay_tau(matches: list[list[bool]], k: int) -> float:
    """Tokens committed per target forward for greedy speculative decoding at draft length k."""
    tokens = rounds = 0
    for m in matches:
        pos = 0
        while pos < len(m):
            accepted = 0
            while accepted < k and pos + accepted < len(m) and m[pos + accepted]:
                accepted += 1
            step = min(accepted + 1, len(m) - pos)  # accepted drafts + correction/bonus token
            pos += step
            tokens += step
            rounds += 1
    return tokens / max(rounds, 1)


@torch.inference_mode()
def agreement(target: LlamaForCausalLM, drafter: LlamaForCausalLM, tok, prompts: list[str],
              max_new_tokens: int = 30) -> tuple[float, list[list[bool]]]:
    hits = total = 0
    matches: list[list[bool]] = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=max_new_tokens)
        cont = out[0, ids.shape[1]:]
        # The drafter predicts continuation token j from position (prompt_len - 1 + j).
        logits = drafter(input_ids=out[:, :-1]).logits[0, ids.shape[1] - 1:]
        m = (logits.argmax(-1) == cont).tolist()
        matches.append(m)
        hits += sum(m)
        total += len(m)
    return hits / total, matches


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="measure the caption target/drafter pair")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave the cards alone")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, drafter = load(resolve(TARGET_DIR.name)), load(resolve(DRAFTER_DIR.name))
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    qualities = {TARGET_DIR: quality(target, tok, args.seed), DRAFTER_DIR: quality(drafter, tok, args.seed)}
    lat = {
        "target_1_token_ms": forward_latency_ms(target, 1),
        "target_6_token_verify_ms": forward_latency_ms(target, 6),
        "drafter_1_token_ms": forward_latency_ms(drafter, 1),
    }
    lat = {k: round(v, 3) for k, v in lat.items()}
    acc, matches = agreement(target, drafter, tok, heldout_prompts(args.prompts, args.seed, scenes="detailed"))
    taus = {f"k{k}": round(replay_tau(matches, k), 3) for k in (1, 3, 5, 8)}
    result = {
        "latency": {**lat, "setup": f"fp32, inference_mode, KV cache of {CACHE_LEN} tokens, "
                                    f"mean of 100 calls, torch.set_num_threads({args.threads})"},
        "greedy_agreement": round(acc, 4),
        "greedy_tau_replayed": taus,
        "agreement_setup": f"{args.prompts} held-out prompts (heldout_prompts(n={args.prompts}, "
                           f"seed={args.seed}, scenes='detailed')), target greedy up to 30 new tokens, "
                           "drafter teacher-forced on them",
    }
    print(json.dumps({"quality": {k.name: v for k, v in qualities.items()}, **result}, indent=2))
    if not args.no_write:
        for folder in (TARGET_DIR, DRAFTER_DIR):
            card_path = folder / "zoo_card.json"
            card = json.loads(card_path.read_text())
            card["quality"] = qualities[folder]
            card["pair_metrics"] = result
            card_path.write_text(json.dumps(card, indent=2) + "\n")


if __name__ == "__main__":
    main()
