"""The target's rotary positions for feature drafters: Qwen2-VL's 3-D M-RoPE, 1-D for everyone else.

Qwen2-VL places a visual token at (t, h, w) and text at one position on all three axes; text
after a visual block continues at the block's largest position + 1, i.e. at sequence index +
`rope_deltas`. A feature drafter reads the target's features, so it rotates them by the same
positions the target did: the 3-D table `get_rope_index` computes for the prompt, then sequence
index + `rope_deltas` on all three axes for every later (text) token.

Other targets return None here and their drafters keep 1-D sequence indices.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

from mmspec.errors import MMSpecError

from .models import modality_token_types

MROPE_MODEL_TYPES = ("qwen2_vl",)


def mrope_section(text_config: Any) -> list[int] | None:
    """The target's M-RoPE split of the rotary half-dimension into t/h/w parts, or None for 1-D RoPE."""
    rope = getattr(text_config, "rope_parameters", None) or {}
    section = rope.get("mrope_section") or getattr(text_config, "mrope_section", None)
    return [int(s) for s in section] if section else None


def rotary_embedding(layer_config: Any, section: list[int] | None) -> torch.nn.Module:
    """A drafter's rotary embedding: the target's M-RoPE one when `section` is set, Llama's otherwise.

    Both return (cos, sin) [B, L, D] for the decoder layer; M-RoPE takes position ids [3, B, L]
    (or [B, L], the same on every axis, which equals 1-D RoPE).
    """
    if section is None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        return LlamaRotaryEmbedding(layer_config)
    rotary = Qwen2VLRotaryEmbedding(layer_config)
    rotary.mrope_section = list(section)
    return rotary


def target_prompt_positions(
    model: PreTrainedModel, input_ids: torch.LongTensor, model_inputs: dict[str, Any]
) -> tuple[torch.LongTensor, torch.LongTensor] | None:
    """(position ids [3, B, L], rope deltas [B, 1]) the target gives the prompt `input_ids` [B, L], or None
    when the target has 1-D positions (not M-RoPE, or no visual grid in the inputs)."""
    if getattr(model.config, "model_type", "") not in MROPE_MODEL_TYPES:
        return None
    image_grid, video_grid = model_inputs.get("image_grid_thw"), model_inputs.get("video_grid_thw")
    if image_grid is None and video_grid is None:
        return None  # text only: Qwen2-VL itself uses sequence indices on all axes
    types = model_inputs.get("mm_token_type_ids")
    if types is None:
        types = modality_token_types(model, input_ids)
    positions, deltas = model.model.get_rope_index(
        input_ids, mm_token_type_ids=types, image_grid_thw=image_grid, video_grid_thw=video_grid,
        attention_mask=model_inputs.get("attention_mask"))
    return positions.to(input_ids.device), deltas.to(input_ids.device).view(-1, 1)


def positions_at(indices: torch.LongTensor, table: tuple[torch.LongTensor, torch.LongTensor] | None) -> torch.LongTensor:
    """Rotary position ids of sequence `indices` [B, L]: the indices themselves without a table; with a
    target's (prompt positions [3, B, P], deltas [B, 1]), [3, B, L]: the table's entry for an index
    inside the prompt, index + delta on all three axes after it (as the target places new tokens)."""
    if table is None:
        return indices
    prompt, deltas = table
    prompt, deltas = prompt.to(indices.device), deltas.to(indices.device)
    length = prompt.shape[-1]
    after = (indices + deltas)[None].expand(3, *indices.shape)
    inside = prompt.gather(2, indices.clamp(max=length - 1)[None].expand(3, *indices.shape))
    return torch.where((indices < length)[None], inside, after)


def require_trace_positions(mrope: list[int] | None, position_ids: torch.Tensor | None, visual_mask: torch.Tensor) -> None:
    """An M-RoPE drafter learns at the target's positions: distillation traces made before they were
    stored would train it at sequence indices, which decoding never uses. Refuse them."""
    if mrope and position_ids is None and bool(visual_mask.any()):
        raise MMSpecError("these distillation traces hold no target positions (made before M-RoPE drafters); "
                          "an M-RoPE drafter would learn at the wrong positions: make the traces again")
