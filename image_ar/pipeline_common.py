"""What both image pipelines share: their output, checkpoint loading and folder resolution.

Kept apart from the pipelines so that the class-conditional pipeline (which hands Janus folders to
the Janus pipeline) and the Janus pipeline both import it, and not each other.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from mmspec.errors import MMSpecError
from mmspec.pipelines import ImagePipelineOutput, RoundReporter
from mmspec.zoo import resolve


@dataclass
class ImageGenerationOutput(ImagePipelineOutput):
    """Images (PIL list or float array [N, H, W, 3] in [0, 1]), their token grids and how they were made.

    A diffusers `BaseOutput` (mmspec's `ImagePipelineOutput`): `out.images`, `out["images"]` and
    `out[0]` are the images. images, method, model, stats: see `ImagePipelineOutput`; tokens: the
    token grids [N, H, W]; class_labels: the class id of each image (empty for a text-to-image model);
    prompts: the text prompt of each image (text-to-image models only); settings: the options the
    method ran with, as resolved from the call, the model card and the defaults (`MethodConfig.settings()`).
    """

    tokens: torch.LongTensor
    class_labels: list[int]
    prompts: list[str] | None = None
    settings: dict[str, Any] | None = None


def per_image_rounds(reporter: RoundReporter, tokens_per_image: int) -> Callable[[torch.Tensor, int, int, torch.Tensor], None]:
    """The core loop's `on_round` hook for a call that makes several images one after the other: each
    round is reported with `chunk` = the image's index in the call (and `position` = where in its grid)."""

    def on_round(tokens: torch.Tensor, drafted: int, accepted: int, proposed: torch.Tensor) -> None:
        reporter.chunk = reporter.new_tokens // tokens_per_image
        reporter(tokens, drafted, accepted, proposed)

    return on_round


def load_model(cls: type, path: str, what: str, subfolder: str = "", dtype: torch.dtype = torch.float32, **kwargs: Any):
    try:
        return cls.from_pretrained(path, subfolder=subfolder, dtype=dtype, **kwargs).eval()
    except (OSError, ValueError, KeyError) as error:
        where = f"{path}/{subfolder}" if subfolder else path
        raise MMSpecError(f"cannot load the {what} from {where!r}: {str(error).splitlines()[0]}") from None


def check_guidance_scale(scale: float) -> float:
    """Classifier-free guidance scale: a finite number >= 1 (1 = no guidance, as in transformers)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 1:
        raise MMSpecError(f"guidance_scale must be a finite number >= 1 (1 = no guidance), got {scale!r}")
    return float(scale)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise MMSpecError(f"cannot read {path}: {error}") from None


def local_folder(name: str) -> Path:
    """A zoo name, a local folder, or a Hub repo id (downloaded, or from the cache when offline) -> a folder."""
    folder = Path(resolve(name))
    if not folder.is_dir() and name.count("/") == 1 and not name.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name))
        except Exception:  # noqa: BLE001 - offline, unknown repo, no access: all mean "not available"
            pass
    if not (folder / "config.json").is_file():
        raise MMSpecError(f"{name!r} is not a zoo model, a folder with a config.json (a LlamaGen or Janus checkpoint), "
                          "or a Hub id available here")
    return folder
