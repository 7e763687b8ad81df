"""What the training scripts of the zoo model ``shapes-var`` share: its layout, its parser and its card.

The folder is a saved `VARPipeline` (``model_index.json``), so ``VARPipeline.from_pretrained("shapes-var")``
and the CLI load it as any saved pipeline::

    shapes-var/
        model_index.json   VARPipeline: components vq, model, refiner
        vq/        the multi-scale residual VQ-VAE (VQVAE, official VAR names): 64x64 image <-> 16x16 latent
        model/     the large VAR (the CoDe drafter, and the model of method "ar")
        refiner/   the small VAR on the same VQ-VAE (the CoDe refiner, training-free mode)
        refiner-N/ the small VAR fine-tuned for draft_scales N (CoDe's specialised mode; train_shapes_var_code)
        classes.json, zoo_card.json

The images and classes are those of ``shapes-image-ar`` (:mod:`image_ar_data`: 24 classes, kind x
colour, 64 x 64 renders of the shapes world); the quality judge is that model's ``judge/``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mmspec.zoo import MODELS_DIR

from . import image_ar_data as data

NAME = "shapes-var"
ZOO_DIR = MODELS_DIR / NAME
PATCH_NUMS = (1, 2, 3, 4, 6, 8, 11, 16)  # 8 scales, L = 507 tokens; the last is the 16x16 latent of a 64x64 image
# CoDe's sampler filters every scale: top-k 600 of VAR's 4096 codes (the same share of 512: 75), top-p 0.95.
SAMPLER = {"top_k": 75, "top_p": 0.95}
DOWNSAMPLE = 4
CACHE_DIR = Path.home() / ".cache" / "mmspec" / NAME
REBUILD_COMMAND = "python -m mmspec.image_ar.recipes.build_shapes_var"


def recipe_parser(doc: str, what: str, *, max_minutes: float, batch_size: int, lr: float,
                  warmup: int) -> argparse.ArgumentParser:
    """The shapes-image-ar recipes' parser, writing to ./shapes-var (or the zoo's), one thread by default."""
    return data.recipe_parser(doc, what, max_minutes=max_minutes, batch_size=batch_size, lr=lr, warmup=warmup,
                              name=NAME, threads=1)


def parse_recipe_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    return data.parse_recipe_args(parser, argv, zoo_dir=ZOO_DIR)


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
    card = data.fill_card(out, section, info, top_level="pipeline", new_card=base_card)
    return data.write_card(out, card, [c.get("train_wall_time_s") for c in card.get("components", {}).values()])


def fine_tuned_refiners(out: Path) -> list[int]:
    """The draft_scales N whose fine-tuned refiner (OUT/refiner-N/, CoDe's specialised mode) is saved, largest first."""
    found = [p.parent.name.removeprefix("refiner-") for p in out.glob("refiner-*/config.json")]
    return sorted((int(n) for n in found if n.isdigit()), reverse=True)


def summary(out: Path) -> dict:
    """The card's top-level facts (what `mmspec zoo list` shows), gathered from its components' sections."""
    parts = json.loads((out / "zoo_card.json").read_text()).get("components", {})
    quality = {}
    if "judge_accuracy_reconstructions" in parts.get("vq", {}).get("quality", {}):
        quality["vq_reconstruction_class_accuracy"] = parts["vq"]["quality"]["judge_accuracy_reconstructions"]
    for role in ("model", "refiner"):
        for cfg, result in parts.get(role, {}).get("quality", {}).get("samples", {}).items():
            if isinstance(result, dict):
                quality[f"{role}_class_accuracy_{cfg}"] = result["class_accuracy"]
    walls = [p.get("train_wall_time_s") or 0 for p in parts.values()]
    tuned = sorted(name for name in parts if name.startswith("refiner-"))  # CoDe's fine-tuned refiners
    return {"params": sum(p.get("params", 0) for p in parts.values()),
            "role": "target (large VAR) + refiner (small VAR) + VQ-VAE"
                    + (f" + fine-tuned refiners ({', '.join(tuned)})" if tuned else ""),
            "trained_on": "; ".join(f"{name}: {p.get('trained_on', '?')}" for name, p in parts.items()),
            "quality": quality, "train_wall_time_s": round(sum(walls), 1)}
