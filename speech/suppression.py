"""Whisper's token suppression with the vocabulary mask made once.

transformers' `SuppressTokensLogitsProcessor` and `SuppressTokensAtBeginLogitsProcessor` rebuild their mask
(`torch.isin` over the whole vocabulary) on every call. The core calls processors once per verified position,
so where it cannot take its masking fast path (a processor that reads the scores, as the timestamp rules do)
that rebuild dominated decoding. `SuppressedTokens` gives the same scores (`torch.where(mask, -inf, scores)`)
from a mask kept per vocabulary size and device.
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers.generation.logits_process import LogitsProcessor


class SuppressedTokens(LogitsProcessor):
    """Scores of `tokens` set to -inf: at every position, or with `begin_index` only where the prefix is that long
    (the first new position), as transformers' two suppression processors do."""

    def __init__(self, tokens: Iterable[int], begin_index: int | None = None) -> None:
        self.tokens = [int(t) for t in tokens]
        self.begin_index = begin_index
        self._masks: dict[tuple[int, torch.device], torch.Tensor] = {}

    def mask(self, vocab: int, device: torch.device) -> torch.Tensor:
        key = (vocab, device)
        if key not in self._masks:
            mask = torch.zeros(vocab, dtype=torch.bool, device=device)
            ids = torch.tensor([t for t in self.tokens if 0 <= t < vocab], dtype=torch.long, device=device)
            mask[ids] = True
            self._masks[key] = mask
        return self._masks[key]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self.begin_index is not None and input_ids.shape[-1] != self.begin_index:
            return scores
        return torch.where(self.mask(scores.shape[-1], scores.device), -float("inf"), scores)
