"""The token-by-token drafting loop shared by drafters that run a model with its own cache."""

from __future__ import annotations

from abc import abstractmethod

import torch

from ..sampling import SamplingConfig, probabilities, sample
from ..trees import DraftTree
from ..types import Proposal
from .base import Drafter, DraftView


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the common prefix of two 1-D token tensors."""
    n = min(a.shape[0], b.shape[0])
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0, 0]) if mismatch.numel() else n


def choose_draft_token(
    logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None, want_confidence: bool
) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
    """Pick a draft token from logits [B, V]: (token [B], q [B, V] when sampling else None, confidence).

    The confidence (the drafter's probability of its own pick) feeds adaptive draft-length policies.
    """
    if sampling.do_sample:
        q = probabilities(logits, sampling)
        token = sample(q, generator)
        confidence = float(q[0, token[0]]) if want_confidence else None
        return token, q, confidence
    token = logits.argmax(dim=-1)
    confidence = float(logits[0].float().softmax(-1)[token[0]]) if want_confidence else None
    return token, None, confidence


class AutoregressiveDrafter(Drafter):
    """Drafts one token per forward of its own model, whose cache is kept in step lazily.

    Subclasses give `catch_up(sequence)` (crop the cache to the prefix it shares with the committed
    sequence, feed the rest, return next-token logits [1, V]) and `feed(token)` (one drafted token
    in, next logits out). `cached_tokens` records what the cache holds: every draft but the last.
    """

    stop_ids: frozenset[int] = frozenset()  # drafting past an end token is wasted work

    @abstractmethod
    def catch_up(self, sequence: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def feed(self, token: torch.Tensor) -> torch.Tensor: ...

    def choose(self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None,
               want_confidence: bool) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
        return choose_draft_token(logits, sampling, generator, want_confidence)

    def propose(self, view: DraftView) -> Proposal | DraftTree:
        """A chain of up to `view.max_tokens` drafts, one forward each."""
        sequence, max_tokens, policy, processors = view.sequence, view.max_tokens, view.policy, view.processors
        if max_tokens <= 0:
            return Proposal.empty(sequence)
        logits = self.catch_up(sequence[0])
        tokens, dists = [], []
        for step in range(max_tokens):
            if processors:
                prefix = torch.cat([sequence, torch.stack(tokens, dim=1)], dim=1) if tokens else sequence
                logits = processors(prefix, logits.float())
            token, dist, confidence = self.choose(logits, view.sampling, view.generator, policy.needs_confidence)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if step + 1 == max_tokens or (confidence is not None and not policy.keep_drafting(confidence)):
                break
            if self.stop_ids and int(token[0]) in self.stop_ids:
                break
            logits = self.feed(token)
        drafted = torch.stack(tokens, dim=1)
        self.cached_tokens = torch.cat([sequence[0], drafted[0, :-1]])  # every draft but the last was fed
        return Proposal(tokens=drafted, probs=torch.stack(dists, dim=1) if dists else None)
