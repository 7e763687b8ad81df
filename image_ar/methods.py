"""One entry point for every image-AR decoding method: a method name and its options -> the core loop's
drafter, acceptance rule and draft-length policy (`MethodRunner.loop_parts`; table in `image_ar.decode`).

    ar       plain autoregressive sampling, one target forward per token (the baseline)
    sd       speculative sampling with a small AR drafter (lossless; `draft_generate`)
    sjd      speculative Jacobi decoding (Teng et al. 2024; lossless; `jacobi_generate`)
    gsd      grouped speculative decoding on SJD's Jacobi drafts (So et al. 2025; relaxed)
    lantern  LANTERN's relaxed acceptance (Jang et al. 2024) on the drafter's drafts, or on SJD's
             Jacobi drafts when there is no drafter (or `drafts="jacobi"`)

Used by the pipeline and the benchmark, so both run exactly the same code for a method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from mmspec.drafters import Drafter, NoDrafter
from mmspec.errors import MMSpecError
from mmspec.policies import DraftLengthPolicy, FixedDraftLength
from mmspec.rule_capabilities import RuleCapabilities
from mmspec.rules import AcceptanceRule, greedy_match, on_target_probabilities, speculative_sampling, target_choice
from mmspec.sampling import SamplingConfig

from .decode import RoundHook, decode_grids
from .draft_generate import GuidedImageDrafter, lantern_rule
from .jacobi import INIT_STRATEGIES, GridJacobiDrafter, JacobiWindow
from .llamagen import LlamaGenForClassConditional
from .rules import (
    GSD_DISTANCE_THRESHOLD,
    GSD_LATENTS,
    GSD_PROB_THRESHOLD,
    GSD_WINDOW,
    LANTERN_DELTA,
    LANTERN_K,
    gsd_accept,
    gsd_rank_window,
    lantern_accept,
    lantern_neighbours,
    resolve_draft_probs,
    sjd_accept,
)
from .target import CFGTarget, ImageTokensOutput

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
    lantern_delta: LANTERN's budget in [0, 1]: the total variation between p and each candidate's
        boosted distribution (not between p and the output law; see `rules.lantern_accept`);
        lantern_k: nearest codebook neighbours considered, 1 <= k < codebook size (checked against the
        model by `MethodRunner.check`; the defaults are the authors' for LlamaGen's 16384 codes, so a
        small codebook needs its own, e.g. from the model card); lantern_lam: LANTERN++'s lambda
        (p~(x) <= lam p(x)), replaces delta when set.
    gsd_window, gsd_prob_threshold, gsd_distance_threshold, gsd_latents: GSD's group (rank window W:
        W tokens less probable than the draft and W - 1 more probable, the authors' slice; probability
        gap; squared L2 distance threshold; None disables a filter) and what the distance is measured
        on: "embeddings" = the AR model's input token embeddings (the authors'), or "codebook" = the
        VQ code vectors the decoder looks up.
    """

    method: str = "sjd"
    window: int = 16
    init: str = "left"
    num_draft_tokens: int = 4
    drafts: str = "auto"
    lantern_delta: float = LANTERN_DELTA
    lantern_k: int = LANTERN_K
    lantern_lam: float | None = None
    gsd_window: int | tuple[int, int] = GSD_WINDOW
    gsd_prob_threshold: float | None = GSD_PROB_THRESHOLD
    gsd_distance_threshold: float | None = GSD_DISTANCE_THRESHOLD
    gsd_latents: str = "embeddings"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise MMSpecError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.drafts not in DRAFT_SOURCES:
            raise MMSpecError(f"drafts must be one of {', '.join(DRAFT_SOURCES)}, got {self.drafts!r}")
        if self.init not in INIT_STRATEGIES:
            raise MMSpecError(f"unknown init strategy {self.init!r}; choose from {', '.join(INIT_STRATEGIES)}")
        if self.window < 0 or self.num_draft_tokens < 1:
            raise MMSpecError("window must be >= 0 and num_draft_tokens >= 1")
        gsd_rank_window(self.gsd_window)  # an int >= 0, or a (below, above) pair
        if self.gsd_latents not in GSD_LATENTS:
            raise MMSpecError(f"gsd_latents must be one of {', '.join(GSD_LATENTS)}, got {self.gsd_latents!r}")
        if isinstance(self.lantern_k, bool) or not isinstance(self.lantern_k, int) or self.lantern_k < 1:
            raise MMSpecError(f"lantern_k (LANTERN's codebook neighbours) must be an integer >= 1, got {self.lantern_k!r}")
        if not 0.0 <= self.lantern_delta <= 1.0:
            raise MMSpecError(f"lantern_delta is a total-variation budget in [0, 1], got {self.lantern_delta}")
        if self.lantern_lam is not None and not self.lantern_lam >= 1.0:
            raise MMSpecError(f"lantern_lam (LANTERN++'s lambda) must be >= 1, got {self.lantern_lam}")

    def settings(self, has_drafter: bool) -> dict[str, Any]:
        """The options this method reads, by name (what a run used; for outputs and the CLI's --json)."""
        names = {"ar": (), "sd": ("num_draft_tokens",), "sjd": ("window", "init"),
                 "gsd": ("window", "init", "gsd_window", "gsd_prob_threshold", "gsd_distance_threshold", "gsd_latents"),
                 "lantern": ("lantern_delta", "lantern_k", "lantern_lam")}[self.method]
        if self.method == "lantern":
            drafter = self.uses_drafter(has_drafter)
            names = ("drafts", *names, *(("num_draft_tokens",) if drafter else ("window", "init")))
            return {name: getattr(self, name) for name in names} | {"drafts": "drafter" if drafter else "jacobi"}
        return {name: getattr(self, name) for name in names}

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
        codebook: the code vectors the VQ decoder looks up [V, D] (LANTERN neighbours; GSD distances
            with gsd_latents="codebook").
        embeddings: the AR model's input embedding of each code [V, D'] (GSD distances, the default);
            None = `target.token_embeddings()`, read when first needed.
    """

    def __init__(
        self,
        target: CFGTarget,
        drafter: LlamaGenForClassConditional | CFGTarget | None = None,
        codebook: torch.Tensor | None = None,
        embeddings: torch.Tensor | None = None,
    ) -> None:
        self.target = target
        self.drafter_model = drafter
        self.codebook = None if codebook is None else codebook.detach().float()
        if self.codebook is not None and self.codebook.shape[0] != target.vocab_size:
            raise MMSpecError(f"the codebook has {self.codebook.shape[0]} codes but the model predicts {target.vocab_size}")
        self._embeddings = None if embeddings is None else embeddings.detach().float()
        if self._embeddings is not None and self._embeddings.shape[0] != target.vocab_size:
            raise MMSpecError(f"the token embeddings have {self._embeddings.shape[0]} rows but the model predicts "
                              f"{target.vocab_size} codes")
        if drafter is not None:
            codes = drafter.vocab_size if isinstance(drafter, CFGTarget) else drafter.config.vocab_size
            if codes != target.vocab_size:
                raise MMSpecError(f"drafter and target codebooks differ ({codes} vs {target.vocab_size} codes)")
        self._neighbours: dict[int, torch.LongTensor] = {}

    @property
    def embeddings(self) -> torch.Tensor:
        """The AR model's input token embeddings [V, D] (GSD's latent distances, as the authors measure them)."""
        if self._embeddings is None:
            self._embeddings = self.target.token_embeddings().detach().float()
        return self._embeddings

    def gsd_latents(self, kind: str) -> torch.Tensor:
        """The vectors GSD's distance filter compares: "embeddings" (default) or "codebook"."""
        if kind == "codebook":
            if self.codebook is None:
                raise MMSpecError("GSD with gsd_latents='codebook' needs the VQ codebook; none was given")
            return self.codebook
        return self.embeddings

    def check_lantern_k(self, k: int) -> None:
        """One clear error when LANTERN's neighbourhood does not fit the codebook."""
        if self.codebook is None:
            raise MMSpecError("LANTERN needs the VQ codebook to find latent neighbours; none was given")
        codes = self.codebook.shape[0]
        if not 1 <= k < codes:
            raise MMSpecError(
                f"LANTERN's neighbourhood lantern_k={k} does not fit this {codes}-code codebook: it must be in "
                f"[1, {codes - 1}] (the default {LANTERN_K} is the authors' for a 16384-code codebook). Set lantern_k "
                "(CLI: --lantern-k), or give the model card lantern_defaults")

    def check(self, config: MethodConfig) -> None:
        """Validate a method config against this model before any generation (codebook size, drafter)."""
        self.check_drafter(config)
        if config.method == "lantern":
            self.check_lantern_k(config.lantern_k)
        if config.method == "gsd" and config.gsd_latents == "codebook" and self.codebook is None:
            raise MMSpecError("GSD with gsd_latents='codebook' needs the VQ codebook; none was given")

    def check_drafter(self, config: MethodConfig) -> None:
        if config.uses_drafter(self.drafter_model is not None) and self.drafter_model is None:
            raise MMSpecError(f"method {config.method!r} with drafter drafts needs a drafter (a drafter/ folder, or drafter=...)")

    def neighbours(self, k: int) -> torch.LongTensor:
        """LANTERN's k nearest codes of every code (computed once per k; 1 <= k < codebook size)."""
        self.check_lantern_k(k)
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
        prompts: Sequence[torch.Tensor | Sequence[int]] | None = None,
        on_tokens: Callable[[int], None] | None = None,
        on_round: RoundHook | None = None,
        observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ) -> ImageTokensOutput:
        """Token grids [N, h, w] for the labels, and the summed stats (`stats.method` = config.method).

        Every method runs through the core loop (`decode.decode_grids`) with the drafter, rule and
        draft-length policy of `loop_parts`. `on_tokens(n)` and `on_round(tokens, drafted, accepted,
        proposed)` are the core loop's per-round hooks. `observe(q, p)`, for LANTERN only, is called at every
        sampled acceptance step with the first draft's draft distribution q [B, V] and the target's
        p [B, V] (the bench measures the exact output law from them; `rules.lantern_output_law`).

        `guidance_scale` (None: the target's) and `prompts` (text-conditional targets: what condition i means)
        belong to this call: it runs on its own copies of the target and drafter (`CFGTarget.for_call`), so
        calls at once through one runner do not meet.
        """
        self.check(config)
        target = self.target.for_call(guidance_scale, prompts)
        drafter, rule, policy = self.loop_parts(config, sampling, observe, target, prompts)
        return decode_grids(target, drafter, class_labels, rule=rule, policy=policy, sampling=sampling,
                            generator=generator, method=config.method, on_tokens=on_tokens, on_round=on_round)

    def loop_parts(self, config: MethodConfig, sampling: SamplingConfig,
                   observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                   target: CFGTarget | None = None, prompts: Sequence[torch.Tensor | Sequence[int]] | None = None,
                   ) -> tuple[Drafter, AcceptanceRule, DraftLengthPolicy]:
        """The core loop's drafter, acceptance rule and draft-length policy for a method (see `decode`);
        a drafter model is guided like `target` (the call's; default this runner's) and reads its `prompts`."""
        method = config.method
        if config.uses_drafter(self.drafter_model is not None):
            rule = speculative_sampling if sampling.do_sample else greedy_match
            if method == "lantern":
                rule = lantern_rule(self.neighbours(config.lantern_k), delta=config.lantern_delta, lam=config.lantern_lam,
                                    observe=observe)
            return self.drafter(config, target, prompts), rule, FixedDraftLength(config.num_draft_tokens)
        if method == "ar":
            return self.drafter(config), target_choice, FixedDraftLength(1)
        drafter = self.drafter(config)
        settings: dict[str, Any] = {}
        if method == "sjd":
            rule = sjd_accept
        elif method == "gsd":
            settings = {"window": config.gsd_window, "prob_threshold": config.gsd_prob_threshold,
                        "distance_threshold": config.gsd_distance_threshold}
            rule = partial(gsd_accept, **settings, embeddings=self.gsd_latents(config.gsd_latents))
        else:
            settings = {"delta": config.lantern_delta, "lam": config.lantern_lam, "neighbours": config.lantern_k}
            rule = partial(lantern_accept, neighbours=self.neighbours(config.lantern_k), delta=config.lantern_delta,
                           lam=config.lantern_lam)
            if observe is not None and sampling.do_sample:
                rule = observed(rule, observe)
        return drafter, on_target_probabilities(rule, RuleCapabilities(settings=settings)), JacobiWindow(config.window)

    def drafter(self, config: MethodConfig, target: CFGTarget | None = None,
                prompts: Sequence[torch.Tensor | Sequence[int]] | None = None) -> Drafter:
        """A fresh core-loop drafter for a method: the guided drafter model (sd, LANTERN on drafter drafts; guided
        like `target`, reading `prompts`), Jacobi drafts over the grid (sjd, gsd, LANTERN on Jacobi drafts), or
        none (ar)."""
        self.check_drafter(config)
        if config.uses_drafter(self.drafter_model is not None):
            return self.guided_drafter(target, prompts)
        if config.method == "ar":
            return NoDrafter()
        return GridJacobiDrafter(self.target.vocab_size, self.target.grid_size, config.init)

    def guided_drafter(self, target: CFGTarget | None = None,
                       prompts: Sequence[torch.Tensor | Sequence[int]] | None = None) -> GuidedImageDrafter:
        """A fresh drafter over the drafter model, guided with `target`'s scale (the call's target; default this
        runner's) when it was trained with a null class; a guided drafter target gets its own copy for the call."""
        scale = (target or self.target).guidance_scale
        if isinstance(self.drafter_model, CFGTarget):
            return GuidedImageDrafter(self.drafter_model.for_call(scale, prompts))  # guided like the target
        # A drafter trained without a null class drafts unguided: still lossless, q is what it sampled from.
        guided = self.drafter_model.config.class_dropout_prob > 0
        return GuidedImageDrafter(self.drafter_model, scale if guided else 1.0)


def observed(rule: Callable, observe: Callable[[torch.Tensor, torch.Tensor], None]) -> Callable:
    """An image rule that first shows `observe` the first draft's q [B, V] and the target's p [B, V]."""

    def wrapped(draft_tokens, draft_probs, target_probs, generator=None):
        if draft_tokens.shape[1]:
            q = resolve_draft_probs(draft_tokens, draft_probs, target_probs)
            observe(q[:, 0], target_probs[:, 0])
        return rule(draft_tokens, draft_probs, target_probs, generator)

    return wrapped
