"""Any transformers LM as a drafter (a small model sharing the target's vocabulary)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from ..cached_model import CachedModel
from ..errors import MMSpecError
from .autoregressive import AutoregressiveDrafter, common_prefix_length


class ModelDrafter(AutoregressiveDrafter):
    """Drafts autoregressively with its own KV cache.

    The cache is kept in step lazily: before proposing, it is cropped to the longest prefix it
    shares with the committed sequence, and only the rest is fed. After a round that accepted
    n of k drafts this feeds one or two tokens, as transformers' assisted generation does.
    An encoder-decoder drafter runs its own encoder on the caller's raw encoder inputs (as
    transformers' assisted generation runs the assistant's encoder), never on the target's states.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.lm = CachedModel(model, role="drafter")
        self.vocab_size = self.lm.vocab_size
        # Drafting past an end token is wasted work: the target stops there too.
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.stop_ids = frozenset() if eos is None else frozenset([eos] if isinstance(eos, int) else eos)
        self.cached_tokens = torch.empty(0, dtype=torch.long)
        self._encoder_inputs: dict[str, Any] = {}

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.lm.forwards

    def accept_inputs(self, input_ids: torch.LongTensor | None, model_inputs: dict[str, Any]) -> None:
        # A decoder-only drafter is text-only: it never sees the target's images or features.
        self._encoder_inputs = {}
        if not self.lm.is_encoder_decoder:
            return
        inputs = {k: v for k, v in model_inputs.items() if k not in ("decoder_input_ids", "decoder_attention_mask")}
        if input_ids is not None:
            inputs["input_ids"] = input_ids
        given = inputs.get("encoder_outputs")
        if given is not None:
            states = given[0] if isinstance(given, (tuple, list)) else given.last_hidden_state
            width = getattr(self.lm.model.config, "d_model", None) or getattr(self.lm.model.config, "hidden_size", None)
            if width is not None and states.shape[-1] != width:
                raise MMSpecError(
                    f"the encoder-decoder drafter runs its own encoder (width {width}); pass the encoder inputs "
                    f"(input_features / input_ids), not the target's encoder_outputs (width {states.shape[-1]})"
                )
        device = self.lm.model.device
        self._encoder_inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    def prefill(self, sequence: torch.LongTensor, model_inputs: dict[str, Any]) -> None:
        self.lm.cache = None
        self.cached_tokens = torch.empty(0, dtype=torch.long, device=sequence.device)

    def catch_up(self, sequence: torch.Tensor) -> torch.Tensor:
        """Bring the cache in line with `sequence` and return the next-token logits [B, V]."""
        keep = common_prefix_length(self.cached_tokens, sequence)
        keep = min(keep, sequence.shape[0] - 1)  # feed at least one token to get next-token logits
        if self.lm.cache is None or keep == 0:
            out = self.lm.prefill(sequence[None], logits_to_keep=1, **self._encoder_inputs)
        else:
            self.lm.truncate(keep)
            out = self.lm.extend(sequence[None, keep:], logits_to_keep=1)
        return out.logits[:, -1, :]

    def feed(self, token: torch.Tensor) -> torch.Tensor:
        return self.lm.extend(token[:, None], logits_to_keep=1).logits[:, -1, :]
