"""Decoded pixel tensors -> numpy / PIL images, and a labelled grid of samples."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from mmspec.errors import MMSpecError

OUTPUT_TYPES = ("pil", "np")


def to_numpy(pixels: torch.Tensor) -> np.ndarray:
    """VQ decoder output [B, 3, H, W] in about [-1, 1] -> float32 [B, H, W, 3] in [0, 1] (diffusers' "np")."""
    return ((pixels.detach().float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).cpu().numpy()


def to_pil(pixels: torch.Tensor) -> list[Image.Image]:
    return [Image.fromarray(np.round(a * 255).astype(np.uint8)) for a in to_numpy(pixels)]


def convert(pixels: torch.Tensor, output_type: str) -> list[Image.Image] | np.ndarray:
    if output_type == "pil":
        return to_pil(pixels)
    if output_type == "np":
        return to_numpy(pixels)
    raise MMSpecError(f"output_type must be one of {', '.join(OUTPUT_TYPES)}, got {output_type!r}")


def image_grid(rows: list[tuple[str, list[Image.Image]]], cell: int = 64, label_width: int = 180) -> Image.Image:
    """One row per (label, images): the label on the left, the images scaled to `cell` pixels."""
    columns = max((len(images) for _, images in rows), default=0)
    grid = Image.new("RGB", (label_width + columns * (cell + 2), len(rows) * (cell + 2)), "white")
    draw = ImageDraw.Draw(grid)
    for r, (label, images) in enumerate(rows):
        top = r * (cell + 2)
        draw.text((4, top + cell // 2 - 6), label, fill="black")
        for c, image in enumerate(images):
            grid.paste(image.convert("RGB").resize((cell, cell), Image.NEAREST), (label_width + c * (cell + 2), top))
    return grid
