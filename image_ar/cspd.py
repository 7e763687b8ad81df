"""Continuous speculative decoding (CSpD; Wang et al. 2024, "Continuous Speculative Decoding for
Autoregressive Image Generation"; MarkXCloud/CSpD, MIT) for MAR-style models, and the target-only
loop it is measured against.

Both loops follow MAR's random order and cosine schedule. CSpD:

- denoising trajectory alignment: one bank of initial and per-step diffusion noise per token
  position, shared by draft and target heads;
- token pre-filling: the target itself generates steps 0..floor(prefill_ratio x num_iter), as the
  official runner does (the draft's early tokens, made from almost nothing, are the least alike);
- drafting: the draft model runs the next `num_draft` steps of the schedule; the target then runs
  ONE forward conditioned on the tokens known before the window and samples every window token with
  the same noise, which gives its density there;
- acceptance: each window token x is kept when U < min(1, p(x) / q(x)), with the densities of
  `token_density.LastStepGaussian` (the last denoising step's Gaussian with the trajectory's variance
  correction; `inner_temperature` scales the exponent as the official runner's 42 does, 1 = none);
- rejection: a rejected token is redrawn from norm(max(0, p - q)) by acceptance-rejection sampling
  with the proposal p and the bound M = 1 (max(0, p - q) <= p): a draw x' ~ p is kept with
  probability max(0, 1 - q(x') / p(x')), at most `max_tries` times; a token never kept takes the last
  draw of p (the official code leaves a zero vector; `stats.residual_fallbacks` counts them).

Tokens of a window are accepted or redrawn independently, as in the paper, because MAR samples the
tokens of one step independently given the known ones: the output is distributed as the target's
own sampling on the schedule in which each verified window is one step (`cspd_schedule` gives it;
the distribution test compares against exactly that), when the densities are exact. For a diffusion
head the paper's densities are an approximation, so CSpD there is close to, not provably equal to,
the target's distribution.

What that means for speed: with exact densities, CSpD's output is the target's own on the coarser
schedule, which the target alone samples with the same number of its forwards and no draft at all
(the bench's `ar N steps` row); CSpD can only be ahead of that row by keeping drafted tokens beyond
what the exact ratio allows (the official inner temperature), i.e. by not sampling the target's law.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from mmspec.errors import MMSpecError
from mmspec.sampling import rand, seeded_generator

from .image_stats import StepStats, WindowRecord
from .masked_decode import ContinuousTokenModel, cfg_scale, check_generation, cosine_lefts, mask_by_order


@dataclass
class CSpDOutput:
    """tokens [B, L, C]; stats: a `StepStats` (target / drafter forwards, drafted and accepted window tokens,
    timings, the schedule followed, one `WindowRecord` per verified window with its residual fallbacks)."""

    tokens: torch.Tensor
    stats: StepStats


def prefill_steps(num_iter: int, prefill_ratio: float) -> int:
    """Steps the target generates itself: 0..floor(ratio x num_iter), as the official runner."""
    return min(num_iter, math.floor(prefill_ratio * num_iter) + 1)


def cspd_schedule(num_iter: int, seq_len: int, num_draft: int, prefill_ratio: float) -> list[int]:
    """The target-only schedule (unknown tokens after each step) CSpD's output is distributed as:
    the pre-filled steps, then one step per verified window of `num_draft` drafted steps."""
    lefts = cosine_lefts(num_iter, seq_len)
    first = prefill_steps(num_iter, prefill_ratio)
    drafted = lefts[first:]
    return lefts[:first] + [drafted[min(i + num_draft, len(drafted)) - 1] for i in range(0, len(drafted), num_draft)]


def accept_drafts(x: torch.Tensor, p: Any, q: Any, inner_temperature: float,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Bool [N]: U < min(1, p(x) / q(x)) per token, on log densities."""
    log_ratio = p.log_density(x, inner_temperature) - q.log_density(x, inner_temperature)
    u = rand((x.shape[0],), generator, x.device, torch.float64)
    return u.log() < log_ratio.double()


