"""Build the whole zoo model ``shapes-image-ar`` in one command: VQ, judge, AR target, drafter.

    python -m mmspec.image_ar.recipes.build_shapes_image_ar                         # 40 min of training, one thread
    python -m mmspec.image_ar.recipes.build_shapes_image_ar --max-minutes-total 60   # longer, same split
    python -m mmspec.image_ar.recipes.build_shapes_image_ar --redo target           # redo target + drafter
    python -m mmspec.image_ar.recipes.build_shapes_image_ar --smoke --out /tmp/x    # seconds, tiny settings

Every script writes to ``--out`` (default ``./shapes-image-ar``); only ``--into-zoo`` writes into the
installed package, replacing the shipped model.

Steps, in dependency order (each one a script of its own, see its docstring):

    vq       train_shapes_vq        -> OUT/vq/        the tokenizer (every later step depends on it)
    judge    train_shapes_judge     -> OUT/judge/     trained on real images + VQ reconstructions
    target   train_shapes_image_ar  -> OUT/           the AR target; samples scored by the judge
    drafter  train_shapes_drafter   -> OUT/drafter/   distilled from the target

A step whose output exists is skipped, unless it is named in ``--redo`` or an earlier step ran in
this build (its inputs changed, so everything after it is rebuilt). The training budget
``--max-minutes-total`` is split 8 : 3 : 20 : 5 between the steps; data preparation (encoding the
dataset with the VQ once) and evaluation come on top (a few minutes in all).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import time
from pathlib import Path
from typing import Callable

from mmspec.training import add_output_arguments

from . import image_ar_data as data
from . import train_shapes_drafter, train_shapes_image_ar, train_shapes_judge, train_shapes_vq

# name, entry point, output that marks it done, share of the training budget
STEPS: list[tuple[str, Callable, str, float]] = [
    ("vq", train_shapes_vq.main, "vq/model.safetensors", 8.0),
    ("judge", train_shapes_judge.main, "judge/model.safetensors", 3.0),
    ("target", train_shapes_image_ar.main, "model.safetensors", 20.0),
    ("drafter", train_shapes_drafter.main, "drafter/model.safetensors", 5.0),
]
SHARES_TOTAL = sum(share for *_, share in STEPS)
SHIPPED_TOTAL = 40.0  # the shipped build's budget (its card's rebuild command)

# Tiny settings that run every step end to end in seconds (a check of the plumbing, not a model).
SMOKE = {
    "vq": ["--steps", "3", "--eval-n", "48"],
    "judge": ["--steps", "3", "--eval-n", "48", "--recon-pool", "32"],
    "target": ["--steps", "3", "--train-n", "64", "--heldout-n", "24", "--sample-n", "24", "--eval-scales", "1,2"],
    "drafter": ["--steps", "3", "--train-n", "64", "--heldout-n", "24", "--agree-n", "16"],
}
MAX_BUNDLE_MB = 15.0


def build(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    redo = {s.strip() for s in args.redo.split(",") if s.strip()}
    unknown = redo - {name for name, *_ in STEPS} - {"all"}
    if unknown:
        raise SystemExit(f"unknown step(s) in --redo: {sorted(unknown)}; steps are {[name for name, *_ in STEPS]}")
    start = time.time()
    rebuilt_upstream = False
    for name, entry, marker, share in STEPS:
        minutes = args.max_minutes_total * share / SHARES_TOTAL
        if (out / marker).is_file() and not rebuilt_upstream and name not in redo and "all" not in redo:
            print(f"== {name}: {out / marker} exists, skipped (--redo {name} to rebuild)", flush=True)
            continue
        argv = ["--out", str(out), "--seed", str(args.seed), "--threads", str(args.threads),
                "--max-minutes", f"{minutes:.2f}"] + (["--into-zoo"] if args.into_zoo else [])
        if args.cache_dir and name in ("target", "drafter"):
            argv += ["--cache-dir", args.cache_dir]
        if args.smoke:
            argv += SMOKE[name]
        print(f"== {name}: {entry.__module__} {' '.join(argv)}", flush=True)
        entry(argv)
        rebuilt_upstream = True
    card = json.loads((out / "zoo_card.json").read_text())
    size_mb = data.folder_size(out) / 1e6
    summary = {
        "folder": str(out),
        "total_size_mb": round(size_mb, 2),
        "train_wall_time_total_s": card.get("train_wall_time_total_s"),
        "build_wall_time_s": round(time.time() - start, 1),
        "target": card.get("quality", {}),
        **{name: card.get("components", {}).get(name, {}).get("quality", {}) for name in ("vq", "judge", "drafter")},
    }
    print(json.dumps(summary, indent=1), flush=True)
    if size_mb > MAX_BUNDLE_MB:
        print(f"warning: the folder holds {size_mb:.1f} MB, over the {MAX_BUNDLE_MB:.0f} MB aimed for", flush=True)
    return summary


def build_parser() -> argparse.ArgumentParser:
    """The build's options; the defaults are the card's rebuild command (40 minutes, one thread)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_arguments(parser, data.NAME, "the model folder (target, vq/, judge/, drafter/)")
    parser.add_argument("--max-minutes-total", type=float, default=SHIPPED_TOTAL,
                        help="training budget of all steps together (split 8:3:20:5)")
    parser.add_argument("--redo", default="", help="comma-separated steps to rebuild even if present (or 'all')")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", default=None, help="cache of encoded codes (default ~/.cache/mmspec/shapes-image-ar)")
    parser.add_argument("--smoke", action="store_true", help="tiny settings: checks the plumbing in seconds")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    return build(data.parse_recipe_args(parser, argv))


if __name__ == "__main__":
    main()
