"""Tiny random vision-language models of the four supported classes, with hand-built inputs.

Each builder returns the model (saved and reloaded through `from_pretrained`) and a function
making a prompt: `input_ids` with the right number of expanded placeholder tokens, plus pixel
tensors of the shape the model's own processor would produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextVideoConfig,
    LlavaNextVideoForConditionalGeneration,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    PreTrainedModel,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    SiglipVisionConfig,
)

from mmspec.testing import reload_from_disk, tiny_llama

VOCAB = 200
IMAGE, VIDEO, VISION_START, VISION_END = 190, 191, 192, 193
BOS, EOS = 1, 3
# A big initializer range makes the random LM's greedy choices vary from token to token.
INIT = 0.3
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=INIT,
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=0,
)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=14)


@dataclass
class Case:
    """One model and a prompt for it: `inputs` go to both `generate` and `speculative_generate`."""

    name: str
    model: PreTrainedModel
    input_ids: torch.LongTensor
    inputs: dict[str, torch.Tensor]


def text_ids(*chunks: list[int]) -> torch.LongTensor:
    return torch.tensor([sum(chunks, [])])


def llava(seed: int = 0) -> Case:
    """LLaVA-1.5 shape: CLIP tower (28 px, patch 14: 4 patches, CLS dropped) -> 4 image tokens."""
    torch.manual_seed(seed)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(image_size=28, projection_dim=32, **VISION),
        text_config=LlamaConfig(**TEXT),
        image_token_index=IMAGE,
        image_seq_length=4,
        initializer_range=INIT,
    )
    model = reload_from_disk(LlavaForConditionalGeneration(config))
    ids = text_ids([BOS, 11, 12], [IMAGE] * 4, [13, 14, 15, 11, 12])
    return Case("llava-image", model, ids, {"pixel_values": torch.randn(1, 3, 28, 28)})


def onevision(seed: int = 0, frames: int = 4) -> Case:
    """LLaVA-OneVision video: SigLIP (56 px: 4x4 patches) pooled to 2x2 per frame, + 1 newline token."""
    torch.manual_seed(seed)
    config = LlavaOnevisionConfig(
        vision_config=SiglipVisionConfig(image_size=56, vision_use_head=False, **VISION),
        text_config=Qwen2Config(**TEXT),
        image_token_index=IMAGE,
        video_token_index=VIDEO,
        initializer_range=INIT,
    )
    model = reload_from_disk(LlavaOnevisionForConditionalGeneration(config))
    ids = text_ids([BOS, 21, 22], [VIDEO] * (frames * 4 + 1), [23, 24, 21, 22])
    return Case("onevision-video", model, ids, {"pixel_values_videos": torch.randn(1, frames, 3, 56, 56)})


def next_video(seed: int = 0, frames: int = 4) -> Case:
    """LLaVA-NeXT-Video: CLIP (56 px: 4x4 patches) average-pooled by 2 -> 4 tokens per frame."""
    torch.manual_seed(seed)
    config = LlavaNextVideoConfig(
        vision_config=CLIPVisionConfig(image_size=56, projection_dim=32, **VISION),
        text_config=LlamaConfig(**TEXT),
        image_token_index=IMAGE,
        video_token_index=VIDEO,
        video_seq_length=frames * 4,
        image_seq_length=16,
        initializer_range=INIT,
    )
    model = reload_from_disk(LlavaNextVideoForConditionalGeneration(config))
    ids = text_ids([BOS, 31, 32], [VIDEO] * (frames * 4), [33, 34, 31, 32])
    return Case("nextvideo-video", model, ids, {"pixel_values_videos": torch.randn(1, frames, 3, 56, 56)})


def qwen2_vl_model(seed: int = 0) -> PreTrainedModel:
    torch.manual_seed(seed)
    text = dict(TEXT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    config = Qwen2VLConfig(
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, initializer_range=INIT),
        text_config=text,
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    return reload_from_disk(Qwen2VLForConditionalGeneration(config))


def qwen2_vl_image(seed: int = 0, model: PreTrainedModel | None = None) -> Case:
    """Qwen2-VL image: 56 px -> grid (1, 4, 4) of 14 px patches, merged 2x2 -> 4 image tokens."""
    model = model or qwen2_vl_model(seed)
    ids = text_ids([BOS, 41, 42, VISION_START], [IMAGE] * 4, [VISION_END, 43, 44, 41, 42])
    grid = torch.tensor([[1, 4, 4]])
    pixels = torch.randn(16, 3 * 2 * 14 * 14)  # one row per patch: channels x temporal x 14 x 14
    inputs = {"pixel_values": pixels, "image_grid_thw": grid, "mm_token_type_ids": (ids == IMAGE).int()}
    return Case("qwen2vl-image", model, ids, inputs)


def qwen2_vl_video(seed: int = 0, model: PreTrainedModel | None = None) -> Case:
    """Qwen2-VL video: 4 frames of 56 px -> grid (2, 4, 4) (2 frames per temporal patch) -> 8 tokens."""
    model = model or qwen2_vl_model(seed)
    ids = text_ids([BOS, 51, 52, VISION_START], [VIDEO] * 8, [VISION_END, 53, 54, 51, 52])
    grid = torch.tensor([[2, 4, 4]])
    pixels = torch.randn(32, 3 * 2 * 14 * 14)
    inputs = {"pixel_values_videos": pixels, "video_grid_thw": grid, "mm_token_type_ids": 2 * (ids == VIDEO).int()}
    return Case("qwen2vl-video", model, ids, inputs)


def text_drafter_lm() -> PreTrainedModel:
    """A small random text-only LM with the VLMs' vocabulary: the TextOnlyDrafter's model."""
    return tiny_llama(vocab_size=VOCAB, num_layers=1, hidden_size=32, seed=1)


BUILDERS: dict[str, Callable[[], Case]] = {
    "llava-image": llava,
    "onevision-video": onevision,
    "nextvideo-video": next_video,
    "qwen2vl-image": qwen2_vl_image,
    "qwen2vl-video": qwen2_vl_video,
}


def all_cases() -> dict[str, Case]:
    """Every case in BUILDERS, the two Qwen2-VL cases sharing one model."""
    cases = {name: build() for name, build in BUILDERS.items() if not name.startswith("qwen2vl")}
    qwen = qwen2_vl_model()
    cases["qwen2vl-image"] = qwen2_vl_image(model=qwen)
    cases["qwen2vl-video"] = qwen2_vl_video(model=qwen)
    return cases
