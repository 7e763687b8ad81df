"""Test drafters that see what the target sees (prompt tokens and pixels), so they can agree
with it always, never, or only sometimes."""

from __future__ import annotations

import copy
from typing import Any

from transformers import PreTrainedModel

from mmspec import ModelDrafter
from mmspec.drafters import DraftView


class MultimodalSelfDrafter(ModelDrafter):
    """A copy of the target drafting with the same images: always agrees under greedy decoding."""

    def __init__(self, model: PreTrainedModel) -> None:
        # A copy, so no state stored on the module (Qwen2-VL's rope_deltas) is shared with the target.
        super().__init__(copy.deepcopy(model))

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        super().begin(view, model_inputs)
        # ModelDrafter passes these to its own prefill only for encoder-decoders; a VLM needs them too.
        self._encoder_inputs = dict(model_inputs)


class MultimodalNeverAgreeDrafter(MultimodalSelfDrafter):
    """Drafts the target's second-best token: greedy verification never accepts."""

    def choose(self, logits, sampling, generator, want_confidence):
        return logits.topk(2, dim=-1).indices[:, 1], None, (0.9 if want_confidence else None)


class MultimodalFlakyDrafter(MultimodalSelfDrafter):
    """Agrees with the target except on every third draft: partial acceptance, so every rollback depth."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        self.drafted = 0

    def choose(self, logits, sampling, generator, want_confidence):
        self.drafted += 1
        rank = 1 if self.drafted % 3 == 0 else 0
        return logits.topk(2, dim=-1).indices[:, rank], None, (0.9 if want_confidence else None)
