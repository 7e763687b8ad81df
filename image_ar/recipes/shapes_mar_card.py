"""The zoo card of ``shapes-mar``: each part's training facts and its quality by the zoo's judge.

Quality: the KL autoencoder's held-out PSNR and the judge's class accuracy on its reconstructions (the
ceiling of any MAR on it); the target and the draft MAR's judge accuracy on `ar` samples (classes
i mod 24, batches of 16, a seeded CPU generator) at each guidance scale asked for. The pipeline's
default cfg is the target's best of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from mmspec.image_ar.judge import load_judge

from . import image_ar_data as data

JUDGE = "shapes-image-ar"
REBUILD_COMMAND = ("python -m mmspec.image_ar.recipes.train_toy_mar --stage all --vae-minutes 12 --max-minutes 55 "
                   "--draft-minutes 15 --lr 5e-4 --warmup 100")


@torch.no_grad()
def vae_quality(vae: Any, n: int, seed: int) -> dict[str, float]:
    """Held-out PSNR of the autoencoder (posterior mean) and the judge's accuracy on real vs reconstructed images."""
    held = data.images(n, seed, "heldout")
    real = data.to_model_range(held.images)
    recon = torch.cat([vae.decode(vae.encode(real[i : i + 64].to(vae.dtype)).latent_dist.mean).sample.float()
                       for i in range(0, n, 64)]).clamp(-1, 1)
    mse = (recon - real).pow(2).mean().item()
    judge = load_judge(JUDGE)
    return {"heldout_images": n, "heldout_psnr_db": round(10 * torch.log10(torch.tensor(4.0 / mse)).item(), 2),
            "judge_accuracy_real": round(judge.class_accuracy(real, held.labels), 4),
            "judge_accuracy_reconstructions": round(judge.class_accuracy(recon, held.labels), 4)}


def sample_quality(pipe: Any, n: int, cfgs: Sequence[float], seed: int, batch_size: int = 16) -> dict[str, Any]:
    """The judge's class accuracy on n `ar` samples of `pipe` per guidance scale."""
    judge = load_judge(JUDGE)
    labels = [i % data.NUM_CLASSES for i in range(n)]
    results: dict[str, Any] = {"images_per_cfg": n, "method": "ar", "num_iter": pipe.settings_for(
        "ar", None, None, None, 1.0, 1.0, 1.0)["num_iter"]}
    for cfg in cfgs:
        start, images = time.perf_counter(), []
        for first in range(0, n, batch_size):
            out = pipe(labels[first : first + batch_size], method="ar", guidance_scale=cfg,
                       generator=torch.Generator().manual_seed(seed + first), progress_bar=False)
            images += list(out.images)
        results[f"cfg_{cfg:g}"] = {"class_accuracy": round(judge.class_accuracy(images, labels), 4),
                                   "sampling_seconds": round(time.perf_counter() - start, 1)}
    return results


def best_cfg(quality: dict[str, Any]) -> float:
    scored = [(v["class_accuracy"], float(k[4:])) for k, v in quality.items() if k.startswith("cfg_")]
    return max(scored)[1] if scored else 1.0


def part_facts(folder: Path) -> dict[str, Any]:
    """training.json of a part, with its config, parameter count and file size."""
    facts = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {"config": {k: v for k, v in config.items() if not k.startswith("_")}, **facts, "file_size_bytes": weights,
            "dtype": "float16", "train_machine": f"{torch.get_num_threads()} CPU threads"}


def headline_quality(components: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What `mmspec zoo list` shows: the VAE's PSNR and reconstruction accuracy, each MAR's sample accuracy per cfg."""
    vae = components.get("vae", {}).get("quality", {})
    quality = {f"vae_{key}": vae[key] for key in ("heldout_psnr_db", "judge_accuracy_reconstructions") if key in vae}
    for name in ("model", "draft"):
        for key, value in components.get(name, {}).get("quality", {}).items():
            if key.startswith("cfg_"):
                quality[f"{name}_class_accuracy_{key}"] = value["class_accuracy"]
    return quality


def part_walls(part: dict[str, Any]) -> list[float]:
    """Training seconds of a part, its earlier runs (--init-from) included."""
    walls = []
    while part:
        walls.append(part.get("train_wall_time_s") or 0)
        part = part.get("earlier_training") or {}
    return walls


def write_card(out: Path, components: dict[str, dict[str, Any]], pipeline_defaults: dict[str, Any]) -> dict[str, Any]:
    card = {
        "name": "shapes-mar",
        "task": "class-conditional-image-generation (continuous tokens)",
        "architecture": "MAR (masked autoregressive, DiffLoss head; LTH14/mar parameter names)",
        "pipeline": "mmspec.image_ar.MARPipeline",
        "default_method": "cspd",
        "image_size": data.IMAGE_SIZE,
        "num_classes": data.NUM_CLASSES,
        "classes": data.label_names(),
        "judge": f"{JUDGE}/judge (timm classifier of the 24 classes)",
        "layout": {
            "model_index.json": "a saved mmspec.image_ar.MARPipeline (diffusers layout)",
            "vae": "diffusers AutoencoderKL: 64x64 image <-> 4x16x16 latents (scaling_factor = 1 / latent std)",
            "model": "the target MAR: method 'ar' alone, the verifier of 'cspd'",
            "draft": "the draft MAR of 'cspd' (same tokens and head steps, shares the diffusion noise)",
        },
        "trained_on": "class-conditional 64x64 renders of the shapes world (mmspec.image_ar.recipes.image_ar_data), "
                      "one still shape per image, class = kind x colour",
        "rebuild_command": REBUILD_COMMAND,
        "role": "target MAR + draft MAR + KL autoencoder",
        "pipeline_defaults": pipeline_defaults,
        "components": components,
        "params": sum(c.get("parameters", 0) for c in components.values()),
        "quality": headline_quality(components),
        "limitations": [
            "a toy: 64x64 images of one flat-coloured shape on a flat background, 24 classes",
            "trained for about an hour on 2 CPU cores: samples are coloured blobs, often several per image, "
            "mostly of the right colour and of a kind no better than chance",
            "cspd at inner_temperature 1 (the paper's ratio) keeps almost none of its drafts (the last-step Gaussians "
            "of two different heads barely overlap): its output is the target's on a schedule where a verified window "
            "is one step, which the target alone samples faster (the bench's 'ar N steps' row; see BENCHMARKS.md)",
        ],
    }
    walls = [wall for c in components.values() for wall in part_walls(c)]
    card["train_wall_time_s"] = round(sum(walls), 1)
    card["total_size_bytes"] = data.folder_size(out)
    (out / "zoo_card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card
