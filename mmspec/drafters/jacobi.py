"""Jacobi decoding as a drafter: the drafts of a round are the target's previous iterate.

Speculative Jacobi decoding (Teng et al. 2024) in the core loop's terms:

    propose(k)  the carried drafts y_1..y_w cut to k, topped up with fresh tokens (`fresh_token`,
                q one-hot on them); each carried draft keeps the distribution d it was drawn from as q
    (the target scores [last, y_1..y_k] in one forward; the rule accepts a drafts and adds one token)
    observe     the Jacobi update: the next drafts are one sample from each of the target's rows after
                the committed ones, p_{a+1}..p_k (`Verdict.target_probs` when the rule computed them),
                and those rows become their q

With a lossless rule judging q (speculative sampling, `image_ar`'s SJD), every draft is a fresh sample
from its q, drawn independently of the acceptance draws, so each round is exact speculative sampling.
Greedy: p is one-hot on the argmax, the iterate is plain Jacobi decoding and the output is greedy decoding's.
Randomness per round, in order: fresh tokens (propose), the rule's draws, then the update's one
multinomial call over the unaccepted rows (observe).
"""

from __future__ import annotations

from typing import Any

import torch

from ..rules import target_distribution
from ..sampling import randint, sample
from ..types import Proposal, Verdict
from .base import Drafter, DraftView


class JacobiDrafter(Drafter):
    """Drafts the previous Jacobi iterate; no model of its own (`forwards` stays 0).

    Args:
        vocab_size: the target's vocabulary (fresh tokens and one-hot q are over it).

    Subclasses choose fresh tokens (`fresh_token`: uniform over the vocabulary here; an image grid
    copies a neighbour).
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = int(vocab_size)
        self.prompt_length = 0
        self.drafts: torch.LongTensor | None = None  # carried drafts [1, w]
        self.draft_probs: torch.Tensor | None = None  # the distribution each was drawn from [1, w, V]

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        sequence = view.sequence
        self.prompt_length = sequence.shape[1]
        self.drafts = sequence.new_empty((1, 0))
        self.draft_probs = torch.empty(1, 0, self.vocab_size, device=sequence.device)

    def fresh_token(self, position: int, tokens: list[int], generator: torch.Generator | None,
                    device: torch.device) -> int:
        """A draft for generated position `position` where the iterate has none yet; `tokens` are the
        generated tokens and drafts before it. Uniform over the vocabulary (drawn on the generator's device)."""
        return int(randint(self.vocab_size, (1,), generator, device))

    def propose(self, view: DraftView) -> Proposal:
        sequence, generator = view.sequence, view.generator
        width = max(view.max_tokens, 0)
        drafts, probs = self.drafts[:, :width], self.draft_probs[:, :width]
        if drafts.shape[1] < width:
            tokens = sequence[0, self.prompt_length :].tolist() + drafts[0].tolist()
            fresh = []
            while len(fresh) < width - drafts.shape[1]:
                token = self.fresh_token(len(tokens), tokens, generator, sequence.device)
                tokens.append(token)
                fresh.append(token)
            fresh_tokens = torch.tensor([fresh], dtype=torch.long, device=sequence.device)
            drafts = torch.cat([drafts, fresh_tokens], dim=1)
            probs = torch.cat([probs, torch.nn.functional.one_hot(fresh_tokens, self.vocab_size).to(probs.dtype)], dim=1)
        return Proposal(tokens=drafts, probs=probs)

    def observe(self, view: DraftView, verdict: Verdict | None, target_step: Any) -> None:
        if verdict is None:
            return
        sequence = view.sequence
        p = verdict.target_probs
        if p is None:
            p = target_distribution(target_step.logits, view.sampling)
        rest = p[0, int(verdict.num_accepted[0]) + 1 :]
        if rest.shape[0]:
            self.drafts = sample(rest, view.generator)[None]
            self.draft_probs = rest[None]
        else:
            self.drafts = sequence.new_empty((1, 0))
            self.draft_probs = p.new_zeros(1, 0, self.vocab_size)
