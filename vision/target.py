"""A `Target` for vision-language models: the prefill sees the visual inputs, the drafts do not.

The core target prefills `prompt + drafts` in one forward when the drafter can draft from the
prompt alone, but only for text inputs unless an adapter opts in. This target opts in: inputs
shaped like the prompt (Qwen2-VL's `mm_token_type_ids`) are extended over the drafts by the core,
and drafts join the prefill unless one is a visual placeholder id (prompt lookup copies them from
the prompt; a random model may emit them): the model would count it as a slot for visual
features and fail, while in `generate` a generated placeholder is a plain token embedding. Then
the prompt is prefilled alone and the drafts are scored in a second forward.

Qwen2-VL also needs `mm_token_type_ids` whenever an image or video grid is given; it is built
from the placeholder tokens if the caller did not pass it.

Qwen2-VL's 3-D M-RoPE needs nothing more: at prefill the model stores `rope_deltas`, and on
every later forward it places new tokens at `cache length + rope_deltas`, so cropping the
cache on rollback also rolls the positions back.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from ..devices import input_device
from ..targets import Target, register_target
from .models import feature_token_ids, modality_token_types
from .rope_positions import target_prompt_positions


class VisionTarget(Target):
    """`Target` that keeps multimodal prefill inputs consistent with the drafts riding along."""

    def __init__(self, model: PreTrainedModel, output_hidden_states: bool = False) -> None:
        super().__init__(model, output_hidden_states=output_hidden_states)
        self.placeholder_ids = torch.tensor(sorted(feature_token_ids(model)), dtype=torch.long, device=input_device(model))

    def initial_sequence(self, input_ids: torch.LongTensor | None, model_inputs: dict[str, Any]) -> torch.LongTensor:
        sequence = super().initial_sequence(input_ids, model_inputs)
        has_grid = model_inputs.get("image_grid_thw") is not None or model_inputs.get("video_grid_thw") is not None
        if has_grid and model_inputs.get("mm_token_type_ids") is None:
            model_inputs["mm_token_type_ids"] = modality_token_types(self.model, sequence)
        return sequence

    def batch_position_ids(self, positions: torch.LongTensor, batch: Any, prefill: bool,
                           model_inputs: dict[str, Any]) -> torch.LongTensor:
        """Qwen2-VL in a batch: the prompt's 3-D M-RoPE table per row (`get_rope_index` on the left-padded
        prompts, as `generate` computes it), then each row's text position + its rope delta on all three
        axes (as the model places new tokens, holes skipped); 1-D positions for the other models."""
        if getattr(self.model.config, "model_type", "") != "qwen2_vl":
            return positions
        if prefill:
            inputs = {**model_inputs, "attention_mask": batch.mask}
            types = inputs.get("mm_token_type_ids")
            if types is not None:  # drafts riding along with the prefill are not part of the prompt
                inputs["mm_token_type_ids"] = types[:, : batch.width]
            table = target_prompt_positions(self.model, batch.tokens, inputs)
            if table is None:  # text only: sequence positions on all axes
                table = (positions[:, : batch.width][None].expand(3, -1, -1), torch.zeros_like(positions[:, :1]))
            # Kept for feature drafters, which rotate by the target's positions: the prompt's table
            # [3, B, P] (columns of the padded batch) and each row's delta [B, 1].
            self.batch_rope_table, self.batch_rope_deltas = table
            drafts = (positions[:, batch.width:] + table[1].to(positions.device))[None].expand(3, -1, -1)
            return torch.cat([table[0].to(positions.device), drafts], dim=-1)
        return (positions + self.batch_rope_deltas.to(positions.device))[None].expand(3, *positions.shape)

    def select_rows(self, keep: torch.LongTensor) -> None:
        super().select_rows(keep)
        if getattr(self, "batch_rope_deltas", None) is not None:
            self.batch_rope_deltas = self.batch_rope_deltas.index_select(0, keep.to(self.batch_rope_deltas.device))

    def tree_position_ids(self, positions: torch.LongTensor) -> torch.LongTensor:
        """Qwen2-VL's M-RoPE: a draft tree's text positions on all three axes, shifted by the `rope_deltas`
        its prefill stored (the shift it applies itself to every later token); others take them as they are."""
        deltas = getattr(getattr(self.model, "model", None), "rope_deltas", None)
        if getattr(self.model.config, "model_type", "") != "qwen2_vl" or deltas is None:
            return positions
        return positions[None].expand(3, *positions.shape) + deltas.to(positions.device)

    def drafts_can_join_prefill(self, drafts: torch.LongTensor, model_inputs: dict[str, Any]) -> bool:
        # A placeholder id among the drafts would be counted as a slot for visual features.
        self.placeholder_ids = self.placeholder_ids.to(drafts.device)  # moves once if the model was moved
        return not bool(torch.isin(drafts, self.placeholder_ids).any())


for _model_type in ("llava", "llava_onevision", "llava_next_video", "qwen2_vl"):
    register_target(_model_type, VisionTarget)
