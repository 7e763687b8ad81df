"""`mmspec bench vision`: caption methods side by side on held-out shapes videos."""

from __future__ import annotations

import argparse
import json

from ..errors import MMSpecError
from . import checks
from .common import SharedFlags, add_size_flag, check_device, emit, on_device, set_threads
from .model_checks import check_model
from .placement import add_drafter_dtype_flag
from .tree_flag import add_tree_flag, tree_config


def register(benches: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = benches.add_parser("vision", parents=[flags.seed, flags.repeats, flags.threads, flags.device, flags.json],
                                help="caption methods side by side on held-out shapes videos")
    parser.add_argument("--model", default="shapes-video-captioner")
    parser.add_argument("--drafter", default=None, help="text-only drafter (default: the model's zoo pair)")
    add_size_flag(parser, 10, "held-out videos to caption", "--num-videos")
    parser.add_argument("--max-new-tokens", type=checks.positive_int, default=None,
                        help="new-token cap per caption (default: 48, or 160 for a detailed captioner)")
    parser.add_argument("--num-draft-tokens", "-k", type=checks.positive_int, default=5)
    parser.add_argument("--std", nargs="+", type=checks.pair_of_ints("--std", "K", "GAMMA"),
                        default=[(32, 5), (32, 9), (72, 5)], metavar="K,GAMMA",
                        help="Sparse-to-Dense settings: visual KV entries kept, draft length")
    add_tree_flag(parser)
    parser.add_argument("--confidence-stop", type=confidence_stop, default=None, metavar="K,THRESHOLD",
                        help="one more row per drafter (text-only, msd, flash): draft up to K tokens a round, stopping at the "
                             "first draft the drafter gives a probability below THRESHOLD (e.g. 12,0.5)")
    add_drafter_dtype_flag(parser)
    parser.add_argument("--frames", type=checks.positive_int, default=None,
                        help="frames per held-out video (default: the captioner's own, from its card); 36 visual tokens "
                             "per frame, so this sets the visual KV length Sparse-to-Dense works against")
    parser.add_argument("--batch-size", type=checks.batch_sizes, default=None, metavar="B[,B...]",
                        help="caption the videos in left-padded batches of each size (e.g. 1,4,8): plain batched generate "
                             "vs mmspec's methods that decode batches, tokens/s per batch size")
    parser.add_argument("--extra-drafter", action="append", default=[], metavar="LABEL=KIND:PATH[@DTYPE]",
                        help="one more row: a trained feature drafter (KIND msd or flash) saved in PATH, e.g. an ablation, "
                             "run in DTYPE if given (float32, bfloat16, float16); repeatable (the model folder's msd/ and "
                             "flash/ drafters get rows by default)")
    parser.add_argument("--lean-ablation", action="store_true",
                        help="a twin row (' hf-fwd') for every text-only, msd and flash row, its drafter stepping through "
                             "transformers' forward instead of mmspec.kernels.lean_llama: the same drafts, the per-call cost")
    parser.add_argument("--compile", action="store_true",
                        help="a twin row (' compiled') for the greedy loop and every chain row on mmspec's static-shape "
                             "path (static caches, fixed-width steps, torch.compile); compiled before timing, compile "
                             "times reported")
    parser.set_defaults(func=run)


def extra_drafter_parts(spec: str) -> tuple[str, str, str]:
    """LABEL, KIND, PATH[@DTYPE] of an --extra-drafter spec, or one error (the full parse: `parse_drafter_spec`)."""
    label, sep, rest = spec.partition("=")
    kind, sep2, path = rest.partition(":")
    if not (sep and sep2 and label.strip() and path.strip()) or kind.strip() not in ("msd", "flash"):
        raise MMSpecError(f"--extra-drafter takes LABEL=KIND:PATH[@DTYPE] (KIND msd or flash), got {spec!r}")
    return label.strip(), kind.strip(), path.strip()


def confidence_stop(text: str) -> tuple[int, float]:
    """`K,THRESHOLD` -> (K, THRESHOLD): K >= 1 drafts at most, THRESHOLD a probability in [0, 1]."""
    parts = text.split(",")
    try:
        most, threshold = checks.positive_int(parts[0]), float(parts[1])
        if len(parts) != 2 or not 0.0 <= threshold <= 1.0:
            raise ValueError
    except (ValueError, IndexError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected K,THRESHOLD (an integer >= 1 and a probability), got {text!r}") from None
    return most, threshold


def run(args: argparse.Namespace) -> int:
    for spec in args.extra_drafter:  # the shape of each spec, and the folders, before torch is imported
        _, kind, path = extra_drafter_parts(spec)
        stem, at, dtype = path.rpartition("@")
        check_model(stem if at and dtype.strip() in checks.DTYPE_NAMES else path, f"{kind.upper()} drafter",
                    "feature-drafter")
    check_model(args.model, "model", "vlm")
    check_model(args.drafter, "drafter", "lm")
    checks.refuse_cuda_without_driver(args.device, "--device")
    from ..vision.bench import CaptionInput, bench_vision, bench_vision_batches
    from ..vision.feature_methods import load_checked, parse_drafter_spec
    from ..vision.pipeline import CaptionPipeline
    from ..world import caption_token_cap, captioner_examples, render_video

    set_threads(args)
    check_device(args)
    pipe = on_device(CaptionPipeline.from_pretrained(args.model, drafter=args.drafter, drafter_dtype=args.drafter_dtype), args)
    feature = dict(pipe.feature_drafters)  # the model's own msd / flash drafters, when it has them
    for spec in args.extra_drafter:
        label, kind, path, dtype = parse_drafter_spec(spec)
        if label in feature:
            raise MMSpecError(f"--extra-drafter label {label!r} is used twice (msd / flash name the model's own drafters)")
        feature[label] = load_checked(kind, path, pipe.model, dtype=dtype or pipe_drafter_dtype(pipe, args))
    frames, size = args.frames or pipe.card.get("frames", 8), pipe.card.get("frame_size", 96)
    if args.max_new_tokens is None:
        args.max_new_tokens = caption_token_cap(pipe.card)
    # held-out videos like the ones the captioner was trained on (its card says which scenes, how many shapes)
    videos = [render_video(scene, num_frames=frames, size=size)
              for scene, _caption in captioner_examples(pipe.card, args.num_samples, seed=args.seed, split="heldout")]
    if args.batch_size:
        if (args.tree is not None or args.extra_drafter or args.confidence_stop is not None or args.lean_ablation
                or args.compile):
            raise MMSpecError("--batch-size compares the methods that decode batches; --tree, --confidence-stop, "
                              "--extra-drafter, --lean-ablation and --compile apply without it")
        report = bench_vision_batches(pipe, videos, args.batch_size, max_new_tokens=args.max_new_tokens,
                                      num_draft_tokens=args.num_draft_tokens, repeats=args.repeats, progress=not args.json,
                                      title=f"bench vision: {args.model} on {len(videos)} held-out videos")
        emit(report, args)
        return 0
    items = []
    for video in videos:
        inputs = pipe.prepare_inputs(video=video)
        items.append(CaptionInput(input_ids=inputs.pop("input_ids"), model_inputs=inputs))
    std = tuple(args.std)
    report, extras = bench_vision(pipe.model, items, drafter=pipe.drafter_model, feature_drafters=feature,
                                  max_new_tokens=args.max_new_tokens,
                                  num_draft_tokens=args.num_draft_tokens, std_settings=std, repeats=args.repeats,
                                  tree=tree_config(args.tree),
                                  confidence_stop=args.confidence_stop, lean_ablation=args.lean_ablation,
                                  compiled=args.compile, progress=not args.json,
                                  title=f"bench vision: {args.model} on {len(items)} held-out videos")
    if args.json:
        print(json.dumps({**report.to_dict(), "extras": extras}, indent=2))
        return 0
    print(report.to_table())
    print(f"visual tokens {extras['visual_tokens']} of {extras['prompt_tokens']} prompt tokens; one decode step: "
          f"{extras['step_ms_full_cache']:.2f} ms over the full cache, {extras['step_ms_text_cache']:.2f} ms over text KV only "
          f"(visual attention share {extras['visual_attention_share']:.0%}, measured)")
    if extras.get("decode_phase"):
        print("decode phase alone (median wall time minus prefill, all videos; prefill = vision tower + prompt, the same "
              "work for every method):")
        for name, row in extras["decode_phase"].items():
            print(f"  {name:<26} prefill {row['prefill_s']:.3f} s  decode {row['decode_s']:.3f} s  "
                  f"decode speed-up {row['decode_speed_up']:.2f}x vs greedy-loop")
    print("modelled memory-bound speed-up (bytes of weights + KV read per committed token, plain / method; a GPU-like "
          "regime, NOT measured here):")
    for name, value in extras["modelled_memory_bound_speed_up"].items():
        print(f"  {name:<26} {value:.2f}x")
    for note in extras.get("notes", []):
        print(f"note: {note}")
    return 0


def pipe_drafter_dtype(pipe, args: argparse.Namespace):
    import torch

    return getattr(torch, args.drafter_dtype) if args.drafter_dtype else pipe.model.dtype

