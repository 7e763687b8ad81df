"""Every image method through the core loop (`mmspec.decoding.SpeculativeDecoder`), one grid per condition.

    method    drafter (mmspec.drafters contract)             rule (mmspec.rules contract)
    ar        NoDrafter                                      target_choice (the target's own token)
    sd        GuidedImageDrafter (a small guided LlamaGen)   speculative_sampling / greedy_match
    sjd       GridJacobiDrafter (the previous iterate)       on_target_probabilities(sjd_accept)
    gsd       GridJacobiDrafter                              on_target_probabilities(gsd_accept)
    lantern   either of the two drafters                     lantern_rule / on_target_probabilities(lantern_accept)

`decode_grids` runs one of these pairs over a list of conditions (images one at a time, batch 1) and
sums the stats; `image_ar.methods.MethodRunner` picks the pair for a method name.
"""

from __future__ import annotations

from typing import Callable

import torch

from mmspec.decoding import RoundHook, SpeculativeDecoder
from mmspec.drafters import Drafter, NoDrafter
from mmspec.policies import DraftLengthPolicy, FixedDraftLength
from mmspec.rules import AcceptanceRule, target_choice
from mmspec.sampling import SamplingConfig
from mmspec.stats import SpecStats

from .llamagen import LlamaGenForClassConditional
from .target import CFGTarget, GuidedImageTarget, ImageTokensOutput


def as_cfg_target(model: CFGTarget | LlamaGenForClassConditional, guidance_scale: float) -> CFGTarget:
    return model if isinstance(model, CFGTarget) else CFGTarget(model, guidance_scale)


def decode_grids(
    target: CFGTarget,
    drafter: Drafter,
    conditions: torch.LongTensor | int | list[int],
    *,
    rule: AcceptanceRule,
    policy: DraftLengthPolicy,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    method: str,
    on_tokens: Callable[[int], None] | None = None,
    on_round: RoundHook | None = None,
) -> ImageTokensOutput:
    """One token grid per condition (class label, or Janus prompt index) through the core loop.

    Stats are summed over the images; `stats.tau` is the step compression (tokens / target forwards).
    `on_tokens(n)` gets the count committed each round; `on_round(tokens, drafted, accepted, proposed)`
    the tokens themselves and the round's drafted image tokens (the core loop's hooks; images follow
    each other, `target.num_tokens` each).
    """
    decoder = SpeculativeDecoder(GuidedImageTarget(target), drafter, policy=policy, rule=rule, method=method)
    device = target.model.device
    stats = SpecStats(method=method)
    grids = []
    for condition in torch.as_tensor(conditions, dtype=torch.long, device="cpu").reshape(-1).tolist():  # host ints
        out = decoder.generate(torch.tensor([[condition]], device=device), max_new_tokens=target.num_tokens,
                               sampling=sampling, generator=generator, eos_token_id=(), on_tokens=on_tokens,
                               on_round=on_round)
        grids.append(out.sequences[0, 1:].view(target.grid_size, target.grid_size))
        stats = stats + out.stats
    return ImageTokensOutput(tokens=torch.stack(grids), stats=stats)


def ar_generate(
    target: CFGTarget | LlamaGenForClassConditional,
    class_labels: torch.LongTensor | int | list[int],
    sampling: SamplingConfig = SamplingConfig(do_sample=True),
    generator: torch.Generator | None = None,
    guidance_scale: float = 1.0,
    on_tokens: Callable[[int], None] | None = None,
    on_round: RoundHook | None = None,
) -> ImageTokensOutput:
    """Plain autoregressive decoding through the core loop: one target forward per image token (the baseline).

    Several conditions decode as one batch, all rows in one forward per token (training-time sample
    batches), which draws differently from decoding them one by one. `on_tokens(n)` is called with the
    number of tokens committed at each step (progress bars); `on_round` (one condition) as in `decode_grids`.
    """
    cfg = as_cfg_target(target, guidance_scale)
    labels = torch.as_tensor(class_labels, dtype=torch.long, device="cpu").reshape(-1)
    if labels.numel() == 1:
        return decode_grids(cfg, NoDrafter(), labels, rule=target_choice, policy=FixedDraftLength(1), sampling=sampling,
                            generator=generator, method="ar", on_tokens=on_tokens, on_round=on_round)
    decoder = SpeculativeDecoder(GuidedImageTarget(cfg), NoDrafter(), policy=FixedDraftLength(1), rule=target_choice,
                                 method="ar")
    out = decoder.generate(labels[:, None].to(cfg.model.device), max_new_tokens=cfg.num_tokens, sampling=sampling,
                           generator=generator, eos_token_id=(), on_tokens=on_tokens)
    grids = out.sequences[:, 1:].reshape(-1, cfg.grid_size, cfg.grid_size)
    return ImageTokensOutput(tokens=grids, stats=out.stats)
