"""`mmspec caption`: caption a video or an image, speculatively (lossless)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from . import checks, choices, folder_runs, input_probes
from .caption_frames import check_frames
from .collector import collector_paused
from .common import (
    IMAGE_SUFFIXES,
    SharedFlags,
    announce_toy,
    announce_zoo_default,
    set_threads,
    stats_json,
)
from .model_checks import check_model
from .placement import add_drafter_dtype_flag, add_placement_flags, placement_options
from .tree_flag import add_tree_flag, tree_config

TREE_METHODS = ("flash", "msd", "text")  # fastest trees first (BENCHMARKS.md)


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("caption", parents=[flags.seed, flags.threads, flags.json],
                                 help="caption a video or an image, speculatively (lossless)")
    parser.add_argument("path", type=folder_runs.file_or_folder,
                        help="video (any file PyAV decodes) or image file, or a folder of them (with --out FILE.jsonl)")
    parser.add_argument("--model", default=None, help="zoo name, local folder or Hub id (default: the toy captioner)")
    parser.add_argument("--drafter", default=None,
                        help="drafter of the chosen method: a text LM for text (default: the model's zoo pair), a trained "
                             "drafter folder for msd / flash (default: the model folder's msd/ or flash/)")
    parser.add_argument("--method", choices=choices.CAPTION_METHODS, default=None, metavar="METHOD",
                        help="ar = plain decoding, text = text-only drafter, std = Sparse-to-Dense, msd / flash = trained "
                             "feature drafters (default: fastest measured)")
    parser.add_argument("--num-draft-tokens", type=checks.positive_int, default=None,
                        help="tokens drafted per round (default: the model card's best for the method, else 5; StD 9)")
    add_tree_flag(parser)
    parser.add_argument("--frames", type=checks.positive_int, default=None,
                        help="frames sampled uniformly from the video (default: as many as the model was trained on, "
                             "from its card, else 8)")
    parser.add_argument("--fps", type=checks.positive_float, default=None, help="sample frames at this rate instead (capped by --frames)")
    parser.add_argument("--prompt", default=None)
    parser.add_argument("--max-new-tokens", type=checks.positive_int, default=None,
                        help="longest caption, in tokens (default: the model's generation config, else 64)")
    parser.add_argument("--temperature", type=checks.non_negative_float, default=None,
                        help="sample at this temperature (default and 0: greedy)")
    parser.add_argument("--compile", action="store_true",
                        help="the static-shape compiled path (static caches, fixed-width verify and text-drafter steps, "
                             "torch.compile): the same captions; compiling takes a while once per run (one file at a "
                             "time, chains)")
    folder_runs.add_flags(parser)
    add_drafter_dtype_flag(parser)
    add_placement_flags(parser)
    parser.set_defaults(func=run)


def media_kind(path: str) -> str:
    """"image" for a still image file, else "video" (a video file, or an animated GIF / WebP / PNG)."""
    return "image" if Path(path).suffix.lower() in IMAGE_SUFFIXES and not input_probes.is_animated_image(path) else "video"


def probe(path: str | Path) -> None:
    """Refuse an empty or unreadable input before torch is imported and the model loads."""
    path = str(path)
    if media_kind(path) == "image":
        input_probes.probe_image(path)
    elif input_probes.is_animated_image(path):
        input_probes.probe_animated_image(path)
    else:
        input_probes.probe_video(path)


def run(args: argparse.Namespace) -> int:
    placement = placement_options(args)
    folder = folder_runs.plan(args.path, args.out, IMAGE_SUFFIXES | folder_runs.VIDEO_SUFFIXES, args.retry_failed)
    if args.batch_size > 1 and folder is None:
        raise MMSpecError("--batch-size applies to a folder run into --out FILE.jsonl")
    if folder is None:
        probe(args.path)
    check_flags(args, folder is not None)
    if folder is not None and not input_probes.any_readable(folder.files, probe):  # no file to load a model for
        return folder.run(input_probes.refusal(probe), verb="captioned", as_json=args.json)
    check_model(args.model, "model", "vlm")
    if args.method in ("msd", "flash") and args.drafter:
        check_model(args.drafter, f"{args.method.upper()} drafter", "feature-drafter")
    else:
        check_model(args.drafter, "drafter", "lm")
    if folder is None and media_kind(args.path) == "video":  # a folder run records this per file, as it does now
        check_frames(args.model, args.frames)

    with collector_paused():  # the libraries' and the model's objects live until exit
        from ..vision.pipeline import DEFAULT_CAPTIONER, CaptionPipeline

        set_threads(args)

        announce_toy(args.model, "captioner")
        if args.model is None:
            announce_zoo_default(DEFAULT_CAPTIONER, "captioner", "synthetic videos of 1-4 moving shapes, detailed captions")
        # --drafter names the drafter of the chosen method: a feature drafter folder for msd / flash, else the text LM.
        feature = {args.method: args.drafter} if args.method in ("msd", "flash") and args.drafter else None
        pipe = CaptionPipeline.from_pretrained(args.model or DEFAULT_CAPTIONER, drafter=None if feature else args.drafter,
                                               feature_drafters=feature, num_draft_tokens=args.num_draft_tokens,
                                               drafter_dtype=args.drafter_dtype, **placement)
    if args.frames is None:
        args.frames = pipe.default_num_frames
    if args.method is None and args.tree is not None:
        args.method = tree_method(pipe.available_methods)
        print(f"mmspec: method {args.method!r} (--tree: the fastest method available that drafts trees)", file=sys.stderr)
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r} (fastest lossless method available for this model)", file=sys.stderr)
    if folder is not None:
        if args.batch_size > 1:
            pipe.check_batches(args.method, args.batch_size)  # a method that cannot batch fails once, before any file
        return folder.run(lambda path: caption_record(pipe, str(path), args), verb="captioned", as_json=args.json,
                          batch_size=args.batch_size, records_for=lambda paths: caption_records(pipe, paths, args))
    out = caption_one(pipe, args.path, args, progress_bar=not args.json)
    for note in out.notes or []:
        print(f"mmspec: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"text": out.text, "method": out.method, "model": out.model, "notes": out.notes or [],
                          "stats": stats_json(out.stats)},
                         indent=2))
    else:
        print(out.text)
        print(out.stats.summary(), file=sys.stderr)
    return 0


def check_flags(args: argparse.Namespace, folder_run: bool) -> None:
    """Flags that cannot go together, refused before torch is imported."""
    if args.compile and args.tree is not None:
        raise MMSpecError("--compile verifies chains; leave out --tree")
    if folder_run and args.batch_size > 1:
        if args.compile:
            raise MMSpecError("--compile captions one file at a time; use --batch-size 1 with --compile")
        if args.tree is not None:
            raise MMSpecError("--tree drafts one sequence at a time; use --batch-size 1 (or chains) "
                              f"with --batch-size {args.batch_size}")


def tree_method(available: list[str]) -> str:
    """The method `--tree` picks when none is named: FLASH, else MSD, else the text-only drafter."""
    for method in TREE_METHODS:
        if method in available:
            return method
    raise MMSpecError(f"--tree needs a method that drafts trees ({', '.join(TREE_METHODS)}); this model has "
                      f"{', '.join(available)}")


def caption_one(pipe: Any, path: str, args: argparse.Namespace, progress_bar: bool) -> Any:
    import torch

    media = {media_kind(path): path}
    return pipe(**media, prompt=args.prompt, max_new_tokens=args.max_new_tokens, method=args.method, num_frames=args.frames,
                fps=args.fps, do_sample=bool(args.temperature), temperature=args.temperature or 1.0,  # 0 = greedy
                generator=torch.Generator().manual_seed(args.seed), progress_bar=progress_bar, tree=tree_config(args.tree),
                compile=args.compile)


def caption_record(pipe: Any, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One line of a folder run's results file (the seed restarts per file: a file's caption does not depend on the others)."""
    return record_of(caption_one(pipe, path, args, progress_bar=False))


