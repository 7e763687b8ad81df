"""One entry point for every image-AR decoding method: a method name and its options -> a loop and a rule.

    ar       plain autoregressive sampling, one target forward per token (the baseline)
    sd       speculative sampling with a small AR drafter (lossless; `draft_generate`)
    sjd      speculative Jacobi decoding (Teng et al. 2024; lossless; `jacobi_generate`)
    gsd      grouped speculative decoding on SJD's Jacobi drafts (So et al. 2025; relaxed)
    lantern  LANTERN's relaxed acceptance (Jang et al. 2024) on the drafter's drafts, or on SJD's
             Jacobi drafts when there is no drafter (or `drafts="jacobi"`)

Used by the pipeline and the benchmark, so both run exactly the same code for a method.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from mmspec.errors import MMSpecError
from mmspec.sampling import SamplingConfig
from mmspec.stats import SpecStats

from .draft_generate import GuidedImageDrafter, draft_generate, lantern_rule
from .jacobi import INIT_STRATEGIES, jacobi_generate
from .llamagen import LlamaGenForClassConditional
from .rules import GSD_DISTANCE_THRESHOLD, GSD_PROB_THRESHOLD, GSD_WINDOW, gsd_accept, lantern_accept, lantern_neighbours
from .target import CFGTarget, ImageTokensOutput, ar_generate

METHODS = ("ar", "sd", "sjd", "gsd", "lantern")
DRAFT_SOURCES = ("auto", "drafter", "jacobi")


@dataclass(frozen=True)
class MethodConfig:
    """A decoding method and its options (each method reads only its own).

    window: Jacobi window W of SJD / GSD / LANTERN-on-Jacobi drafts (SJD's default 16).
    init: how fresh Jacobi drafts start: random, left (copy the left neighbour; SJD's LlamaGen
        default), above, spatial.
    num_draft_tokens: k drafted per round by the drafter (sd, lantern with a drafter).
    drafts: where LANTERN's drafts come from: auto (the drafter if loaded, else Jacobi), drafter, jacobi.
    lantern_delta: LANTERN's total-variation budget per token; lantern_k: nearest codebook
        neighbours considered (clipped to the codebook size - 1); lantern_lam: LANTERN++'s lambda
        (p~(x) <= lam p(x)), replaces delta when set.
    gsd_window, gsd_prob_threshold, gsd_distance_threshold: GSD's group (rank window, probability
        gap, squared L2 distance between l2-normalised codebook vectors; None disables a filter).
    """

    method: str = "sjd"
    window: int = 16
    init: str = "left"
    num_draft_tokens: int = 4
    drafts: str = "auto"
    lantern_delta: float = 0.1
    lantern_k: int = 1000
    lantern_lam: float | None = None
    gsd_window: int = GSD_WINDOW
    gsd_prob_threshold: float | None = GSD_PROB_THRESHOLD
    gsd_distance_threshold: float | None = GSD_DISTANCE_THRESHOLD

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise MMSpecError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.drafts not in DRAFT_SOURCES:
            raise MMSpecError(f"drafts must be one of {', '.join(DRAFT_SOURCES)}, got {self.drafts!r}")
        if self.init not in INIT_STRATEGIES:
            raise MMSpecError(f"unknown init strategy {self.init!r}; choose from {', '.join(INIT_STRATEGIES)}")
        if self.window < 0 or self.num_draft_tokens < 1 or self.lantern_k < 1 or self.gsd_window < 0:
            raise MMSpecError("window and gsd_window must be >= 0; num_draft_tokens and lantern_k >= 1")

    def uses_drafter(self, has_drafter: bool) -> bool:
        if self.method == "sd":
            return True
        if self.method == "lantern":
            return self.drafts == "drafter" or (self.drafts == "auto" and has_drafter)
        return False


class MethodRunner:
    """A guided target, an optional drafter and the codebook, ready to run any method.

    Args:
        target: a `CFGTarget` (LlamaGen, or a subclass such as `JanusCFGTarget`).
        drafter: a small LlamaGen sharing the target's codebook and classes, or a guided target of the
            same family (e.g. a `JanusCFGTarget` of a smaller Janus; it is guided with the target's
            scale), or None (sd unavailable).
        codebook: the code vectors the VQ decoder looks up [V, D] (LANTERN neighbours, GSD distances).
    """

    def __init__(
        self,
        target: CFGTarget,
        drafter: LlamaGenForClassConditional | CFGTarget | None = None,
        codebook: torch.Tensor | None = None,
    ) -> None:
        self.target = target
        self.drafter_model = drafter
        self.codebook = None if codebook is None else codebook.detach().float()
        if self.codebook is not None and self.codebook.shape[0] != target.vocab_size:
            raise MMSpecError(f"the codebook has {self.codebook.shape[0]} codes but the model predicts {target.vocab_size}")
        if drafter is not None:
            codes = drafter.vocab_size if isinstance(drafter, CFGTarget) else drafter.config.vocab_size
            if codes != target.vocab_size:
                raise MMSpecError(f"drafter and target codebooks differ ({codes} vs {target.vocab_size} codes)")
        self._neighbours: dict[int, torch.LongTensor] = {}

    def neighbours(self, k: int) -> torch.LongTensor:
        """LANTERN's k nearest codes of every code (computed once per k)."""
        if self.codebook is None:
            raise MMSpecError("LANTERN needs the VQ codebook to find latent neighbours; none was given")
        k = min(k, self.codebook.shape[0] - 1)
        if k not in self._neighbours:
            self._neighbours[k] = lantern_neighbours(self.codebook, k)
        return self._neighbours[k]

    def run(
        self,
        config: MethodConfig,
        class_labels: list[int] | torch.LongTensor,
        *,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
        guidance_scale: float | None = None,
        on_tokens: Callable[[int], None] | None = None,
    ) -> ImageTokensOutput:
        """Token grids [N, h, w] for the labels, and the summed stats (`stats.method` = config.method)."""
        if guidance_scale is not None:
            self.target.guidance_scale = float(guidance_scale)
        target, method = self.target, config.method
        if config.uses_drafter(self.drafter_model is not None):
            if self.drafter_model is None:
                raise MMSpecError(f"method {method!r} with drafter drafts needs a drafter (a drafter/ folder, or drafter=...)")
            if isinstance(self.drafter_model, CFGTarget):
                self.drafter_model.guidance_scale = target.guidance_scale  # guided like the target
                drafter = GuidedImageDrafter(self.drafter_model)
            else:
                # A drafter trained without a null class drafts unguided: still lossless, q is what it sampled from.
                guided = self.drafter_model.config.class_dropout_prob > 0
                drafter = GuidedImageDrafter(self.drafter_model, target.guidance_scale if guided else 1.0)
            rule = None
            if method == "lantern":
                rule = lantern_rule(self.neighbours(config.lantern_k), delta=config.lantern_delta, lam=config.lantern_lam)
            return draft_generate(target, drafter, class_labels, num_draft_tokens=config.num_draft_tokens, rule=rule,
                                  sampling=sampling, generator=generator, method=method, on_tokens=on_tokens)
        if method == "ar":
            return self._ar(class_labels, sampling, generator, on_tokens)
        jacobi = partial(jacobi_generate, target, class_labels, window=config.window, init=config.init, sampling=sampling,
                         generator=generator, method=method, on_tokens=on_tokens)
        if method == "sjd":
            return jacobi()
        if method == "gsd":
            return jacobi(rule=partial(gsd_accept, window=config.gsd_window, prob_threshold=config.gsd_prob_threshold,
                                       embeddings=self.codebook, distance_threshold=config.gsd_distance_threshold))
        return jacobi(rule=partial(lantern_accept, neighbours=self.neighbours(config.lantern_k),
                                   delta=config.lantern_delta, lam=config.lantern_lam))

    def _ar(self, class_labels, sampling, generator, on_tokens) -> ImageTokensOutput:
        """AR decoding one image at a time, like every other method (batch 1), stats summed."""
        grids, stats = [], SpecStats(method="ar")
        for label in torch.as_tensor(class_labels, dtype=torch.long).reshape(-1).tolist():
            out = ar_generate(self.target, [label], sampling, generator, on_tokens=on_tokens)
            grids.append(out.tokens[0])
            stats = stats + out.stats
        return ImageTokensOutput(tokens=torch.stack(grids), stats=stats)
