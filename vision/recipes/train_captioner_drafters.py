"""Build the toy captioner's MSD and FLASH drafters from scratch, in one command.

    python -m mmspec.vision.recipes.train_captioner_drafters                 # data + msd + flash, to ./shapes-video-captioner
    python -m mmspec.vision.recipes.train_captioner_drafters --time-only     # measure, print the estimate, stop
    python -m mmspec.vision.recipes.train_captioner_drafters --ablations     # + the ablation drafters (not shipped)

What it does, in order:

1. renders `--videos` shapes-world *train* videos (`mmspec.world.captioner_examples(card, N, seed,
   "train")`: the stream the captioner itself was trained on, detailed scenes when its card says
   `"scenes": "detailed"`), and turns each into model inputs with the
   captioner's own processor and prompt (`CaptionPipeline.prepare_inputs`, so the drafters see
   exactly the prompts `mmspec caption` feeds);
2. self-distillation (`vision.distill_data.generate_distill_data`): the captioner's greedy traces
   of every video, plus a text-only trace of the same prompt without the video (MSD's first
   curriculum stage);
3. trains each `--kinds` drafter with `vision.drafter_training.train_drafter`: MSD with its
   two-stage curriculum (text-only traces, then a rising share of multimodal ones); FLASH with
   latent-aware compression (288 visual tokens -> `--flash-queries`) and a semi-autoregressive
   head (`--flash-semi-ar` tokens per forward), on all traces;
4. ships each as `OUT/msd/` and `OUT/flash/` (fp16 safetensors + `training.json`) and adds a
   "drafters" entry with the rebuild command to `OUT/zoo_card.json`. `--out` (default
   `./shapes-video-captioner`) starts as a copy of the captioner without its drafters, so it is a
   complete model folder (`mmspec caption --model OUT`); only `--into-zoo` writes into the
   installed captioner, replacing the shipped drafters.

`--ablations` also trains, into `--out-root/ablations/` (never shipped): FLASH without compression,
FLASH with one token per forward (no semi-autoregressive head), MSD without the curriculum; the
bench compares them with `mmspec bench vision --extra-drafter LABEL=KIND:PATH`.

Before the real work the script times two traces and a few training steps of each kind and
prints the estimated total. Training checkpoints go to `--out-root/<kind>/checkpoints`
(`--resume` continues from them).

The defaults are the shipped build (the captioner card's `drafters.rebuild_command`): 600 detailed
videos (captions of up to 160 tokens), 3000 steps of batch 4 per drafter. That build took 48.1 minutes
with two torch threads on 2 CPU cores (card: distillation 1756 s, MSD 519 s, FLASH 596 s); the earlier
one-shape captioner's drafters used 1200 videos of ~15-token captions. In a 40-video pilot, 600 FLASH steps instead
of 150 raised tau from 3.4 to 4.6 (k = 5): steps matter more than data at this size.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from mmspec.errors import MMSpecError
from mmspec.training import adamw, add_output_arguments, optimizer_step, parse_output_folder
from mmspec.world import caption_token_cap

from . import captioner_data as cd

DEFAULT_OUT_ROOT = Path.home() / ".cache" / "mmspec" / "captioner-drafters"
KINDS = ("msd", "flash")
MACHINE = "2 CPU cores"


@dataclass(frozen=True)
class Recipe:
    """How one drafter is trained: its kind, curriculum and drafter config overrides."""

    kind: str
    curriculum: str
    options: dict[str, Any]
    note: str


def recipes(args: argparse.Namespace) -> dict[str, Recipe]:
    """The shipped drafters (by kind) and, with --ablations, the ablation drafters (by label)."""
    flash = dict(num_queries=args.flash_queries, semi_ar_tokens=args.flash_semi_ar, compress=True)
    shipped = {
        "msd": Recipe("msd", "two-stage", {}, "MSD, two-stage curriculum (text-only, then rising multimodal share)"),
        "flash": Recipe("flash", "none", flash, f"FLASH, {args.flash_queries} compressed visual tokens, "
                        f"{args.flash_semi_ar} drafts per forward"),
    }
    out = {} if args.only_ablations else {kind: shipped[kind] for kind in args.kinds}
    if args.ablations or args.only_ablations:
        out["flash-no-compression"] = Recipe("flash", "none", {**flash, "compress": False},
                                             "FLASH ablation: all 288 visual embeddings kept")
        out["flash-semi-ar-1"] = Recipe("flash", "none", {**flash, "semi_ar_tokens": 1},
                                        "FLASH ablation: one draft per forward (no semi-autoregressive head)")
        out["msd-no-curriculum"] = Recipe("msd", "none", {}, "MSD ablation: all traces mixed from the first step")
    return out


# ---------------------------------------------------------------- inputs


class VideoInputs:
    """The captioner's inputs for train videos 0..n-1, rendered one at a time (a sized iterable)."""

    def __init__(self, pipe: Any, n: int, seed: int, start: int = 0) -> None:
        from mmspec.world import captioner_examples

        self.pipe = pipe  # videos like the captioner's own training videos (detailed ones for a detailed captioner)
        self.scenes = [scene for scene, _ in captioner_examples(pipe.card, start + n, seed=seed, split="train")[start:]]

    def __len__(self) -> int:
        return len(self.scenes)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        from mmspec.world import render_video

        frames, size = self.pipe.card.get("frames", cd.FRAMES), self.pipe.card.get("frame_size", cd.FRAME_SIZE)
        for scene in self.scenes:
            yield self.pipe.prepare_inputs(video=render_video(scene, num_frames=frames, size=size))


