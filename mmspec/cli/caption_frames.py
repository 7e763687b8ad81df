"""`caption VIDEO --frames N` with more frames than the model has positions, refused before torch is imported: the
model's position budget (its text config's max_position_embeddings) and whether it reads videos (a video token id)
are read from its config.json, as the pipeline's own check reads them from the loaded config; that check still runs.
A config that leaves either to transformers' defaults is left to it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MMSpecError

DEFAULT_CAPTIONER = "shapes-video-captioner"  # mmspec.vision.pipeline.DEFAULT_CAPTIONER
VIDEO_TOKEN_ATTRIBUTES = ("video_token_id", "video_token_index")  # mmspec.vision.models.VIDEO_TOKEN_ATTRIBUTES


def check_frames(model: str | None, num_frames: int | None) -> None:
    """MMSpecError (the pipeline's message) if `num_frames` frames of a video cannot fit in `model`'s positions."""
    if num_frames is None:
        return
    name = model or DEFAULT_CAPTIONER
    context = position_budget(name)
    if context is not None and num_frames >= context:  # every frame takes at least one position
        raise MMSpecError(f"{num_frames} frames cannot fit: {name} holds {context} positions in all "
                          "(prompt, visual tokens and caption); use fewer frames")


def position_budget(name: str) -> int | None:
    """The positions a video model holds, from its config.json; None when only loading can tell."""
    from ..zoo import entries

    folder = next((entry.path for entry in entries() if entry.name == name), None) or Path(name).expanduser()
    if (folder / "model_index.json").is_file():  # a saved pipeline: the model is a component
        folder = folder / "model"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not any(isinstance(config.get(key), int) and not isinstance(config.get(key), bool)
                                               and config[key] >= 0 for key in VIDEO_TOKEN_ATTRIBUTES):
        return None
    text_config = config.get("text_config")
    context = text_config.get("max_position_embeddings") if isinstance(text_config, dict) else None
    return context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None
