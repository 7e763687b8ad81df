"""CoDe, collaborative decoding of VAR (Chen et al. 2024, arXiv 2411.17787; czg1225/CoDe, MIT).

A large drafter VAR generates the first `draft_steps` scales (the low-frequency content) with its own
key/value cache; a small refiner VAR then reads the drafter's token maps in ONE block-causal prefill
pass that builds its own cache and samples the next scale, and generates the remaining scales itself.
Both share one VQ-VAE (the training-free mode pairs two independently trained VARs on it). There is no
verification: the output is the refiner's continuation, not the drafter's distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mmspec.errors import MMSpecError

from .image_stats import ScaleRecord, ScaleStats
from .var import VAR, VARSampling, VARState
from .var_vq import VQVAE


@dataclass
class CoDeOutput:
    """Images [B, 3, H, W] in [0, 1] (f_hat when not decoded), the token maps per scale, and the stats: a
    `ScaleStats` (target_forwards = the large drafter VAR's forwards, drafter_forwards = the refiner's, one
    `ScaleRecord` per scale saying which of the two made it)."""

    images: torch.Tensor
    token_maps: list[torch.Tensor]
    f_hat: torch.Tensor
    stats: ScaleStats


def scale_records(patch_nums: Sequence[int], token_maps: Sequence[torch.Tensor], draft_steps: int | None) -> list[ScaleRecord]:
    """One record per scale made: scales before `draft_steps` by the large "model", the rest by the "refiner"
    (whose first forward is its prefill over the large model's scales); None: all by the model (ar)."""
    split = len(token_maps) if draft_steps is None else draft_steps
    return [ScaleRecord(scale=si, side=int(patch_nums[si]), tokens=int(tokens.numel()),
                        by="model" if si < split else "refiner", prefill=si == split)
            for si, tokens in enumerate(token_maps)]


def check_draft_steps(draft_steps: int, num_scales: int) -> None:
    if isinstance(draft_steps, bool) or not isinstance(draft_steps, int) or not 1 <= draft_steps <= num_scales - 1:
        raise MMSpecError(f"draft_steps must be in 1..{num_scales - 1} (the drafter runs that many of the "
                          f"{num_scales} scales, the refiner the rest), got {draft_steps}")


def code_generate(drafter: VAR, refiner: VAR, vq: VQVAE, labels: torch.Tensor | Sequence[int], draft_steps: int,
                  sampling: VARSampling | None = None, generator: torch.Generator | None = None,
                  decode: bool = True, on_scale: Callable[[int, str], Any] | None = None) -> CoDeOutput:
    """The drafter runs scales 0..N-1, the refiner scales N..end (N = `draft_steps`, CoDe's `exit_num`);
    `on_scale(si, "drafter" | "refiner")` after each scale. The stats' scale records name the large drafter
    "model", as the pipeline does."""
    sampling = sampling or VARSampling()
    num_scales = len(drafter.patch_nums)
    check_draft_steps(draft_steps, num_scales)
    if refiner.patch_nums != drafter.patch_nums:
        raise MMSpecError(f"drafter and refiner scales differ: {drafter.patch_nums} vs {refiner.patch_nums}")
    if refiner.num_classes != drafter.num_classes:
        raise MMSpecError(f"drafter has {drafter.num_classes} classes, refiner {refiner.num_classes}")
    state: VARState = drafter.begin(labels)
    drafter.run_scales(state, vq, 0, draft_steps, sampling, generator, name="drafter", on_scale=on_scale)
    state.cache = state.cache_owner = None  # the drafter's cache is of no use to the refiner; free it before the refiner runs
    state.f_hat = state.f_hat.to(refiner.device)
    state.labels = state.labels.to(refiner.device)
    state.inputs = [x.to(refiner.device) for x in state.inputs]
    refiner.run_scales(state, vq, draft_steps, num_scales, sampling, generator, name="refiner", on_scale=on_scale)
    images = state.f_hat
    if decode:
        with torch.no_grad():
            images = vq.fhat_to_img(state.f_hat.to(vq.device, vq.dtype)).add(1).mul(0.5)
    stats = ScaleStats(method="code", target_forwards=state.forwards.get("drafter", 0),
                       drafter_forwards=state.forwards.get("refiner", 0),
                       new_tokens=sum(int(t.numel()) for t in state.token_maps), draft_scales=draft_steps,
                       scales=scale_records(drafter.patch_nums, state.token_maps, draft_steps))
    return CoDeOutput(images=images, token_maps=state.token_maps, f_hat=state.f_hat, stats=stats)
