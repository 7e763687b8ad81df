"""Speculative decoding of image tokens with a separate small AR drafter, through the core loop.

The core `SpeculativeDecoder` hosts this path unchanged (`image_ar.decode.decode_grids`); the
target is a `GuidedImageTarget` (`image_ar.target`: the sequence is [condition, t_1, ..., t_n],
logits classifier-free guided) and the drafter

    GuidedImageDrafter  a small LlamaGen with the same codebook, guided the same way, samples k
                        tokens from its warped distribution and keeps q for the acceptance rule

Acceptance: the core's lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023) or
greedy match, or LANTERN's relaxed acceptance (Jang et al. 2024, "LANTERN: Accelerating Visual
Autoregressive Models with Relaxed Speculative Decoding") via `lantern_rule`. Rejected drafts are
dropped by cropping both caches (`LlamaGenCache.crop`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from mmspec.drafters.autoregressive import AutoregressiveDrafter, common_prefix_length
from mmspec.drafters.base import DraftView
from mmspec.errors import MMSpecError
from mmspec.policies import DraftLengthPolicy, FixedDraftLength
from mmspec.rule_capabilities import RuleCapabilities, declare_rule
from mmspec.rules import AcceptanceRule, greedy_match, speculative_sampling
from mmspec.sampling import SamplingConfig, probabilities
from mmspec.types import Proposal, Verdict

from .decode import RoundHook, as_cfg_target, decode_grids
from .llamagen import LlamaGenForClassConditional
from .rules import lantern_accept, resolve_draft_probs
from .target import CFGTarget, ImageTokensOutput


class GuidedImageDrafter(AutoregressiveDrafter):
    """A small class-conditional AR model as drafter, with its own cache and the target's guidance.

    Like `ModelDrafter`, its cache is synchronised lazily: cropped to the prefix it shares with
    the committed sequence, then fed the rest (one or two tokens after a round).
    """

    def __init__(self, model: LlamaGenForClassConditional | CFGTarget, guidance_scale: float = 1.0) -> None:
        self.cfg = as_cfg_target(model, guidance_scale)
        self.vocab_size = self.cfg.vocab_size
        self.cached_tokens = torch.empty(0, dtype=torch.long, device=self.cfg.model.device)

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.cfg.forwards

    def bind(self, target: Any) -> None:
        cfg = getattr(target, "cfg", None)
        if cfg is not None:
            if cfg.num_tokens != self.cfg.num_tokens:
                raise MMSpecError(f"drafter makes {self.cfg.num_tokens} image tokens, the target {cfg.num_tokens}")
            theirs = getattr(cfg.config, "num_classes", None)
            if theirs is not None and theirs != self.cfg.config.num_classes:
                raise MMSpecError(f"drafter has {self.cfg.config.num_classes} classes, the target {theirs}")

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        self.cfg.cache = None
        self.cached_tokens = torch.empty(0, dtype=torch.long, device=view.sequence.device)

    def catch_up(self, sequence: torch.Tensor) -> torch.Tensor:
        """Align the cache with `sequence` = [condition, tokens...]; guided next-token logits [1, V]."""
        keep = min(common_prefix_length(self.cached_tokens, sequence), sequence.shape[0] - 1)
        if self.cfg.cache is None or keep == 0:
            tokens = sequence[None, 1:] if sequence.shape[0] > 1 else None
            return self.cfg.start(sequence[:1], tokens)[:, -1]
        self.cfg.truncate(keep - 1)
        return self.cfg.extend(sequence[None, keep:])[:, -1]

    def feed(self, token: torch.Tensor) -> torch.Tensor:
        return self.cfg.extend(token[:, None])[:, -1]


def lantern_rule(neighbours: torch.LongTensor, delta: float = 0.0, lam: float | None = None,
                 observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> AcceptanceRule:
    """LANTERN's relaxed acceptance as a core `AcceptanceRule` (see `image_ar.rules.lantern_accept`).

    Sampling: p and q are warped exactly as `speculative_sampling` warps them and the rule draws the
    same randomness, so delta = 0 reproduces plain speculative sampling token for token.
    Greedy: p is one-hot, no neighbour carries mass, and the rule is the exact greedy match.
    `observe(q, p)`, if given, sees the first draft's q [B, V] and the target's p [B, V] of every
    sampled step (the bench's output-law measurement).
    """

    def rule(proposal: Proposal, target_logits: torch.Tensor, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Verdict:
        if not sampling.do_sample:
            return greedy_match(proposal, target_logits, sampling, generator)
        p = probabilities(target_logits, sampling)
        if observe is not None and proposal.tokens.shape[1]:
            q = resolve_draft_probs(proposal.tokens, proposal.probs, p)
            observe(q[:, 0], p[:, 0])
        return lantern_accept(proposal.tokens, proposal.probs, p, generator, neighbours=neighbours, delta=delta, lam=lam)

    return declare_rule(RuleCapabilities(settings={"delta": delta, "lam": lam, "neighbours": int(neighbours.shape[-1])}))(rule)


def draft_generate(
    target: CFGTarget | LlamaGenForClassConditional,
    drafter: GuidedImageDrafter | LlamaGenForClassConditional,
    class_labels: torch.LongTensor | int | list[int],
    *,
    num_draft_tokens: int = 4,
    rule: AcceptanceRule | None = None,
    sampling: SamplingConfig = SamplingConfig(do_sample=True),
    generator: torch.Generator | None = None,
    guidance_scale: float = 1.0,
    policy: DraftLengthPolicy | None = None,
    method: str = "sd",
    on_tokens: Callable[[int], None] | None = None,
    on_round: RoundHook | None = None,
) -> ImageTokensOutput:
    """Generate one token grid per class label: drafter proposes k tokens, the target verifies k + 1.

    `rule`: None = lossless speculative sampling (greedy match when not sampling), or
    `lantern_rule(...)`. Both models are guided with `guidance_scale` (unless already wrapped).
    Stats are summed over the images; `stats.tau` is the step compression (tokens / target forwards).
    """
    cfg = as_cfg_target(target, guidance_scale)
    if not isinstance(drafter, GuidedImageDrafter):
        drafter = GuidedImageDrafter(drafter, cfg.guidance_scale)
    rule = rule or (speculative_sampling if sampling.do_sample else greedy_match)
    return decode_grids(cfg, drafter, class_labels, rule=rule, policy=policy or FixedDraftLength(num_draft_tokens),
                        sampling=sampling, generator=generator, method=method, on_tokens=on_tokens, on_round=on_round)
