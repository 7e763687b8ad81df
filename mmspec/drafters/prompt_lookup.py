"""Prompt-lookup (n-gram) drafter: copy what followed the last occurrence of the current n-gram.

Costs no model forward; useful when outputs repeat the prompt (captions that restate the
question, transcripts with repeated phrases). Same idea as transformers' prompt lookup.
"""

from __future__ import annotations

import torch

from ..errors import MMSpecError
from ..types import Proposal
from .base import Drafter, DraftView


def find_continuation(tokens: torch.Tensor, max_ngram: int, min_ngram: int, num_tokens: int) -> torch.Tensor:
    """Tokens that followed the latest earlier occurrence of the longest matching trailing n-gram."""
    length = tokens.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = tokens[length - n:]
        windows = tokens[: length - 1].unfold(0, n, 1) if length - 1 >= n else tokens.new_empty((0, n))
        hits = (windows == tail).all(dim=1).nonzero().flatten()
        # A hit at the tail itself has nothing after it; unfold over tokens[:-1] excludes it.
        for start in hits.flip(0).tolist():
            follow = tokens[start + n : start + n + num_tokens]
            if follow.numel():
                return follow
    return tokens[:0]


class PromptLookupDrafter(Drafter):
    """Deterministic n-gram drafts (q is one-hot, so speculative sampling stays lossless)."""

    drafts_batches = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise MMSpecError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, view: DraftView) -> Proposal:
        """The continuation of each row's own valid tokens; in a batch, shorter rows are padded (`Proposal.lengths`)."""
        max_tokens, batch = view.max_tokens, view.batch
        if max_tokens <= 0:
            return Proposal.empty(view.sequence)
        if batch is None:
            return Proposal(tokens=find_continuation(view.sequence[0], self.max_ngram, self.min_ngram, max_tokens)[None])
        found = [find_continuation(batch.tokens[b][batch.mask[b].bool()], self.max_ngram, self.min_ngram, max_tokens)
                 for b in range(batch.size)]
        lengths = torch.tensor([f.shape[0] for f in found], device=batch.tokens.device)
        tokens = batch.tokens.new_zeros((batch.size, int(lengths.max())))
        for b, follow in enumerate(found):
            tokens[b, : follow.shape[0]] = follow
        return Proposal(tokens=tokens, lengths=lengths)