def sample_residual(p: Any, q: Any, max_tries: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draws from norm(max(0, p - q)) per row by acceptance-rejection with proposal p and bound 1.

    Returns (samples [N, C], kept [N] bool); a row never kept holds the last draw of p.
    """
    out = p.draw(generator)
    kept = torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
    for _ in range(max_tries):
        proposal = p.draw(generator)
        keep_prob = (1 - (q.log_density(proposal, 1.0) - p.log_density(proposal, 1.0)).double().exp()).clamp_min(0)
        take = ~kept & (rand((out.shape[0],), generator, out.device, torch.float64) < keep_prob)
        out = torch.where((take | ~kept)[:, None], proposal.to(out.dtype), out)
        kept |= take
        if bool(kept.all()):
            break
    return out, kept


def _check_pair(draft: ContinuousTokenModel, target: ContinuousTokenModel, num_draft: int, prefill_ratio: float,
                inner_temperature: float, max_tries: int) -> None:
    if (draft.seq_len, draft.token_embed_dim) != (target.seq_len, target.token_embed_dim):
        raise MMSpecError(f"draft and target must make the same tokens: draft {draft.seq_len} x {draft.token_embed_dim}, "
                          f"target {target.seq_len} x {target.token_embed_dim}")
    if not (draft.supports_density and target.supports_density):
        raise MMSpecError("continuous speculative decoding needs DDPM heads on both models (DDIM tokens have no density)")
    steps = [getattr(m, "denoising_timesteps", None) for m in (draft, target)]  # optional in the protocol
    if None not in steps and steps[0] != steps[1]:
        raise MMSpecError(f"draft and target must denoise on the same timesteps to align their trajectories: draft "
                          f"{_timesteps(steps[0])}, target {_timesteps(steps[1])} (set the same num_sampling_steps and "
                          f"timestep_spacing)")
    if num_draft < 1:
        raise MMSpecError(f"num_draft must be >= 1, got {num_draft}")
    if not 0 <= prefill_ratio < 1:
        raise MMSpecError(f"prefill_ratio must be in [0, 1), got {prefill_ratio}")
    if inner_temperature <= 0:
        raise MMSpecError(f"inner_temperature must be > 0, got {inner_temperature}")
    if max_tries < 1:
        raise MMSpecError(f"max_tries must be >= 1, got {max_tries}")


def _timesteps(steps: tuple[int, ...]) -> str:
    return f"{len(steps)} steps from t = {steps[0]}" if steps else "no steps"


def _bank_shapes(banks: tuple[torch.Tensor, torch.Tensor | None]) -> tuple:
    return tuple(None if b is None else tuple(b.shape) for b in banks)


@torch.no_grad()
def cspd_generate(draft: ContinuousTokenModel, target: ContinuousTokenModel, batch_size: int, labels: Any = None,
                  num_iter: int = 64, num_draft: int = 8, prefill_ratio: float = 0.15, cfg: float = 1.0,
                  cfg_schedule: str = "linear", temperature: float = 1.0, inner_temperature: float = 1.0,
                  max_tries: int = 100, generator: torch.Generator | None = None,
                  draft_labels: Any = None, on_step: Callable[[int], None] | None = None) -> CSpDOutput:
    """Tokens [B, L, C] of `target` by continuous speculative decoding with `draft` (see the module docstring).

    Defaults as the official runner's (num_draft 8, prefill 0.15, 100 tries) except `inner_temperature`
    (official 42, a heuristic that raises acceptance at the cost of exactness; 1 = the paper's ratio).
    `draft_labels` defaults to `labels` (give it when the draft has its own class numbering).
    `on_step(left)` runs after each step of the schedule, drafted or not (a progress bar).
    """
    check_generation(target, batch_size, num_iter, cfg, cfg_schedule, temperature)
    check_generation(draft, batch_size, num_iter, cfg, cfg_schedule, temperature)
    _check_pair(draft, target, num_draft, prefill_ratio, inner_temperature, max_tries)
    first = prefill_steps(num_iter, prefill_ratio)
    stats = StepStats(method="cspd", prefill_steps=first)
    start = time.perf_counter()
    orders = target.sample_orders(batch_size, generator)
    banks = target.noise_banks(batch_size, generator)
    shapes = [_bank_shapes(m.noise_banks(1, seeded_generator("cpu", 0))) for m in (draft, target)]
    if shapes[0] != shapes[1]:
        raise MMSpecError("draft and target must share the diffusion noise (same num_sampling_steps and token size) "
                          "to align their denoising trajectories")
    target_cond = target.class_embedding(labels, batch_size, cfg)
    draft_cond = draft.class_embedding(labels if draft_labels is None else draft_labels, batch_size, cfg)
    device = target.device
    tokens = torch.zeros(batch_size, target.seq_len, target.token_embed_dim, device=device)
    unknown = torch.ones(batch_size, target.seq_len, dtype=torch.bool, device=device)
    lefts = cosine_lefts(num_iter, target.seq_len)
    window: list[tuple[torch.Tensor, Any]] = []  # (predict mask, draft density) per drafted step
    known_before = unknown
    for step, left in enumerate(lefts):
        still = mask_by_order(left, orders)
        predict = unknown & ~still
        scale = cfg_scale(cfg, cfg_schedule, target.seq_len, left)
        if step < first:
            with stats.timer("prefill"):
                density = target.propose(tokens, unknown, predict, target_cond, scale, temperature, *banks)
            tokens[predict] = density.tokens.to(tokens.dtype)
            stats.target_forwards += 1
            stats.schedule.append(left)
        else:
            if not window:
                known_before = unknown
            with stats.timer("draft"):
                density = draft.propose(tokens, unknown, predict, draft_cond, scale, temperature, *banks)
            tokens[predict] = density.tokens.to(tokens.dtype)
            stats.drafter_forwards += 1
            window.append((predict, density))
            if len(window) == num_draft or left == 0:
                with stats.timer("verify"):
                    _verify(target, tokens, known_before, window, target_cond, scale, temperature, banks,
                            inner_temperature, max_tries, generator, stats, left)
                window = []
                stats.schedule.append(left)
        unknown = still
        if on_step is not None:
            on_step(left)
    stats.new_tokens = batch_size * target.seq_len
    stats.total_time = time.perf_counter() - start
    return CSpDOutput(tokens=tokens, stats=stats)


def _verify(target: ContinuousTokenModel, tokens: torch.Tensor, known_before: torch.Tensor,
            window: list[tuple[torch.Tensor, Any]], cond: torch.Tensor, scale: float, temperature: float, banks: tuple,
            inner_temperature: float, max_tries: int, generator: torch.Generator | None, stats: StepStats,
            left: int) -> None:
    """One target forward over the window's tokens; accepts or redraws each in place; records the window
    (`left`: tokens unknown after it) in `stats`."""
    length = tokens.shape[1]
    drafted = torch.zeros_like(known_before)
    flat_parts, densities = [], []
    for predict, density in window:
        drafted |= predict
        where = predict.nonzero(as_tuple=True)
        flat_parts.append(where[0] * length + where[1])
        densities.append(density)
    # target rows come in row-major position order; put the draft's rows in the same order
    q = type(densities[0]).cat(densities).rows(torch.cat(flat_parts).argsort())
    p = target.propose(tokens, known_before, drafted, cond, scale, temperature, *banks)
    stats.target_forwards += 1
    where = drafted.nonzero(as_tuple=True)
    x = tokens[where]
    accepted = accept_drafts(x, p, q, inner_temperature, generator)
    redrawn, kept = sample_residual(p.rows(~accepted), q.rows(~accepted), max_tries, generator)
    x[~accepted] = redrawn.to(x.dtype)
    tokens[where] = x
    drafted_count, accepted_count = int(x.shape[0]), int(accepted.sum())
    stats.rounds += 1
    stats.drafted += drafted_count
    stats.accepted += accepted_count
    stats.windows.append(WindowRecord(steps=len(window), drafted=drafted_count, accepted=accepted_count,
                                      residual_fallbacks=int((~kept).sum()), left=left))
