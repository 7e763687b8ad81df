"""Speculative Jacobi decoding (SJD) for AR image models, through the core loop.

The drafter is the previous Jacobi iterate (`mmspec.drafters.JacobiDrafter`); this module gives it
the image grid's fresh tokens (random, or copied from a neighbour) and runs SJD / GSD / LANTERN on
Jacobi drafts with the rules of `image_ar.rules` behind the core rule interface
(`mmspec.rules.on_target_probabilities`):

    state: n committed tokens; drafts y_1..y_w for positions n .. n + w - 1 with the distributions d they came from
    each round (`mmspec.decoding`):
        w = min(window, N - n - 1)                 # the bonus row must still be an image position
        top the drafts up to w: fresh tokens (random / copied from the left / from the row above), one-hot d
        ONE target forward over [newest committed, y_1..y_w] -> p_0..p_w (guided, warped)
        verdict = rule(y, d, p)                    # a accepted drafts + one appended token
        commit y_1..y_a and the appended token; crop the cache to the committed prefix
        next drafts = fresh samples x_j ~ p_j at rows a+1..w, with d := p_j (the Jacobi update)

Lossless with `sjd_accept`: every draft y is a fresh sample from its d, drawn independently of the
acceptance randomness, so each acceptance step is exact speculative sampling.
Greedy (`do_sample=False`): p is one-hot on the argmax, which makes SJD deterministic Jacobi
decoding and its output equal to greedy AR decoding.
"""

from __future__ import annotations

from typing import Callable

import torch

from mmspec.drafters import JacobiDrafter
from mmspec.errors import MMSpecError
from mmspec.policies import FixedDraftLength
from mmspec.rules import ProbabilityRule, on_target_probabilities
from mmspec.sampling import SamplingConfig, randint

from .decode import RoundHook, as_cfg_target, decode_grids
from .llamagen import LlamaGenForClassConditional
from .rules import sjd_accept
from .target import CFGTarget, ImageTokensOutput

INIT_STRATEGIES = ("random", "left", "above", "spatial")


def initial_token(position: int, tokens: list[int], grid: int, vocab: int, strategy: str, generator,
                  device: torch.device | str = "cpu") -> int:
    """A fresh draft for `position`, given all tokens (committed + drafts) before it.

    random: uniform over the codebook. left / spatial: copy the left neighbour (the row above in the
    first column). above: copy the token one row up (the left neighbour in the first row).
    Falls back to random when no neighbour exists. Random draws happen on the generator's device
    (`mmspec.sampling.randint`), so any generator works with a model on `device`.
    """
    left = position - 1 if position % grid else None
    up = position - grid if position >= grid else None
    if strategy in ("left", "spatial"):
        source = left if left is not None else up
    elif strategy == "above":
        source = up if up is not None else left
    else:
        source = None
    if source is not None:
        return tokens[source]
    return int(randint(vocab, (1,), generator, torch.device(device)))


class GridJacobiDrafter(JacobiDrafter):
    """Jacobi drafts over a raster-ordered grid of `grid_size` x `grid_size` codes; fresh tokens by `init`."""

    def __init__(self, vocab_size: int, grid_size: int, init: str = "random") -> None:
        if init not in INIT_STRATEGIES:
            raise MMSpecError(f"unknown init strategy {init!r}; choose from {', '.join(INIT_STRATEGIES)}")
        super().__init__(vocab_size)
        self.grid_size = int(grid_size)
        self.init = init

    def fresh_token(self, position: int, tokens: list[int], generator: torch.Generator | None,
                    device: torch.device) -> int:
        return initial_token(position, tokens, self.grid_size, self.vocab_size, self.init, generator, device)


class JacobiWindow(FixedDraftLength):
    """SJD's window W as the loop's draft-length policy; W = 0 is allowed (one token per forward)."""

    def __init__(self, num_tokens: int = 16) -> None:
        if num_tokens < 0:
            raise MMSpecError(f"window must be >= 0, got {num_tokens}")
        self.num_tokens = num_tokens


def jacobi_generate(
    target: CFGTarget | LlamaGenForClassConditional,
    class_labels: torch.LongTensor | int | list[int],
    *,
    window: int = 16,
    rule: ProbabilityRule = sjd_accept,
    init: str = "random",
    sampling: SamplingConfig = SamplingConfig(do_sample=True),
    generator: torch.Generator | None = None,
    guidance_scale: float = 1.0,
    method: str = "sjd",
    on_tokens: Callable[[int], None] | None = None,
    on_round: RoundHook | None = None,
) -> ImageTokensOutput:
    """Generate one token grid per class label with SJD (or GSD / LANTERN via `rule`).

    `rule(draft_tokens, draft_probs, target_probs, generator) -> Verdict` (see `image_ar.rules`;
    bind extra options with functools.partial). Images are generated one at a time; the CFG rows
    of each share one forward. Stats: target_forwards counts forwards (CFG rows included in one),
    `stats.tau` is the step compression = image tokens / target forwards. `on_tokens(n)` is
    called with the number of tokens committed each round (progress bars), `on_round` as in `decode_grids`.
    """
    policy = JacobiWindow(window)
    cfg = as_cfg_target(target, guidance_scale)
    drafter = GridJacobiDrafter(cfg.vocab_size, cfg.grid_size, init)
    return decode_grids(cfg, drafter, class_labels, rule=on_target_probabilities(rule), policy=policy,
                        sampling=sampling, generator=generator, method=method, on_tokens=on_tokens, on_round=on_round)
