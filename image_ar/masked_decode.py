"""MAR's masked decoding schedule and the target-only loop over it (shared by `mar.MAR.sample_tokens`
and continuous speculative decoding, `cspd.py`): a random order per image, the cosine schedule of
unknown tokens, the CFG scale per step, and `target_generate`, which runs any model that implements
`ContinuousTokenModel` (MAR; the tests add a closed-form mixture model) one forward per step."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Protocol

import numpy as np
import torch

from mmspec.errors import MMSpecError

from .image_stats import StepStats

CFG_SCHEDULES = ("linear", "constant")


def tokens_left(step: int, num_iter: int, seq_len: int, unknown: int) -> int:
    """Unknown tokens after `step` on the cosine schedule: at least one fewer than now, at least one left
    (the last step predicts all that remain)."""
    if step >= num_iter - 1:
        return 0
    left = math.floor(seq_len * np.cos(math.pi / 2.0 * (step + 1) / num_iter))
    return max(1, min(unknown - 1, left))


def mask_by_order(left: int, orders: torch.Tensor) -> torch.Tensor:
    """Bool mask [B, L]: the first `left` positions of each order are (still) unknown."""
    mask = torch.zeros(orders.shape, dtype=torch.bool, device=orders.device)
    return mask.scatter(1, orders[:, :left], True)


def cfg_scale(cfg: float, schedule: str, seq_len: int, left: int) -> float:
    """The guidance scale of a step after which `left` tokens stay unknown (Muse's linear ramp).

    The official code counts the last step's mask length as 1 (it clamps it to at least one), so
    the ramp ends at 1 + (cfg - 1)(L - 1)/L, not at cfg."""
    left = max(left, 1)
    if schedule == "linear":
        return 1 + (cfg - 1) * (seq_len - left) / seq_len
    if schedule == "constant":
        return cfg
    raise MMSpecError(f"unknown cfg_schedule {schedule!r} (known: {', '.join(CFG_SCHEDULES)})")


class ContinuousTokenModel(Protocol):
    """What the loops need of a model (`mar.MAR` is one; the tests add a closed-form mixture model)."""

    seq_len: int
    token_embed_dim: int
    device: torch.device
    supports_density: bool
    # Optional: `denoising_timesteps` (tuple of ints), compared between draft and target by cspd when both have it.

    def check_generation(self, num_iter: int, cfg: float, cfg_schedule: str, temperature: float) -> None: ...
    def class_embedding(self, labels: Any, batch_size: int, cfg: float) -> torch.Tensor: ...
    def sample_orders(self, batch_size: int, generator: torch.Generator | None) -> torch.Tensor: ...
    def noise_banks(self, batch_size: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    def propose(self, tokens: torch.Tensor, unknown: torch.Tensor, predict: torch.Tensor, class_embedding: torch.Tensor,
                cfg: float, temperature: float, noise: torch.Tensor, step_noise: torch.Tensor | None) -> Any: ...


def cosine_lefts(num_iter: int, seq_len: int) -> list[int]:
    """Unknown tokens after each step of MAR's cosine schedule (last entry 0)."""
    lefts, unknown = [], seq_len
    for step in range(num_iter):
        unknown = tokens_left(step, num_iter, seq_len, unknown)
        lefts.append(unknown)
    return lefts


def check_generation(model: ContinuousTokenModel, batch_size: int, num_iter: int, cfg: float, cfg_schedule: str,
           temperature: float) -> None:
    if batch_size < 1:
        raise MMSpecError(f"batch_size must be >= 1, got {batch_size}")
    model.check_generation(num_iter, cfg, cfg_schedule, temperature)


@torch.no_grad()
def target_generate(model: ContinuousTokenModel, batch_size: int, num_iter: int = 64, cfg: float = 1.0,
                    cfg_schedule: str = "linear", labels: Any = None, temperature: float = 1.0,
                    generator: torch.Generator | None = None, lefts: list[int] | None = None,
                    on_step: Callable[[int], None] | None = None) -> tuple[torch.Tensor, StepStats]:
    """Tokens [B, L, C] by the model alone: one forward per step of `lefts` (default: the cosine schedule).
    `on_step(left)` runs after each step (a progress bar)."""
    check_generation(model, batch_size, num_iter, cfg, cfg_schedule, temperature)
    lefts = cosine_lefts(num_iter, model.seq_len) if lefts is None else list(lefts)
    if not lefts or lefts[-1] != 0 or any(b >= a for a, b in zip([model.seq_len] + lefts, lefts)):
        raise MMSpecError("a schedule must decrease strictly to 0 unknown tokens")
    stats = StepStats(method="target", schedule=list(lefts))
    start = time.perf_counter()
    orders = model.sample_orders(batch_size, generator)
    noise, step_noise = model.noise_banks(batch_size, generator)
    cond = model.class_embedding(labels, batch_size, cfg)
    tokens = torch.zeros(batch_size, model.seq_len, model.token_embed_dim, device=model.device)
    unknown = torch.ones(batch_size, model.seq_len, dtype=torch.bool, device=model.device)
    for left in lefts:
        still = mask_by_order(left, orders)
        predict = unknown & ~still
        density = model.propose(tokens, unknown, predict, cond, cfg_scale(cfg, cfg_schedule, model.seq_len, left),
                                temperature, noise, step_noise)
        tokens[predict] = density.tokens.to(tokens.dtype)
        unknown = still
        stats.target_forwards += 1
        if on_step is not None:
            on_step(left)
    stats.new_tokens = batch_size * model.seq_len
    stats.total_time = time.perf_counter() - start
    return tokens, stats
