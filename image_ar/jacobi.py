"""Speculative Jacobi decoding (SJD) for class-conditional AR image models.

Its own loop (not the core's draft/verify loop: the drafter is the previous Jacobi iterate), reusing
mmspec's `SpecStats`, sampling utilities and the rule contract of `image_ar.rules`:

    state: n committed tokens; the newest is "pending" (not yet in the KV cache);
           drafts y_1..y_w for positions n .. n + w - 1 with the distributions d they came from
    repeat until all N = h * w tokens are committed:
        w = min(window, N - n - 1)                 # the bonus row must still be an image position
        top the drafts up to w: fresh tokens (random / copied from the left / from the row above),
            each with a one-hot d
        ONE target forward over [pending, y_1..y_w] -> p_0..p_w (guided, warped)
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

from mmspec.errors import MMSpecError
from mmspec.sampling import SamplingConfig, probabilities, randint, sample
from mmspec.stats import SpecStats

from .llamagen import LlamaGenForClassConditional
from .rules import sjd_accept
from .target import CFGTarget, ImageTokensOutput

INIT_STRATEGIES = ("random", "left", "above", "spatial")


def target_distribution(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Warped probabilities when sampling; one-hot on the argmax when greedy."""
    if sampling.do_sample:
        return probabilities(logits, sampling)
    return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()


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


def jacobi_generate(
    target: CFGTarget | LlamaGenForClassConditional,
    class_labels: torch.LongTensor | int | list[int],
    *,
    window: int = 16,
    rule: Callable = sjd_accept,
    init: str = "random",
    sampling: SamplingConfig = SamplingConfig(do_sample=True),
    generator: torch.Generator | None = None,
    guidance_scale: float = 1.0,
    method: str = "sjd",
    on_tokens: Callable[[int], None] | None = None,
) -> ImageTokensOutput:
    """Generate one token grid per class label with SJD (or GSD / LANTERN via `rule`).

    `rule(draft_tokens, draft_probs, target_probs, generator) -> Verdict` (see `image_ar.rules`;
    bind extra options with functools.partial). Images are generated one at a time; the CFG rows
    of each share one forward. Stats: target_forwards counts forwards (CFG rows included in one),
    `stats.tau` is the step compression = image tokens / target forwards. `on_tokens(n)` is
    called with the number of tokens committed each round (progress bars).
    """
    if window < 0:
        raise MMSpecError(f"window must be >= 0, got {window}")
    if init not in INIT_STRATEGIES:
        raise MMSpecError(f"unknown init strategy {init!r}; choose from {', '.join(INIT_STRATEGIES)}")
    if not isinstance(target, CFGTarget):
        target = CFGTarget(target, guidance_scale)
    labels = torch.as_tensor(class_labels, dtype=torch.long, device=target.model.device).reshape(-1)
    stats = SpecStats(method=method)
    grids = []
    for label in labels:
        grids.append(_generate_one(target, label[None], window, rule, init, sampling, generator, stats, on_tokens))
    return ImageTokensOutput(tokens=torch.stack(grids), stats=stats)


def _generate_one(target: CFGTarget, label, window, rule, init, sampling, generator, stats: SpecStats, on_tokens=None) -> torch.LongTensor:
    total, vocab, grid = target.num_tokens, target.vocab_size, target.grid_size
    device = target.model.device
    committed: list[int] = []
    drafts: list[int] = []  # carried drafts for positions len(committed) ...
    draft_probs = torch.empty(1, 0, vocab, device=device)
    with stats.timer("total"):
        while len(committed) < total:
            n = len(committed)
            width = min(window, total - n - 1)
            with stats.timer("draft"):
                drafts, draft_probs = drafts[:width], draft_probs[:, :width]
                fresh = []
                while len(drafts) < width:
                    token = initial_token(n + len(drafts), committed + drafts, grid, vocab, init, generator, device)
                    drafts.append(token)
                    fresh.append(token)
                if fresh:
                    one_hot = torch.nn.functional.one_hot(torch.tensor(fresh, device=device), vocab).to(draft_probs.dtype)
                    draft_probs = torch.cat([draft_probs, one_hot[None]], dim=1)
            draft_tokens = torch.tensor([drafts], dtype=torch.long, device=device).view(1, width)
            with stats.timer("prefill" if n == 0 else "verify"):
                if n == 0:
                    logits = target.start(label, draft_tokens if width else None)
                else:
                    logits = target.extend(torch.cat([torch.tensor([[committed[-1]]], device=device), draft_tokens], dim=1))
                p = target_distribution(logits, sampling)
                verdict = rule(draft_tokens, draft_probs, p, generator)
            accepted = int(verdict.num_accepted[0])
            committed += drafts[:accepted] + [int(verdict.next_token[0])]
            target.truncate(n + accepted)
            stats.target_forwards += 1
            stats.new_tokens += accepted + 1
            stats.record_round(width, accepted)
            if on_tokens is not None:
                on_tokens(accepted + 1)
            # Jacobi update: the target's own samples at the unaccepted rows become the next drafts.
            rest = p[0, accepted + 1 :]
            if rest.shape[0]:
                drafts = sample(rest, generator).tolist()
                draft_probs = rest[None]
            else:
                drafts, draft_probs = [], p.new_zeros(1, 0, vocab)
    return torch.tensor(committed, device=device).view(grid, grid)
