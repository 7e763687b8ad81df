"""`mmspec generate`: speculative text generation with a target and a drafter."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import MMSpecError
from . import checks
from .common import SharedFlags, announce_toy, set_threads, stats_json
from .model_checks import check_model

DEFAULT_DRAFT_TOKENS = 5


def add_pair_args(parser: argparse.ArgumentParser) -> None:
    """Target, drafter and lengths, shared with `bench text`."""
    parser.add_argument("--model", default="shapes-caption-lm", help="zoo name, local folder or Hub id of the target")
    parser.add_argument("--drafter", default="shapes-caption-drafter", help="zoo name, local folder or Hub id of the drafter")
    parser.add_argument("--max-new-tokens", type=checks.positive_int, default=48)
    parser.add_argument("--num-draft-tokens", "-k", type=checks.positive_int, default=None,
                        help=f"draft tokens per round (default {DEFAULT_DRAFT_TOKENS}; mmspec generate: the target's "
                             "zoo card policy for this drafter, if it has one)")


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("generate", parents=[flags.seed, flags.threads, flags.json],
                                 help="speculative text generation with a target and a drafter; prints stats")
    add_pair_args(parser)
    parser.add_argument("prompt", help="text to continue")
    parser.add_argument("--policy", default=None, choices=["fixed", "heuristic", "adaptive"],
                        help="draft-length policy (default: the one the target's zoo card measured best with this "
                             "drafter, else fixed)")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding (lossless)")
    parser.add_argument("--temperature", type=checks.non_negative_float, default=1.0, help="with --sample; 0 = greedy")
    parser.add_argument("--top-k", type=checks.positive_int, default=None)
    parser.add_argument("--top-p", type=checks.open_probability, default=None, help="nucleus mass in (0, 1]")
    parser.add_argument("--compile", action="store_true",
                        help="the static-shape compiled path (static caches, fixed-width steps, torch.compile): the "
                             "same output; compiling takes a while on every run, so it pays for long outputs only")
    parser.set_defaults(func=run)


def fit_context(model, name: str, prompt_tokens: int, max_new_tokens: int) -> int:
    """Refuse a prompt the model cannot hold; cut `max_new_tokens` to the positions left, with a note."""
    context = getattr(model.config, "max_position_embeddings", None)
    if not context:
        return max_new_tokens
    if prompt_tokens >= context:
        raise MMSpecError(f"the prompt is {prompt_tokens} tokens, but {name} holds {context} positions: shorten it")
    if prompt_tokens + max_new_tokens > context:
        print(f"mmspec: max_new_tokens cut from {max_new_tokens} to {context - prompt_tokens}: {name} holds {context} "
              f"positions and the prompt takes {prompt_tokens}", file=sys.stderr)
        return context - prompt_tokens
    return max_new_tokens


def draft_policy(args: argparse.Namespace):
    """`--policy` / `-k` as given; with neither, the target card's `draft_policy` for this drafter (the policy
    `mmspec bench text` measured best for the pair), else a fixed length."""
    from ..policies import make_policy
    from ..zoo import card_of

    carded = card_of(args.model).get("draft_policy", {}).get(args.drafter)
    if args.policy is None and args.num_draft_tokens is None and carded is not None:
        options = {k: v for k, v in carded.items() if k != "policy"}
        try:
            return make_policy(carded.get("policy", "fixed"), **options)
        except (TypeError, MMSpecError) as err:
            raise MMSpecError(f"{args.model}'s card has a bad draft_policy for {args.drafter}: {err}") from None
    return make_policy(args.policy or "fixed", args.num_draft_tokens or DEFAULT_DRAFT_TOKENS)


def check_pair(args: argparse.Namespace) -> None:
    """The target and drafter names, checked before torch is imported (shared with `bench text`)."""
    check_model(args.model, "target", "lm")
    if args.drafter != "prompt-lookup":
        check_model(args.drafter, "drafter", "lm")


def run(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise MMSpecError("the prompt is empty")
    check_pair(args)
    import torch

    from ..decoding import speculative_generate
    from ..drafters import PromptLookupDrafter
    from ..zoo import load_causal_lm

    set_threads(args)
    announce_toy(args.model, "language model")
    target, tokenizer = load_causal_lm(args.model, "target")
    if tokenizer is None:
        raise MMSpecError(f"{args.model!r} has no tokenizer; `mmspec generate` needs one to read the prompt")
    drafter = PromptLookupDrafter() if args.drafter == "prompt-lookup" else load_causal_lm(args.drafter, "drafter")[0]
    input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    max_new_tokens = fit_context(target, args.model, input_ids.shape[1], args.max_new_tokens)
    out = speculative_generate(
        target, drafter, input_ids, max_new_tokens=max_new_tokens, do_sample=args.sample and args.temperature > 0,
        temperature=args.temperature or 1.0, top_k=args.top_k, top_p=args.top_p, generator=torch.Generator().manual_seed(args.seed),
        policy=draft_policy(args), compile=args.compile,
    )
    text = tokenizer.decode(out.sequences[0], skip_special_tokens=True)
    if args.json:
        print(json.dumps({"text": text, "tokens": out.sequences[0].tolist(), "stats": stats_json(out.stats)}, indent=2))
    else:
        print(text)
        print(out.stats.summary(), file=sys.stderr)
    return 0
