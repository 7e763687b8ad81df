"""Whether `--batch-size` images of a VAR or MAR model fit in memory, checked before any image is made.

The estimate counts what one image holds at the peak of a call, for its guided and unguided rows: the keys
and values of every layer, one layer's activations and attention scores over the longest step, and the
image decoder's full-resolution feature maps. It errs high; a batch whose estimate passes half the free
memory is refused with the largest batch size that stays under it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import MMSpecError

FLOAT = 4  # bytes: the toy models run in float32
GUIDED_ROWS = 2  # classifier-free guidance runs each image twice
DECODER_MAPS = 8  # full-resolution feature maps the image decoder holds at once


def bytes_per_image(pipe: Any) -> int | None:
    """Peak bytes one image of a call takes (None: a model family this does not know)."""
    config = pipe.model.config
    if getattr(pipe, "family", None) == "var":
        scales = [int(p) for p in config.patch_nums]
        tokens, step = sum(p * p for p in scales), scales[-1] ** 2
        depth, width, heads = int(config.depth), int(config.embed_dim), int(config.num_heads)
        mlp, side = float(config.mlp_ratio), scales[-1] * 2 ** (len(pipe.vq.config.ch_mult) - 1)
        channels = int(pipe.vq.config.ch)
    elif getattr(pipe, "family", None) == "mar":
        tokens = step = int(pipe.model.seq_len) + int(config.buffer_size)
        depth = int(config.encoder_depth) + int(config.decoder_depth)
        width = max(int(config.encoder_embed_dim), int(config.decoder_embed_dim), int(config.diffloss_w))
        heads = max(int(config.encoder_num_heads), int(config.decoder_num_heads))
        mlp, side, channels = float(config.mlp_ratio) * int(config.diffusion_batch_mul), int(config.img_size), 128
    else:
        return None
    layers = depth * tokens * width * 2  # keys and values
    activations = step * width * int(4 + 2 * mlp)
    scores = heads * step * tokens * 3  # scores, softmax, its copy
    decoder = channels * side * side * DECODER_MAPS
    return FLOAT * (GUIDED_ROWS * (layers + activations + scores) + decoder)


def available_memory(device: Any = None) -> int | None:
    """Free bytes on `device` (a CUDA GPU), else free RAM (Linux MemAvailable); None when unknown."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_batch_fits(pipe: Any, batch_size: int, available: int | None = None, device: Any = None) -> None:
    """MMSpecError naming the batch size that fits when `batch_size` images would take over half the free memory."""
    per_image = bytes_per_image(pipe)
    available = available_memory(device) if available is None else available
    if per_image is None or available is None or batch_size * per_image <= available // 2:
        return
    fits = max(1, available // 2 // per_image)
    raise MMSpecError(f"--batch-size {batch_size}: each image takes about {per_image / 2**20:.0f} MiB at its peak, and "
                      f"{available / 2**30:.1f} GiB is free: use --batch-size {fits} or less")


def check_batch_fits_early(name: str, family: str | None, batch_size: int | None, device: Any = None) -> None:
    """`check_batch_fits` before torch is imported, with the model's settings read from its files
    (`settings_from_files`); nothing when they cannot be read so, or the device is a GPU (its free memory needs
    torch)."""
    if batch_size is None or (device is not None and str(device).startswith("cuda")):
        return
    settings = settings_from_files(name, family)
    if settings is not None:
        check_batch_fits(settings, batch_size, device=device)


def settings_from_files(name: str, family: str | None) -> Any:
    """What `bytes_per_image` reads of a pipeline (family, model.config, model.seq_len, vq.config), from a saved VAR
    or MAR pipeline's model/config.json and vq/config.json; None for another family, or when a setting is left to a
    class default or is not a number."""
    if family not in ("var", "mar"):
        return None
    from types import SimpleNamespace

    from ..zoo import entries
    from .mar_steps import mar_token_count

    folder = next((entry.path for entry in entries() if entry.name == name), None) or Path(name).expanduser()
    configs = {part: _json_object(folder / part / "config.json") for part in ("model", "vq")}
    if configs["model"] is None or (family == "var" and configs["vq"] is None):
        return None
    settings = SimpleNamespace(family=family, vq=SimpleNamespace(config=SimpleNamespace(**(configs["vq"] or {}))),
                               model=SimpleNamespace(config=SimpleNamespace(**configs["model"]),
                                                     seq_len=mar_token_count(name)))
    try:
        per_image = bytes_per_image(settings)
    except (AttributeError, TypeError, ValueError):  # a setting left to the class's default, or not a number
        return None
    return settings if per_image is not None and per_image > 0 else None


def _json_object(file: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and all(isinstance(key, str) and key.isidentifier() for key in value) else None
