"""What the training scripts of the zoo model ``shapes-var`` share: its layout, its parser and its card.

The folder is a saved `VARPipeline` (``model_index.json``), so ``VARPipeline.from_pretrained("shapes-var")``
and the CLI load it as any saved pipeline::

    shapes-var/
        model_index.json   VARPipeline: components vq, model, refiner
        vq/        the multi-scale residual VQ-VAE (VQVAE, official VAR names): 64x64 image <-> 16x16 latent
        model/     the large VAR (the CoDe drafter, and the model of method "ar")
        refiner/   the small VAR on the same VQ-VAE (the CoDe refiner)
        classes.json, zoo_card.json

The images and classes are those of ``shapes-image-ar`` (:mod:`image_ar_data`: 24 classes, kind x
colour, 64 x 64 renders of the shapes world); the quality judge is that model's ``judge/``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mmspec.training import add_output_arguments, parse_output_folder
from mmspec.zoo import MODELS_DIR

from . import image_ar_data as data

NAME = "shapes-var"
ZOO_DIR = MODELS_DIR / NAME
PATCH_NUMS = (1, 2, 3, 4, 6, 8, 11, 16)  # 8 scales, L = 507 tokens; the last is the 16x16 latent of a 64x64 image
DOWNSAMPLE = 4
CACHE_DIR = Path.home() / ".cache" / "mmspec" / NAME
REBUILD_COMMAND = "python -m mmspec.image_ar.recipes.build_shapes_var"


def recipe_parser(doc: str, what: str, *, max_minutes: float, batch_size: int, lr: float,
                  warmup: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_output_arguments(parser, NAME, what)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=max_minutes, help="wall-clock budget of the training loop")
    parser.add_argument("--steps", type=int, default=0, help="0 = as many as fit the budget")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                        help="train in fp32 (bf16 autocast is the default where the CPU supports it)")
    return parser


def parse_recipe_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    args.out = str(parse_output_folder(parser, args, ZOO_DIR))
    return args


def base_card() -> dict[str, Any]:
    return {
        "name": NAME,
        "task": "class-conditional-next-scale-image-generation",  # not the LlamaGen demo tab: other methods
        "architecture": "VAR (next-scale prediction, FoundationVision/VAR parameter names)",
        "pipeline": "mmspec.image_ar.VARPipeline",
        "default_method": "code",
        "image_size": data.IMAGE_SIZE,
        "patch_nums": list(PATCH_NUMS),
        "num_classes": data.NUM_CLASSES,
        "classes": data.label_names(),
        "judge": "shapes-image-ar/judge (timm classifier of the 24 classes)",
        "layout": {
            "model_index.json": "a saved mmspec.image_ar.VARPipeline (diffusers layout)",
            "vq": "mmspec.image_ar.VQVAE, multi-scale residual VQ-VAE, downsample 4: 64x64 image <-> 16x16 latent",
            "model": "the large VAR: method 'ar' alone, the drafter of 'code'",
            "refiner": "the small VAR: the refiner of 'code' (the last scales)",
            "classes.json": "class names in id order",
        },
        "rebuild_command": REBUILD_COMMAND,
        "components": {},
    }


def update_card(out: Path, section: str, info: dict[str, Any]) -> dict[str, Any]:
    """Fill `components[section]` (or the top level for "pipeline") of OUT/zoo_card.json and write classes.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    card_file = out / "zoo_card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else base_card()
    if section == "pipeline":
        card.update(info)
    else:
        card.setdefault("components", {})[section] = info
    (out / "classes.json").write_text(json.dumps(data.label_names(), indent=1) + "\n")
    card["total_size_bytes"] = data.folder_size(out)
    walls = [c.get("train_wall_time_s") for c in card.get("components", {}).values()]
    card["train_wall_time_total_s"] = round(sum(w for w in walls if w), 1)
    card_file.write_text(json.dumps(card, indent=2) + "\n")
    return card
