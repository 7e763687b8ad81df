"""Acceptance rules: pure tensor functions from (proposal, target logits, generator) to a verdict.

`target_logits` has k + 1 positions: position i scores the token after draft i - 1
(position 0 scores draft 0, position k gives the bonus token).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .sampling import SamplingConfig, probabilities, sample
from .types import Proposal, Verdict


class AcceptanceRule(Protocol):
    def __call__(
        self,
        proposal: Proposal,
        target_logits: torch.Tensor,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Verdict: ...


def leading_true_count(accepted: torch.Tensor) -> torch.LongTensor:
    """Per row, the number of leading True values in a bool tensor [B, k]."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def greedy_match(
    proposal: Proposal,
    target_logits: torch.Tensor,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Exact match: accept drafts while they equal the target's argmax; then take the target's argmax."""
    choice = target_logits.argmax(dim=-1)
    k = proposal.length
    num_accepted = leading_true_count(proposal.tokens == choice[:, :k])
    next_token = choice.gather(1, num_accepted[:, None]).squeeze(1)
    return Verdict(num_accepted=num_accepted, next_token=next_token)


def one_hot_drafts(proposal: Proposal, vocab_size: int) -> torch.Tensor:
    """q for deterministic drafts: all mass on the drafted token, [B, k, V]."""
    return torch.nn.functional.one_hot(proposal.tokens, vocab_size).float()


def speculative_sampling(
    proposal: Proposal,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
) -> Verdict:
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw the
    correction from norm(max(p_i - q_i, 0)); if all k are accepted draw a bonus token from p_k.
    The output is distributed exactly as sampling from p alone. Exactly k uniforms and one
    multinomial draw are consumed per call, so seeded runs repeat.
    """
    p = probabilities(target_logits, sampling)
    batch, k = proposal.tokens.shape
    q = proposal.probs if proposal.probs is not None else one_hot_drafts(proposal, p.shape[-1])
    tokens = proposal.tokens[..., None]
    p_draft = p[:, :k].gather(-1, tokens).squeeze(-1)
    q_draft = q.gather(-1, tokens).squeeze(-1)
    uniforms = torch.rand(batch, k, generator=generator, device=p.device)
    num_accepted = leading_true_count(uniforms * q_draft <= p_draft)

    rows = torch.arange(batch, device=p.device)
    p_next = p[rows, num_accepted]
    if k > 0:
        q_next = q[rows, num_accepted.clamp(max=k - 1)]
        rejected = (num_accepted < k)[:, None]
        residual = torch.where(rejected, (p_next - q_next).clamp(min=0), p_next)
    else:
        residual = p_next
    # p == q up to rounding can leave no residual mass; p itself is then the right fallback.
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    return Verdict(num_accepted=num_accepted, next_token=sample(residual, generator))


def default_rule(sampling: SamplingConfig) -> AcceptanceRule:
    return speculative_sampling if sampling.do_sample else greedy_match
