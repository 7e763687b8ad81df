"""A small text-only LM drafting for a vision-language target.

Gagrani et al. 2024, "On Speculative Decoding for Multimodal Large Language Models": a small
language model sharing the target's vocabulary drafts well for LLaVA even though it never sees
the image. It reads the committed sequence with every visual placeholder (and vision start/end
marker) removed; the target alone consumes the pixels.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

import torch
from transformers import PreTrainedModel

from ..cached_model import model_vocab_size
from ..devices import input_device
from ..drafters import DraftView, ModelDrafter
from ..errors import MMSpecError
from ..ragged import RaggedBatch
from ..sampling import SamplingConfig
from ..trees import DraftTree
from ..types import Proposal
from .models import visual_token_ids


class TextOnlyDrafter(ModelDrafter):
    """Drafts from the text of the committed sequence only; never receives images or videos.

    `ModelDrafter` keeps its cache in step with the sequence it is given; here that sequence is
    the filtered one, so the cache holds text tokens only and rollback works on text positions.
    It never proposes a visual token id either.

    The drafter may lack the visual special tokens a vision-language model appends to its text
    model's vocabulary (e.g. `<image>`, `<video>` added after training the LM): when every id
    beyond the drafter's vocabulary is such a token, its logits are padded with -inf up to the
    target's width, so token ids and probabilities line up exactly.

    Args:
        model: a decoder-only causal LM with the target's vocabulary.
        visual_tokens: the ids to remove, or the vision-language target to read them (and its
            vocabulary width) from.
    """

    def __init__(self, model: PreTrainedModel, visual_tokens: Iterable[int] | PreTrainedModel, lean: bool = True) -> None:
        super().__init__(model, lean=lean)
        if self.lm.is_encoder_decoder:
            raise MMSpecError("TextOnlyDrafter needs a decoder-only language model, got an encoder-decoder")
        ids = visual_token_ids(visual_tokens) if isinstance(visual_tokens, PreTrainedModel) else {int(t) for t in visual_tokens}
        if not ids:
            raise MMSpecError("TextOnlyDrafter needs at least one visual token id to remove")
        self.visual_ids = torch.tensor(sorted(ids), dtype=torch.long, device=input_device(self.lm.model))
        self._pad_to = None
        if isinstance(visual_tokens, PreTrainedModel):
            target_width = model_vocab_size(visual_tokens)
            missing = set(range(self.vocab_size, target_width))
            if missing and missing <= ids:
                self._pad_to = target_width
                self.vocab_size = target_width

    def text_only(self, sequence: torch.LongTensor) -> torch.LongTensor:
        """`sequence` [1, L] without its visual tokens, [1, L']."""
        self.visual_ids = self.visual_ids.to(sequence.device)  # moves once, not on every round
        keep = ~torch.isin(sequence[0], self.visual_ids)
        return sequence[:, keep]

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        # Pixels, grids and per-token modality ids belong to the target; the drafter gets none of them.
        super().begin(replace(view, sequence=self.text_only(view.sequence)), {})

    def propose(self, view: DraftView) -> Proposal | DraftTree:
        if view.batch is not None:  # the visual columns become holes (`batch_columns`)
            return super().propose(view)
        text = self.text_only(view.sequence)
        if text.shape[1] == 0:
            # A prompt of nothing but visual tokens gives a text model no context: skip drafting.
            return Proposal.empty(view.sequence) if view.tree is None else DraftTree.empty(view.sequence.device)
        return super().propose(replace(view, sequence=text))

    def batch_columns(self, batch: RaggedBatch) -> RaggedBatch:
        # In a batch the visual columns stay in place as holes: positions then count text tokens only.
        self.visual_ids = self.visual_ids.to(batch.tokens.device)
        return batch.without(torch.isin(batch.tokens, self.visual_ids))

    def draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        # A drafter that never sees pixels has no business proposing a visual placeholder; masking
        # before choosing keeps q (for speculative sampling) the distribution the draft came from.
        if self._pad_to is not None:
            logits = torch.nn.functional.pad(logits, (0, self._pad_to - logits.shape[-1]), value=float("-inf"))
        self.visual_ids = self.visual_ids.to(logits.device)
        ids = self.visual_ids[self.visual_ids < logits.shape[-1]]
        return logits.index_fill(-1, ids, float("-inf"))

    def choose(
        self,
        logits: torch.Tensor,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        want_confidence: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
        return super().choose(self.draft_logits(logits), sampling, generator, want_confidence)
