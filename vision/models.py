"""The vision-language targets mmspec supports, and where their visual tokens sit.

Tested classes (transformers 5.x): `LlavaForConditionalGeneration`,
`LlavaOnevisionForConditionalGeneration`, `LlavaNextVideoForConditionalGeneration` and
`Qwen2VLForConditionalGeneration`. In all four, the processor expands each image or video into
a run of placeholder tokens in `input_ids`, and the model writes the visual features into the
embeddings at exactly those positions; Qwen2-VL also brackets each run with vision start/end
markers (plain text-like tokens that carry no features).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, PreTrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from ..devices import input_device
from ..errors import MMSpecError, first_line
from ..loading import from_pretrained_complete

SUPPORTED_ARCHITECTURES = (
    "LlavaForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration",
    "LlavaNextVideoForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
)

# Config attributes naming tokens whose embeddings are replaced by visual features.
# Llava-family configs spell them `*_token_index` (with `*_token_id` aliases); Qwen2-VL spells `*_token_id`.
IMAGE_TOKEN_ATTRIBUTES = ("image_token_id", "image_token_index")
VIDEO_TOKEN_ATTRIBUTES = ("video_token_id", "video_token_index")
# Markers around a visual run: text-like tokens, but meaningless to a drafter that never sees the image.
MARKER_TOKEN_ATTRIBUTES = ("vision_start_token_id", "vision_end_token_id")

# Values of Qwen2-VL's `mm_token_type_ids`, as its processor writes them.
TEXT_TYPE, IMAGE_TYPE, VIDEO_TYPE = 0, 1, 2


def _config(model_or_config: PreTrainedModel | PreTrainedConfig) -> PreTrainedConfig:
    return model_or_config.config if isinstance(model_or_config, PreTrainedModel) else model_or_config


def _token_ids(config: PreTrainedConfig, attributes: tuple[str, ...]) -> set[int]:
    found = set()
    for name in attributes:
        value = getattr(config, name, None)
        if isinstance(value, int) and value >= 0:
            found.add(value)
    return found


def image_token_ids(model: PreTrainedModel | PreTrainedConfig) -> set[int]:
    """Ids of the image placeholder token(s) (usually one id)."""
    return _token_ids(_config(model), IMAGE_TOKEN_ATTRIBUTES)


def video_token_ids(model: PreTrainedModel | PreTrainedConfig) -> set[int]:
    """Ids of the video placeholder token(s); empty for image-only models such as LLaVA-1.5."""
    return _token_ids(_config(model), VIDEO_TOKEN_ATTRIBUTES)


def feature_token_ids(model: PreTrainedModel | PreTrainedConfig) -> set[int]:
    """Ids of the placeholder tokens whose embeddings the model replaces with visual features."""
    ids = image_token_ids(model) | video_token_ids(model)
    if not ids:
        raise MMSpecError(
            f"{type(model).__name__} names no image or video token in its config (looked for "
            f"{', '.join(IMAGE_TOKEN_ATTRIBUTES + VIDEO_TOKEN_ATTRIBUTES)}); is it a vision-language model?"
        )
    return ids


def visual_token_ids(model: PreTrainedModel | PreTrainedConfig) -> set[int]:
    """Every token id that only makes sense next to visual input: placeholders and start/end markers.

    This is the set a text-only drafter removes from what it reads.
    """
    return feature_token_ids(model) | _token_ids(_config(model), MARKER_TOKEN_ATTRIBUTES)


def visual_mask(model: PreTrainedModel | PreTrainedConfig, input_ids: torch.Tensor, include_markers: bool = False) -> torch.Tensor:
    """Boolean mask, shaped like `input_ids`, of the positions holding visual features.

    With `include_markers`, Qwen2-VL's vision start/end tokens count as visual too.
    """
    ids = visual_token_ids(model) if include_markers else feature_token_ids(model)
    return torch.isin(input_ids, torch.tensor(sorted(ids), dtype=input_ids.dtype, device=input_ids.device))


def visual_positions(model: PreTrainedModel | PreTrainedConfig, input_ids: torch.Tensor, include_markers: bool = False) -> torch.LongTensor:
    """Indices (ascending, 1-D) of the visual tokens in one expanded prompt, given as [L] or [1, L].

    These are also the positions of the visual entries in the target's KV cache after prefill.
    """
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise MMSpecError(f"visual_positions takes one sequence, got a batch of {input_ids.shape[0]}")
        input_ids = input_ids[0]
    if input_ids.dim() != 1:
        raise MMSpecError(f"input_ids must be [L] or [1, L], got shape {tuple(input_ids.shape)}")
    return visual_mask(model, input_ids, include_markers).nonzero().flatten()


def modality_token_types(model: PreTrainedModel | PreTrainedConfig, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token modality (0 text, 1 image, 2 video), the `mm_token_type_ids` Qwen2-VL's processor returns.

    transformers 5.x Qwen2-VL refuses image/video grids without it (it places M-RoPE positions by it).
    """
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    for ids, value in ((image_token_ids(model), IMAGE_TYPE), (video_token_ids(model), VIDEO_TYPE)):
        if ids:
            types[torch.isin(input_ids, torch.tensor(sorted(ids), device=input_ids.device))] = value
    return types


def inputs_on_model(model: PreTrainedModel, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Model inputs (a processor's output) on the model's input device, floating tensors (pixels) in its dtype.

    Token ids, grids and masks keep their integer dtypes; anything that is not a tensor is kept as is.
    """
    device, dtype = input_device(model), model.dtype
    moved = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device, dtype) if value.is_floating_point() else value.to(device)
        moved[name] = value
    return moved


def load_vision_model(
    name_or_path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device | None = None, **kwargs: Any
) -> PreTrainedModel:
    """Load a vision-language model (Hub id or local folder) with `AutoModelForImageTextToText`.

    Any loading failure (missing folder, unknown id, a checkpoint that is not an image-text-to-text
    model, missing weights) becomes one `MMSpecError`. Extra keyword arguments go to `from_pretrained`
    (e.g. `device_map`, `max_memory`, `offload_folder` for a model spread by accelerate: then leave `device` unset).
    """
    where = str(Path(name_or_path).expanduser()) if str(name_or_path).startswith("~") else str(name_or_path)
    if _looks_like_local_path(where) and not Path(where).is_dir():
        raise MMSpecError(f"model folder not found: {where!r}")
    try:
        config = AutoConfig.from_pretrained(where, **_config_kwargs(kwargs))
    except Exception as err:  # OSError (not found / offline), ValueError (bad config.json), ...
        raise MMSpecError(f"could not load a vision-language model from {where!r}: {first_line(err)}") from err
    if config.model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise MMSpecError(
            f"{where!r} holds a {config.model_type!r} model, not a vision-language (image-text-to-text) model; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        model = from_pretrained_complete(AutoModelForImageTextToText, where, "vision-language model", dtype=dtype, **kwargs)
    except MMSpecError:
        raise
    except Exception as err:  # missing or mismatched weights, unsupported options, ...
        raise MMSpecError(f"could not load a vision-language model from {where!r}: {first_line(err)}") from err
    if device is not None:
        model = model.to(device)
    feature_token_ids(model)  # fail now, clearly, if the model has no visual placeholder tokens
    return model.eval()


def _looks_like_local_path(name: str) -> bool:
    """Hub ids are `name` or `owner/name`; anything else (absolute, ./, ~, deeper) is a folder."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).exists()


def _config_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    # Only the options that tell AutoConfig where and how to look.
    names = ("revision", "cache_dir", "local_files_only", "token", "trust_remote_code", "subfolder")
    return {k: v for k, v in kwargs.items() if k in names}
