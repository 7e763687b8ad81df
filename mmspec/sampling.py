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


def generator_device(generator: torch.Generator | None, default: torch.device) -> torch.device:
    """Where random numbers are drawn: on the generator's device, so a seed means the same everywhere."""
    return default if generator is None else torch.device(generator.device)


def rand(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device,
         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniforms in [0, 1) drawn on the generator's device and moved to `device`.

    As diffusers' `randn_tensor`: a CPU generator works with a CUDA model and gives the numbers it
    gives on the CPU.
    """
    return torch.rand(shape, generator=generator, device=generator_device(generator, device), dtype=dtype).to(device)


def randn(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device,
          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normals drawn on the generator's device and moved to `device` (see `rand`)."""
    return torch.randn(shape, generator=generator, device=generator_device(generator, device), dtype=dtype).to(device)


def randint(high: int, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Integers in [0, high) drawn on the generator's device and moved to `device` (see `rand`)."""
    return torch.randint(high, shape, generator=generator, device=generator_device(generator, device)).to(device)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of probs [B, V] -> LongTensor [B], on the device of `probs`.

    The draw happens on the generator's device (probs are moved there when it differs).
    """
    where = generator_device(generator, probs.device)
    return torch.multinomial(probs.to(where), 1, generator=generator).squeeze(-1).to(probs.device)


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of probs [N, V] -> LongTensor [N], for many rows at once (a whole image's tokens).

    Inverse-CDF sampling: one uniform per row, located in the row's cumulative sum. Exactly the categorical
    law of each row, like `sample`, but a different use of the generator, and on a CPU several times
    faster than `torch.multinomial` when N is in the thousands. Zero-probability entries are never drawn.
    """
    cdf = probs.float().cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    u = rand((probs.shape[0], 1), generator, probs.device) * total
    idx = torch.searchsorted(cdf, u, right=True)
    # u * total may round up to total itself: take the last entry with mass then.
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(idx, last).squeeze(-1)


def sample_warped_rows(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of logits [N, V] from `probabilities(logits, config)`, for many rows at once (`sample_rows`).

    With top_k < V only each row's k best logits are warped and searched: the same law (the other tokens have
    probability 0 after top-k), but top-p sorts k entries instead of V. Ties with the k-th best logit, which the
    full warp keeps and `torch.topk` cuts to k, are the one difference.
    """
    if config.top_k is None or config.top_k >= logits.shape[-1]:
        return sample_rows(probabilities(logits, config), generator)
    best, where = torch.topk(logits, config.top_k, dim=-1)
    within = SamplingConfig(do_sample=True, temperature=config.temperature, top_p=config.top_p)
    picked = sample_rows(probabilities(best, within), generator)
    return where.gather(-1, picked.unsqueeze(-1)).squeeze(-1)


def seeded_generator(device: torch.device | str, seed: int | None = None) -> torch.Generator:
    """A generator on `device`; without a seed, seeded from torch's global RNG so `torch.manual_seed` repeats runs."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)))
    if isinstance(seed, bool) or not hasattr(seed, "__index__") or not -(2**63) <= int(seed) < 2**64:
        raise MMSpecError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r:.40}")  # torch's range
    return torch.Generator(device=device).manual_seed(int(seed))


def choose_next(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row of logits [B, V]: argmax when greedy, a draw from the warped probabilities otherwise."""
    if not config.do_sample:
        return logits.argmax(dim=-1)
    return sample(probabilities(logits, config), generator)
