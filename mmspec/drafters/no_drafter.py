"""Plain autoregressive decoding through the same loop: a drafter that never drafts.

Gives the baseline the same target wrapper, the same stats object (tau = 1.0, alpha = 0) and
the same sampling code as every speculative method, so comparisons measure only the drafting.
"""

from __future__ import annotations

from ..types import Proposal
from .base import Drafter, DraftView


class NoDrafter(Drafter):
    drafts_batches = True

    def propose(self, view: DraftView) -> Proposal:
        return Proposal.empty(view.sequence)