def load_captioner(folder: Path) -> Any:
    """The captioner as a `CaptionPipeline` without drafters (old msd/ and flash/ folders are not read)."""
    from transformers import AutoProcessor

    from mmspec.vision.models import load_vision_model
    from mmspec.vision.pipeline import CaptionPipeline

    if not (folder / "config.json").is_file():
        raise MMSpecError(f"no captioner in {folder} (config.json not found): build it first "
                          "(python -m mmspec.vision.recipes.train_video_captioner) or pass --captioner FOLDER")
    card_file = folder / "zoo_card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else {}
    model = load_vision_model(folder)
    try:
        processor = AutoProcessor.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - any failure means the folder lacks a usable processor
        raise MMSpecError(f"could not load the processor of {folder}: {str(err).splitlines()[0]}") from None
    return CaptionPipeline(model, processor, model_name=folder.name, card=card)


# ---------------------------------------------------------------- timing / estimate


def time_train_steps(model: Any, recipe: Recipe, data_dir: Path, batch_size: int, repeats: int = 3) -> dict[str, float]:
    """Median seconds of one training step on a text-only batch and on a multimodal batch."""
    from mmspec.vision.distill_data import MULTIMODAL, TEXT, DistillDataset, collate
    from mmspec.vision.drafter_training import drafter_class, frozen_copy

    dataset = DistillDataset(data_dir)
    torch.manual_seed(0)
    drafter = drafter_class(recipe.kind).from_target_config(model.config.get_text_config(), **recipe.options).train()
    embed, head = frozen_copy(model.get_input_embeddings()), frozen_copy(model.get_output_embeddings())
    optimizer = adamw(drafter.parameters(), 1e-4)
    out = {}
    for modality in (TEXT, MULTIMODAL):
        pool = dataset.indices(modality)
        batch = collate([dataset[pool[i % len(pool)]] for i in range(batch_size)])
        times = []
        for _ in range(repeats + 1):  # the first step warms up allocators and is not counted
            start = time.perf_counter()
            optimizer_step(optimizer, drafter.training_loss(batch, embed, head, noise_std=0.2)["loss"])
            times.append(time.perf_counter() - start)
        out[modality] = statistics.median(times[1:])
    return out


def expected_train_seconds(step_s: dict[str, float], recipe: Recipe, steps: int, batch_size: int,
                           multimodal_fraction: float, text_fraction: float) -> float:
    """Expected training time: a batch with any multimodal trace costs a multimodal step (padding)."""
    from mmspec.vision.drafter_training import multimodal_share

    total = 0.0
    for step in range(steps):
        share = multimodal_share(step, steps, text_fraction) if recipe.curriculum == "two-stage" else multimodal_fraction
        any_multimodal = 1.0 - (1.0 - share) ** batch_size
        total += any_multimodal * step_s["multimodal"] + (1.0 - any_multimodal) * step_s["text"]
    return total


def estimate(pipe: Any, args: argparse.Namespace, plan: dict[str, Recipe]) -> dict[str, Any]:
    """Time two traces and a few steps of each recipe; return per-item timings and the estimated totals."""
    from mmspec.vision.distill_data import generate_distill_data

    probe = VideoInputs(pipe, 2, seed=args.seed, start=args.videos)  # videos past the data set: no cache effects
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        generate_distill_data(pipe.model, probe, Path(tmp) / "data", max_new_tokens=args.max_new_tokens, progress=False)
        per_video = (time.perf_counter() - start) / len(probe)
        steps = {label: time_train_steps(pipe.model, recipe, Path(tmp) / "data", args.batch_size)
                 for label, recipe in plan.items()}
    train = {label: expected_train_seconds(steps[label], recipe, args.steps, args.batch_size, 0.5, args.text_fraction)
             for label, recipe in plan.items()}
    shipped = per_video * args.videos + sum(train[k] for k in args.kinds if k in train)
    return {"seconds_per_video": per_video, "step_seconds": steps, "train_seconds": train,
            "data_seconds": per_video * args.videos, "shipped_total_seconds": shipped,
            "total_seconds": per_video * args.videos + sum(train.values())}


