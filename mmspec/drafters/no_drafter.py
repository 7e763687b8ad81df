"""Plain autoregressive decoding through the same loop: a drafter that never drafts.

Gives the baseline the same target wrapper, the same stats object (tau = 1.0, alpha = 0) and
the same sampling code as every speculative method, so comparisons measure only the drafting.
"""

from __future__ import annotations

import torch

from ..policies import DraftLengthPolicy
from ..ragged import RaggedBatch
from ..sampling import SamplingConfig
from ..types import Proposal
from .base import Drafter


class NoDrafter(Drafter):
    drafts_batches = True

    def propose_batch(self, batch: RaggedBatch, max_tokens: int, sampling: SamplingConfig,
                      generator: torch.Generator | None) -> Proposal:
        return Proposal.empty(batch.tokens)

    def propose(self, sequence: torch.LongTensor, max_tokens: int, sampling: SamplingConfig,
                generator: torch.Generator | None, policy: DraftLengthPolicy) -> Proposal:
        return Proposal.empty(sequence)