def record_of(out: Any) -> dict[str, Any]:
    return {"text": out.text, "method": out.method, "model": out.model, "notes": out.notes or [], "stats": stats_json(out.stats)}


def caption_records(pipe: Any, paths: list[Path], args: argparse.Namespace) -> list[dict[str, Any] | Exception]:
    """The lines of a batch of files (`--batch-size`): each file is loaded alone (one that fails to load gets its
    error), then the videos and the images are captioned in one batch each. The seed restarts per batch: with
    --temperature the rows of a batch draw from one generator in turn."""
    import torch

    from ..vision.inputs import load_frames, load_image

    results: list[dict[str, Any] | Exception | None] = [None] * len(paths)
    loaded: dict[str, list[tuple[int, Any]]] = {"video": [], "image": []}
    for index, path in enumerate(paths):
        kind = media_kind(str(path))
        try:
            media = load_frames(path, num_frames=args.frames, fps=args.fps) if kind == "video" else load_image(path)
        except MMSpecError as error:
            results[index] = error
            continue
        loaded[kind].append((index, media))
    for kind, items in loaded.items():
        if not items:
            continue
        outs = pipe(**{kind: [media for _, media in items]}, prompt=args.prompt, max_new_tokens=args.max_new_tokens,
                    method=args.method, num_frames=args.frames, fps=args.fps, do_sample=bool(args.temperature),
                    temperature=args.temperature or 1.0, generator=torch.Generator().manual_seed(args.seed),
                    progress_bar=False, batch_size=len(items))
        for (index, _), out in zip(items, outs):
            results[index] = record_of(out)
    return results  # type: ignore[return-value]  # every slot is filled