def print_estimate(est: dict[str, Any], args: argparse.Namespace) -> None:
    threads = torch.get_num_threads()
    print(f"timing on this machine ({threads} torch thread{'s' * (threads > 1)}):", flush=True)
    print(f"  distillation: {est['seconds_per_video']:.2f} s per video (+ its text-only trace) "
          f"-> {est['data_seconds'] / 60:.1f} min for {args.videos} videos")
    for label, step in est["step_seconds"].items():
        print(f"  {label:<22} step (batch {args.batch_size}): text {step['text']:.3f} s, multimodal "
              f"{step['multimodal']:.3f} s -> {est['train_seconds'][label] / 60:.1f} min for {args.steps} steps")
    print(f"  estimated total: {est['shipped_total_seconds'] / 60:.1f} min for data + {' + '.join(args.kinds)}"
          + (f", {est['total_seconds'] / 60:.1f} min with the ablations" if args.ablations else ""), flush=True)


# ---------------------------------------------------------------- train and ship


def train_one(pipe: Any, label: str, recipe: Recipe, data_dir: Path, out_dir: Path, args: argparse.Namespace) -> Any:
    from mmspec.vision.drafter_training import train_drafter

    print(f"training {label}: {recipe.note}", flush=True)
    return train_drafter(pipe.model, recipe.kind, data_dir, out_dir, steps=args.steps, batch_size=args.batch_size,
                         lr=args.lr, noise_std=args.noise_std, curriculum=recipe.curriculum,
                         checkpoint_every=args.checkpoint_every, resume=args.resume, seed=args.seed,
                         text_fraction=args.text_fraction, drafter_options=recipe.options)


