"""Vision-language targets (LLaVA, LLaVA-OneVision, LLaVA-NeXT-Video, Qwen2-VL) and their drafters."""

from .feature_methods import FEATURE_KINDS, load_feature_drafter
from .inputs import load_image, load_video
from .media_writer import write_test_video, write_video
from .models import (
    SUPPORTED_ARCHITECTURES,
    feature_token_ids,
    load_vision_model,
    modality_token_types,
    visual_mask,
    visual_positions,
    visual_token_ids,
)
from .target import VisionTarget
from .text_drafter import TextOnlyDrafter

__all__ = [
    "FEATURE_KINDS",
    "SUPPORTED_ARCHITECTURES",
    "TextOnlyDrafter",
    "VisionTarget",
    "feature_token_ids",
    "load_feature_drafter",
    "load_image",
    "load_video",
    "load_vision_model",
    "modality_token_types",
    "visual_mask",
    "visual_positions",
    "visual_token_ids",
    "write_test_video",
    "write_video",
]
