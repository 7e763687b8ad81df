"""The zoo models each tab offers, loaded once per process through the public pipeline classes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..zoo import entries

TASKS = {"caption": "video-captioning", "transcribe": "speech-recognition", "image": "class-conditional-image-generation"}


def zoo_models(tab: str) -> list[str]:
    """Names of the zoo models for a tab, by their card's task."""
    return [entry.name for entry in entries() if entry.card.get("task") == TASKS[tab]]


@functools.lru_cache(maxsize=None)
def caption_pipeline(name: str) -> Any:
    from .. import CaptionPipeline

    return CaptionPipeline.from_pretrained(name)


@functools.lru_cache(maxsize=None)
def transcription_pipeline(name: str) -> Any:
    from .. import TranscriptionPipeline

    return TranscriptionPipeline.from_pretrained(name)


@functools.lru_cache(maxsize=None)
def image_pipeline(name: str) -> Any:
    from .. import ImagePipeline

    return ImagePipeline.from_pretrained(name)


def sample_assets() -> Path | None:
    """The repository's `demos/assets` folder (sample video and audio), when running from a checkout."""
    folder = Path(__file__).resolve().parents[2] / "demos" / "assets"
    return folder if folder.is_dir() else None
