"""`mmspec bench overhead`: the loop's own overhead vs transformers, on a pair that always agrees."""

from __future__ import annotations

import argparse

from .common import SharedFlags, emit, set_threads


def register(benches: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = benches.add_parser("overhead", parents=[flags.repeats, flags.threads, flags.json],
                                help="loop overhead vs transformers on a pair that always agrees")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", "-k", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..bench.text import bench_text, inert_layer_pair

    set_threads(args)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512, eos_token_id=None)
    target, drafter = inert_layer_pair(LlamaForCausalLM(config), drafter_layers=1)
    prompts = [torch.randint(1, 1000, (1, 24), generator=torch.Generator().manual_seed(i)) for i in range(args.num_prompts)]
    report = bench_text(
        target, drafter, prompts, max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens,
        policies=("fixed",), include_lookup=False, repeats=args.repeats, progress=not args.json,
        title=f"bench overhead: {args.layers}-layer target (all but 1 inert) + its 1-layer prefix as drafter",
    )
    emit(report, args)
    return 0
