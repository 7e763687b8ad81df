"""`generate-image --num-iter N` beyond a MAR model's token count, refused before torch is imported: the token count
((img_size // vae_stride // patch_size) ** 2, as `mmspec.image_ar.mar.MAR` computes it) is read from the model's
config.json; the pipeline's own check still runs. A config that leaves a size to the class's defaults is left to it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MMSpecError

SIZES = ("img_size", "vae_stride", "patch_size")


def check_num_iter(name: str, num_iter: int | None) -> None:
    """MMSpecError (the pipeline's message) if `num_iter` steps exceed the MAR model `name`'s token count."""
    if num_iter is None:
        return
    seq_len = mar_token_count(name)
    if seq_len is not None and not 1 <= num_iter <= seq_len:
        raise MMSpecError(f"num_iter must be an integer in 1..{seq_len} (the token count), got {num_iter!r}")


def mar_token_count(name: str) -> int | None:
    """The tokens of a saved MAR pipeline's model (zoo name or folder), from model/config.json; None when only
    loading can tell."""
    from ..zoo import entries

    folder = next((entry.path for entry in entries() if entry.name == name), None) or Path(name).expanduser()
    try:
        config = json.loads((folder / "model" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sizes = [config.get(key) for key in SIZES] if isinstance(config, dict) else []
    if len(sizes) != len(SIZES) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return None
    img_size, vae_stride, patch_size = sizes
    if img_size % (vae_stride * patch_size):  # the model refuses this config when it loads
        return None
    return (img_size // vae_stride // patch_size) ** 2
