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
from mmspec.sampling import SamplingConfig, choose_next
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
    """Plain autoregressive decoding: one target forward per image token (the baseline).

    One condition: through the core loop (the `ar` method). Several: sampled in lockstep, all rows in
    one forward per token (training-time sample batches; the core loop decodes one sequence at a
    time), which draws differently from decoding them one by one. `on_tokens(n)` is called with the
    number of tokens committed at each step (progress bars); `on_round` (one condition) as in `decode_grids`.
    """
    cfg = as_cfg_target(target, guidance_scale)
    labels = torch.as_tensor(class_labels, dtype=torch.long, device="cpu").reshape(-1)
    if labels.numel() == 1:
        return decode_grids(cfg, NoDrafter(), labels, rule=target_choice, policy=FixedDraftLength(1), sampling=sampling,
                            generator=generator, method="ar", on_tokens=on_tokens, on_round=on_round)
    return _lockstep(cfg, labels.to(cfg.model.device), sampling, generator, on_tokens)


def _lockstep(target: CFGTarget, labels: torch.LongTensor, sampling: SamplingConfig, generator: torch.Generator | None,
              on_tokens: Callable[[int], None] | None) -> ImageTokensOutput:
    """Plain AR sampling of a batch of conditions, one forward per token for all rows."""
    stats = SpecStats(method="ar")
    with stats.timer("total"):
        with stats.timer("prefill"):
            logits = target.start(labels)[:, -1]
        tokens = []
        for step in range(target.num_tokens):
            token = choose_next(logits, sampling, generator)
            tokens.append(token)
            stats.new_tokens += 1
            stats.target_forwards += 1
            if on_tokens is not None:
                on_tokens(1)
            if step + 1 < target.num_tokens:
                with stats.timer("verify"):
                    logits = target.extend(token[:, None])[:, -1]
    grid = torch.stack(tokens, dim=1).view(-1, target.grid_size, target.grid_size)
    return ImageTokensOutput(tokens=grid, stats=stats)
