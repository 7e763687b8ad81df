"""`mmspec bench text`: plain greedy (eager and static-cache compiled) vs mmspec (each policy) vs transformers'
assisted generation."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import MMSpecError
from . import checks
from .common import SharedFlags, add_size_flag, emit, set_threads
from .generate import DEFAULT_DRAFT_TOKENS, add_pair_args, check_pair


def register(benches: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = benches.add_parser("text", parents=[flags.seed, flags.repeats, flags.threads, flags.json],
                                help="plain greedy vs mmspec (each policy) vs transformers assisted generation")
    add_pair_args(parser)
    parser.add_argument("--prompts", type=checks.text_file,
                        help="file with one prompt per line (default: prefixes of held-out detailed shapes-world "
                             "captions, the text the default pair knows)")
    add_size_flag(parser, 50, "prompts to run", "--num-prompts")
    parser.add_argument("--batch-size", type=checks.batch_sizes, default=None, metavar="B[,B...]",
                        help="decode the prompts in left-padded batches of each size (e.g. 1,4,8): plain batched "
                             "generate vs mmspec's batch loop, tokens/s per batch size")
    parser.add_argument("--no-compiled-baseline", action="store_true",
                        help="leave out the generate-static-compiled row (transformers' generate with a static cache "
                             "and a compiled forward; compiling takes a while, once, in the warm-up)")
    parser.add_argument("--compile", action="store_true",
                        help="add the mmspec-compiled row: mmspec's static-shape path (static caches, fixed-width "
                             "verify and drafter steps, torch.compile); compiled before timing, compile time reported")
    parser.set_defaults(func=run)


def read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts:
        path = Path(args.prompts)  # checked by argparse: an existing UTF-8 text file
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            raise MMSpecError(f"prompts file {path} has no non-empty line")
        return prompts[: args.num_samples]
    from ..world import heldout_prompts

    return heldout_prompts(args.num_samples, seed=args.seed, scenes="detailed")


def run(args: argparse.Namespace) -> int:
    check_pair(args)
    if args.prompts:  # a file without a prompt fails before torch is imported
        read_prompts(args)
    from ..bench.text import bench_text
    from ..zoo import load_causal_lm

    set_threads(args)
    k = args.num_draft_tokens or DEFAULT_DRAFT_TOKENS
    target, tokenizer = load_causal_lm(args.model, "target")
    drafter, _ = load_causal_lm(args.drafter, "drafter")
    if tokenizer is None:
        raise MMSpecError(f"{args.model!r} has no tokenizer; bench text needs one to encode prompts")
    prompts = [tokenizer(p, return_tensors="pt").input_ids for p in read_prompts(args)]
    if args.batch_size:
        if args.compile:
            raise MMSpecError("--compile decodes one sequence at a time; leave out --batch-size")
        from ..bench.batches import bench_text_batches

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else target.generation_config.pad_token_id
        report = bench_text_batches(
            target, drafter, [p[0].tolist() for p in prompts], args.batch_size, pad_token_id=pad or 0,
            max_new_tokens=args.max_new_tokens, num_draft_tokens=k, repeats=args.repeats,
            title=f"bench text: {args.model} + {args.drafter}", progress=not args.json)
        emit(report, args)
        return 0
    report = bench_text(
        target, drafter, prompts, max_new_tokens=args.max_new_tokens, num_draft_tokens=k,
        repeats=args.repeats, title=f"bench text: {args.model} + {args.drafter}", progress=not args.json,
        include_compiled=not args.no_compiled_baseline, include_mmspec_compiled=args.compile,
    )
    emit(report, args)
    return 0
