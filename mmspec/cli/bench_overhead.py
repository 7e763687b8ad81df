"""`mmspec bench overhead`: the loop's own overhead vs transformers, on a pair that always agrees."""

from __future__ import annotations

import argparse

from ..errors import MMSpecError
from . import checks
from .common import SharedFlags, add_size_flag, emit, set_threads


def register(benches: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = benches.add_parser("overhead", parents=[flags.repeats, flags.threads, flags.json],
                                help="loop overhead vs transformers on a pair that always agrees")
    parser.add_argument("--layers", type=checks.int_in(1, 64), default=8, help="target layers (1 to 64)")
    parser.add_argument("--hidden", type=hidden_size, default=512,
                        help="hidden size: a multiple of 8 (the attention heads), 8 to 4096")
    parser.add_argument("--max-new-tokens", type=checks.int_in(1, 480, " (the 512 positions less the 24-token prompt)"),
                        default=64)
    parser.add_argument("--num-draft-tokens", "-k", type=checks.positive_int, default=5)
    add_size_flag(parser, 8, "random prompts to run", "--num-prompts")
    parser.add_argument("--compile", action="store_true",
                        help="add the mmspec-compiled row (static caches, fixed-width steps, torch.compile); compiled "
                             "before timing, compile time reported")
    parser.set_defaults(func=run)


POSITIONS, PROMPT_TOKENS = 512, 24


def hidden_size(text: str) -> int:
    value = checks.int_in(8, 4096)(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"expected a multiple of 8 (the attention heads), got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..bench.text import bench_text, inert_layer_pair

    set_threads(args)
    if PROMPT_TOKENS + args.max_new_tokens + args.num_draft_tokens + 1 > POSITIONS:
        raise MMSpecError(f"--max-new-tokens {args.max_new_tokens} + --num-draft-tokens {args.num_draft_tokens} do not fit "
                          f"the model's {POSITIONS} positions after its {PROMPT_TOKENS}-token prompts")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=POSITIONS, eos_token_id=None)
    target, drafter = inert_layer_pair(LlamaForCausalLM(config), drafter_layers=1)
    prompts = [torch.randint(1, 1000, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(i)) for i in range(args.num_samples)]
    report = bench_text(
        target, drafter, prompts, max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens,
        policies=("fixed",), include_lookup=False, include_mmspec_compiled=args.compile, repeats=args.repeats,
        progress=not args.json, title=f"bench overhead: {args.layers}-layer target (all but 1 inert) + its 1-layer prefix as drafter",
    )
    emit(report, args)
    return 0
