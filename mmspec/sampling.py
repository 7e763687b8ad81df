"""Logit processing and sampling shared by targets, drafters and acceptance rules.

Lossless speculative sampling needs the drafter and the target to be warped identically
(temperature, then top-k, then top-p, the order transformers uses), so both go through
`probabilities()` below. All randomness comes from a caller-supplied `torch.Generator`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import MMSpecError


@dataclass(frozen=True)
class SamplingConfig:
    """How a next token is chosen: greedy argmax, or sampling from warped probabilities."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise MMSpecError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise MMSpecError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise MMSpecError(f"top_p must be in (0, 1], got {self.top_p}")


def warp_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Apply temperature, top-k and top-p to logits [..., V]; filtered entries become -inf."""
    logits = logits.float()
    if config.temperature != 1.0:
        logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth_best = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; the best token always stays.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= config.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Warped probabilities [..., V] in float32."""
    return warp_logits(logits, config).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of probs [B, V] -> LongTensor [B]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def choose_next(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row of logits [B, V]: argmax when greedy, a draw from the warped probabilities otherwise."""
    if not config.do_sample:
        return logits.argmax(dim=-1)
    return sample(probabilities(logits, config), generator)
