"""The optimisation loop shared by the fast-decoder trainers: AdamW, warm-up + cosine, clipping."""

from __future__ import annotations

import math
import random
from typing import Callable

import torch
from torch import nn
from tqdm.auto import tqdm


def fit(
    module: nn.Module,
    batch_loss: Callable[[list[int]], torch.Tensor],
    num_examples: int,
    steps: int,
    *,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int,
    seed: int,
    progress_bar: bool,
    desc: str,
) -> list[float]:
    """AdamW + warm-up/cosine schedule + clipping over batches drawn from seeded shuffles."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimiser = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, steps, warmup_steps))
    module.train()
    losses: list[float] = []
    order: list[int] = []
    with tqdm(total=steps, desc=desc, disable=not progress_bar) as bar:
        for _ in range(steps):
            batch: list[int] = []
            while len(batch) < min(batch_size, num_examples):
                if not order:
                    order = list(range(num_examples))
                    rng.shuffle(order)
                batch.append(order.pop())
            loss = batch_loss(batch)
            optimiser.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            losses.append(loss.detach().item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update(1)
    module.eval()
    return losses


def lr_factor(step: int, steps: int, warmup: int) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
