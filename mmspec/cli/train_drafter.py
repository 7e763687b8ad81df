"""`mmspec train-drafter`: a feature drafter (MSD, FLASH) for a vision-language model, on its traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import MMSpecError
from . import checks
from .choices import DISTILL_FORMAT
from .common import SharedFlags, set_threads
from .model_checks import check_model


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("train-drafter", parents=[flags.seed, flags.threads],
                                 help="train a feature drafter (MSD, FLASH) for a vision-language model on its "
                                      "self-distillation traces (vision.distill_data)")
    parser.add_argument("--target", required=True, help="local folder or Hub id of the vision-language target")
    parser.add_argument("--kind", default="msd", choices=["msd", "flash"], help="drafter kind")
    parser.add_argument("--data", required=True, type=checks.existing_folder,
                        help="folder written by generate_distill_data (metadata.json + shards)")
    parser.add_argument("--out", required=True, type=checks.output_folder,
                        help="folder to save_pretrained into (checkpoints go to OUT/checkpoints)")
    parser.add_argument("--steps", type=checks.positive_int, default=1000)
    parser.add_argument("--batch-size", type=checks.positive_int, default=4)
    parser.add_argument("--lr", type=checks.positive_float, default=1e-4)
    parser.add_argument("--warmup", type=checks.non_negative_int, default=None, help="warmup steps (default: 5%% of --steps)")
    parser.add_argument("--noise-std", type=checks.non_negative_float, default=0.2, help="uniform noise on input features (EAGLE: 0.2)")
    parser.add_argument("--curriculum", choices=["two-stage", "none"], default="two-stage",
                        help="two-stage = MSD's text-only stage, then a rising share of multimodal traces")
    parser.add_argument("--text-fraction", type=checks.probability, default=0.5, help="share of steps in the text-only stage")
    parser.add_argument("--checkpoint-every", type=checks.positive_int, default=500)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in OUT/checkpoints")
    parser.set_defaults(func=run)


def check_data_folder(folder: str) -> None:
    """The distillation data's metadata.json must be a JSON object (read before the target loads)."""
    meta = Path(folder) / "metadata.json"
    if not meta.is_file():
        raise MMSpecError(f"{folder} has no metadata.json; make it with generate_distill_data")
    try:
        metadata = json.loads(meta.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MMSpecError(f"{meta} is not valid JSON ({error})") from None
    if not isinstance(metadata, dict):
        raise MMSpecError(f"{meta} must hold a JSON object, got a {type(metadata).__name__}")
    if metadata.get("format") != DISTILL_FORMAT:
        raise MMSpecError(f"{folder} is not mmspec distillation data (format {metadata.get('format')!r})")


def run(args: argparse.Namespace) -> int:
    if args.resume and not any((Path(args.out) / "checkpoints").glob("step-*.pt")):
        raise MMSpecError(f"--resume: nothing to resume in {args.out} (no checkpoints/step-*.pt); leave out --resume to start")
    check_data_folder(args.data)
    check_model(args.target, "target", "vlm")
    from ..vision.drafter_training import train_drafter

    set_threads(args)
    train_drafter(args.target, args.kind, args.data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                  warmup=args.warmup, noise_std=args.noise_std, curriculum=args.curriculum, text_fraction=args.text_fraction,
                  checkpoint_every=args.checkpoint_every, resume=args.resume, seed=args.seed)
    report = json.loads((Path(args.out) / "training.json").read_text())
    final = report["final"]
    loss = f"loss {report['first_loss']:.3f} -> {final['loss']:.3f}, " if final["loss"] is not None else ""
    accuracy = f"token accuracy {final['token_accuracy']:.3f}, " if final["token_accuracy"] is not None else ""
    print(f"saved the {args.kind} drafter to {args.out} ({report['data']['num_traces']} traces, {report['steps']} steps, "
          f"{loss}{accuracy}{report['wall_time_s']:.0f} s)")
    return 0
