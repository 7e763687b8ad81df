"""What a drafter proposes and what an acceptance rule decides.

Tensors carry a batch dimension B; in a batch each row accepts its own number of drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    """Draft tokens [B, k] and, for sampled drafts, the distribution q [B, k, V] each was drawn from.

    `probs is None` means the drafts are deterministic (greedy drafter, n-gram lookup): rules then
    treat q as one-hot on the drafted token, which keeps speculative sampling lossless.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    # Drafts per row [B] when rows drafted different numbers (n-gram lookup in a batch); a row's
    # tokens past its length are padding that rules never accept. None: every row drafted k.
    lengths: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def valid(self) -> torch.Tensor | None:
        """Which draft slots [B, k] hold real drafts (None: all of them)."""
        if self.lengths is None:
            return None
        return torch.arange(self.length, device=self.tokens.device)[None] < self.lengths.to(self.tokens.device)[:, None]

    @classmethod
    def empty(cls, like: torch.Tensor) -> "Proposal":
        """No drafts for a batch shaped like `like` [B, ...]: the target then adds one token itself."""
        return cls(tokens=like.new_empty((like.shape[0], 0)))


@dataclass
class Verdict:
    """How many drafts each row accepted [B] and the token the target adds after them [B].

    The added token is the correction (on a rejection) or the bonus token (all drafts accepted).
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor
    # The target's distribution [B, k + 1, V] the rule judged against, when it computed one (rules
    # written on probabilities); a Jacobi drafter samples its next iterate from it.
    target_probs: torch.Tensor | None = None
    # Tree drafting: the accepted nodes of the draft tree, root's child first (num_accepted == len(path)).
    path: list[int] | None = None
    _first_accepted: int | None = field(default=None, init=False, repr=False, compare=False)

    def first_accepted(self) -> int:
        """Row 0's accepted count as an int, read from the device once however many readers ask (one sync)."""
        if self._first_accepted is None:
            self._first_accepted = int(self.num_accepted[0])
        return self._first_accepted