def ship(drafter: Any, trained_dir: Path, dest: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Save `drafter` in fp16 to `dest` with `training.json` (the trainer's report + `extra`); return that report."""
    if dest.exists():
        shutil.rmtree(dest)
    drafter.to(torch.float16).save_pretrained(dest)  # fp16 on disk, like the captioner; loaded back in fp32
    report = {**json.loads((trained_dir / "training.json").read_text()), **extra}
    (dest / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def copy_captioner(captioner: Path, out: Path) -> None:
    """Make `out` a copy of the captioner without its drafters (nothing to do when `out` is the captioner)."""
    if out.resolve() != captioner.resolve():
        shutil.copytree(captioner, out, ignore=shutil.ignore_patterns(*KINDS), dirs_exist_ok=True)


def rebuild_command(args: argparse.Namespace) -> str:
    command = (f"python -m mmspec.vision.recipes.train_captioner_drafters --kinds {' '.join(args.kinds)} --videos {args.videos} "
               f"--steps {args.steps} --batch-size {args.batch_size} --lr {args.lr} --max-new-tokens {args.max_new_tokens} "
               f"--flash-queries {args.flash_queries} --flash-semi-ar {args.flash_semi_ar} --seed {args.seed}")
    return command + f" --threads {args.threads}"


def update_card(folder: Path, entries: dict[str, dict[str, Any]], data: dict[str, Any], args: argparse.Namespace,
                wall: float) -> None:
    """Add (or refresh) the "drafters" entry of the captioner's zoo card."""
    card_file = folder / "zoo_card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else {}
    drafters = dict(card.get("drafters", {}))
    drafters.update(entries)
    drafters.update({"data": data, "build_wall_time_s": round(wall, 1),
                     "train_machine": f"{MACHINE}, torch.set_num_threads({args.threads})",
                     "rebuild_command": rebuild_command(args)})
    card["drafters"] = drafters
    card_file.write_text(json.dumps(card, indent=2) + "\n")


def run(args: argparse.Namespace) -> int:
    from mmspec.vision.distill_data import generate_distill_data

    torch.set_num_threads(args.threads)
    folder = Path(args.captioner).expanduser()
    out = Path(args.out)
    out_root = Path(args.out_root).expanduser()
    plan = recipes(args)
    began = time.perf_counter()
    pipe = load_captioner(folder)
    if args.max_new_tokens is None:
        args.max_new_tokens = caption_token_cap(pipe.card)
    print(f"captioner {folder} ({sum(p.numel() for p in pipe.model.parameters()) / 1e6:.1f}M params); "
          f"drafters: {', '.join(plan)}", flush=True)
    est = estimate(pipe, args, plan)
    print_estimate(est, args)
    if args.time_only:
        return 0

    data_dir = out_root / "data"
    start = time.perf_counter()
    if args.reuse_data and (data_dir / "metadata.json").is_file():
        # Same captioner and seed: the traces a previous run of this command made (e.g. before --only-ablations).
        meta = json.loads((data_dir / "metadata.json").read_text())
        print(f"reusing the traces in {data_dir} ({meta['num_traces']} traces)", flush=True)
    else:
        meta = generate_distill_data(pipe.model, VideoInputs(pipe, args.videos, seed=args.seed), data_dir,
                                     max_new_tokens=args.max_new_tokens, text_traces=True, overwrite=True)
    data_wall = time.perf_counter() - start
    data = {"videos": args.videos, "split": "train", "seed": args.seed, "traces": meta["num_traces"],
            "modalities": meta["modalities"], "max_new_tokens": args.max_new_tokens,
            "distill_wall_time_s": round(data_wall, 1),
            "source": f"mmspec.world.captioner_examples(card, {args.videos}, seed={args.seed}, split='train') "
                      f"({pipe.card.get('scenes', 'one-shape')} scenes), rendered like the "
                      "captioner's training videos, inputs from its processor and prompt"}

    if any(label in KINDS for label in plan):
        copy_captioner(folder, out)
    shipped: dict[str, dict[str, Any]] = {}
    for label, recipe in plan.items():
        trained_dir = out_root / ("ablations" if label not in KINDS else "") / label
        drafter = train_one(pipe, label, recipe, data_dir, trained_dir, args)
        extra = {"label": label, "recipe": recipe.note, "drafter_options": recipe.options, "data": {**data, "dir": str(data_dir)},
                 "machine": MACHINE, "threads": args.threads, "estimated_train_s": round(est["train_seconds"][label], 1),
                 "build_command": rebuild_command(args)}
        if label in KINDS:
            report = ship(drafter, trained_dir, out / label, extra)
            params = sum(p.numel() for p in drafter.parameters())
            shipped[label] = {"folder": label, "kind": recipe.kind, "recipe": recipe.note, "options": recipe.options,
                              "params": params, "steps": args.steps, "batch_size": args.batch_size,
                              "train_wall_time_s": round(report["wall_time_s"], 1),
                              "final_token_accuracy": report["final"]["token_accuracy"], "training": f"{label}/training.json"}
        else:
            report = {**json.loads((trained_dir / "training.json").read_text()), **extra}
            (trained_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"{label}: {report['wall_time_s'] / 60:.1f} min, final token accuracy {report['final']['token_accuracy']:.3f} "
              f"-> {out / label if label in KINDS else trained_dir}", flush=True)
    wall = time.perf_counter() - began
    if shipped:
        update_card(out, shipped, data, args, wall)
    print(f"done in {wall / 60:.1f} min (estimated {est['total_seconds'] / 60:.1f} min)", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mmspec.vision.recipes.train_captioner_drafters",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--captioner", default=str(cd.zoo_folder()), help="captioner folder (default: the zoo's)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="drafters to train and ship")
    add_output_arguments(parser, cd.zoo_folder().name, "the captioner with its new drafters")
    parser.add_argument("--videos", type=int, default=600, help="train videos to distil (each adds a text-only trace)")
    parser.add_argument("--steps", type=int, default=3000, help="training steps of each drafter")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--noise-std", type=float, default=0.2, help="uniform noise on input features (EAGLE: 0.2)")
    parser.add_argument("--text-fraction", type=float, default=0.5, help="MSD: share of steps in the text-only stage")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="caption length cap of the traces (default: 48, or 160 for a detailed captioner)")
    parser.add_argument("--flash-queries", type=int, default=32, help="FLASH: compressed visual tokens per video")
    parser.add_argument("--flash-semi-ar", type=int, default=3, help="FLASH: draft tokens per drafter forward")
    parser.add_argument("--out-root", default=str(DEFAULT_OUT_ROOT), help="data, checkpoints and ablation drafters go here")
    parser.add_argument("--ablations", action="store_true", help="also train the ablation drafters (into --out-root)")
    parser.add_argument("--only-ablations", action="store_true", help="train the ablation drafters only (nothing shipped)")
    parser.add_argument("--reuse-data", action="store_true",
                        help="use the traces already in --out-root/data (made by an earlier run for this captioner)")
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--resume", action="store_true", help="continue each drafter from its latest checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-only", action="store_true", help="print the timing estimate and stop")
    return parser


def check_args(args: argparse.Namespace) -> None:
    for name in ("videos", "steps", "batch_size", "max_new_tokens", "flash_queries", "flash_semi_ar", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise MMSpecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lr <= 0:
        raise MMSpecError(f"--lr must be > 0, got {args.lr}")
    if not 0.0 <= args.text_fraction < 1.0:
        raise MMSpecError(f"--text-fraction must be in [0, 1), got {args.text_fraction}")
    args.kinds = list(dict.fromkeys(args.kinds))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.out = str(parse_output_folder(parser, args, cd.zoo_folder()))
    try:
        check_args(args)
        return run(args)
    except MMSpecError as err:
        print(f"train_captioner_drafters: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
