"""Acceptance rules for visual AR models: SJD (lossless), GSD and LANTERN (relaxed).

Pure tensor functions in the style of `mmspec.rules`, clean-room from the papers' formulas:

    rule(draft_tokens [B, W], draft_probs [B, W, V] | None, target_probs [B, W + 1, V], generator) -> Verdict

- `target_probs[:, i]` is the target's (warped, guided) distribution for draft i; row W gives the
  bonus token when all W drafts are accepted.
- `draft_probs[:, i]` is the distribution draft i was sampled from (`d` in SJD, `q` for a drafter);
  `None` means deterministic drafts (one-hot, e.g. freshly initialised Jacobi tokens).
- The verdict holds how many drafts were accepted (left to right, stopping at the first rejection)
  and the token appended after them: on a rejection at position n a draw from that rule's residual
  at row n, otherwise the bonus draw from row W.

Randomness: each call draws exactly `torch.rand(B, W)` uniforms and then one multinomial sample per
row, in that order, from the caller's generator. All rules share this, so at their neutral
settings GSD reproduces SJD and LANTERN reproduces `mmspec.rules.speculative_sampling` draw for
draw. Each rule is split into `*_decide(..., uniforms) -> Decision` (deterministic given the
uniforms; tests compare it with slow re-statements) and the sampling wrapper `*_accept`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from mmspec.errors import MMSpecError
from mmspec.rules import accept_and_residual, leading_true_count
from mmspec.sampling import sample
from mmspec.types import Verdict

# (draft_tokens, draft_probs | None, target_probs, generator) -> Verdict
ImageRule = Callable[[torch.LongTensor, "torch.Tensor | None", torch.Tensor, "torch.Generator | None"], Verdict]


@dataclass
class Decision:
    """Accepted counts [B] and the distribution [B, V] the appended token is drawn from."""

    num_accepted: torch.LongTensor
    next_probs: torch.Tensor

    def sample(self, generator: torch.Generator | None) -> Verdict:
        return Verdict(num_accepted=self.num_accepted, next_token=sample(self.next_probs, generator))


def draw_uniforms(draft_tokens: torch.LongTensor, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    batch, width = draft_tokens.shape
    return torch.rand(batch, width, generator=generator, device=device)


def resolve_draft_probs(draft_tokens: torch.LongTensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> torch.Tensor:
    """Checks shapes; returns d [B, W, V] (one-hot on the drafted token when draft_probs is None)."""
    batch, width = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if target_probs.shape[:2] != (batch, width + 1):
        raise MMSpecError(
            f"target_probs must have W + 1 = {width + 1} positions for {width} drafts, got shape {tuple(target_probs.shape)}"
        )
    if draft_probs is None:
        return torch.nn.functional.one_hot(draft_tokens, vocab).to(target_probs.dtype)
    if draft_probs.shape != (batch, width, vocab):
        raise MMSpecError(f"draft_probs must be [B, W, V] = {(batch, width, vocab)}, got {tuple(draft_probs.shape)}")
    return draft_probs


def _decide(
    draft_tokens: torch.LongTensor,
    d: torch.Tensor,
    p: torch.Tensor,
    accepted: torch.Tensor,
    excluded: Callable[[torch.LongTensor], torch.Tensor] | None = None,
) -> Decision:
    """Accepted prefix, then the residual norm(max(p_n - d_n, 0)) at the first rejection n (core tail)."""
    num_accepted, next_probs = accept_and_residual(draft_tokens, d, p, accepted, excluded)
    return Decision(num_accepted=num_accepted, next_probs=next_probs)


# --------------------------------------------------------------------------- SJD


def sjd_decide(draft_tokens, draft_probs, target_probs, uniforms) -> Decision:
    """SJD's probabilistic Jacobi acceptance: accept x_i iff u_i * d_i(x_i) <= p_i(x_i)
    (probability min(1, p_i(x_i) / d_i(x_i))); at the first rejection draw from norm(max(p_i - d_i, 0))."""
    d = resolve_draft_probs(draft_tokens, draft_probs, target_probs)
    width = draft_tokens.shape[1]
    x = draft_tokens[..., None]
    p_x = target_probs[:, :width].gather(-1, x).squeeze(-1)
    d_x = d.gather(-1, x).squeeze(-1)
    return _decide(draft_tokens, d, target_probs, uniforms * d_x <= p_x)


def sjd_accept(draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
    """Speculative Jacobi decoding's acceptance (Teng et al. 2024); lossless (see `sjd_decide`)."""
    uniforms = draw_uniforms(draft_tokens, generator, target_probs.device)
    return sjd_decide(draft_tokens, draft_probs, target_probs, uniforms).sample(generator)


# --------------------------------------------------------------------------- GSD

GSD_WINDOW = 7
GSD_PROB_THRESHOLD = 0.15
GSD_DISTANCE_THRESHOLD = 0.5


def squared_distances_to(embeddings: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
    """Squared L2 distance from the embedding of each token [...] to every embedding: [..., V]."""
    e = embeddings.float()
    a = e[tokens]
    return ((a * a).sum(-1, keepdim=True) + (e * e).sum(-1) - 2 * a @ e.T).clamp(min=0)


def gsd_group_mask(
    draft_tokens: torch.LongTensor,
    target_probs: torch.Tensor,
    *,
    window: int = GSD_WINDOW,
    prob_threshold: float | None = GSD_PROB_THRESHOLD,
    embeddings: torch.Tensor | None = None,
    distance_threshold: float | None = GSD_DISTANCE_THRESHOLD,
) -> torch.Tensor:
    """The dynamic group G(x_i) of each draft as a bool mask [B, W, V].

    G(x) = {x} plus every token g with
      |rank(g) - rank(x)| <= window        rank = position in the target's ranking at that row
                                           (descending p, ties by token id)
      and |p(g) - p(x)| < prob_threshold   (skipped when None)
      and ||e_g - e_x||^2 < distance_threshold   (squared L2 between `embeddings` rows, e.g. the VQ
                                           codebook; skipped when embeddings or the threshold is None).
    The window is clipped at both ends of the ranking (a draft ranked first has only lower-ranked
    neighbours). `window = 0` or `prob_threshold = 0` gives G(x) = {x}, i.e. SJD.
    """
    width = draft_tokens.shape[1]
    p = target_probs[:, :width]
    vocab = p.shape[-1]
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(vocab, device=p.device).expand_as(order))
    x = draft_tokens[..., None]
    group = (rank - rank.gather(-1, x)).abs() <= window
    if prob_threshold is not None:
        group &= (p - p.gather(-1, x)).abs() < prob_threshold
    if embeddings is not None and distance_threshold is not None:
        group &= squared_distances_to(embeddings, draft_tokens) < distance_threshold
    return group | torch.nn.functional.one_hot(draft_tokens, vocab).bool()


def gsd_decide(draft_tokens, draft_probs, target_probs, uniforms, **group_options) -> Decision:
    """Grouped acceptance: accept x_i iff u_i * sum_G d_i <= sum_G p_i, G = G(x_i) from `gsd_group_mask`
    (probability min(1, sum_G p / sum_G d)); on rejection the SJD residual norm(max(p - d, 0))."""
    d = resolve_draft_probs(draft_tokens, draft_probs, target_probs)
    width = draft_tokens.shape[1]
    group = gsd_group_mask(draft_tokens, target_probs, **group_options)
    p_group = (target_probs[:, :width] * group).sum(-1)
    d_group = (d * group).sum(-1)
    return _decide(draft_tokens, d, target_probs, uniforms * d_group <= p_group)


def gsd_accept(
    draft_tokens,
    draft_probs,
    target_probs,
    generator=None,
    *,
    window: int = GSD_WINDOW,
    prob_threshold: float | None = GSD_PROB_THRESHOLD,
    embeddings: torch.Tensor | None = None,
    distance_threshold: float | None = GSD_DISTANCE_THRESHOLD,
) -> Verdict:
    """Grouped speculative decoding's acceptance (So et al. 2025). Relaxed: not lossless unless G = {x}.

    Defaults follow the authors' setting (rank window +-7, probability gap 0.15, squared embedding
    distance 0.5); the distance threshold depends on the embedding scale, so set it per model.
    """
    uniforms = draw_uniforms(draft_tokens, generator, target_probs.device)
    decision = gsd_decide(
        draft_tokens, draft_probs, target_probs, uniforms,
        window=window, prob_threshold=prob_threshold, embeddings=embeddings, distance_threshold=distance_threshold,
    )
    return decision.sample(generator)


# --------------------------------------------------------------------------- LANTERN


def lantern_neighbours(codebook: torch.Tensor, k: int, chunk: int = 1024) -> torch.LongTensor:
    """For each code, its k nearest *other* codes by L2 distance in latent space, nearest first: [V, k].

    Ties are broken by code id. Pass the vectors the VQ decoder actually looks up (for an
    l2-normalised codebook, the normalised vectors: `VQModel.codebook_embeddings()`).
    """
    e = codebook.float()
    vocab = e.shape[0]
    if not 0 < k < vocab:
        raise MMSpecError(f"k must be in [1, {vocab - 1}], got {k}")
    out = []
    for start in range(0, vocab, chunk):
        block = torch.cdist(e[start : start + chunk], e, compute_mode="donot_use_mm_for_euclid_dist")
        ids = torch.arange(start, min(start + chunk, vocab))
        block[ids - start, ids] = float("inf")
        out.append(torch.sort(block, dim=-1, stable=True).indices[:, :k])
    return torch.cat(out)


def lantern_merged(
    draft_tokens: torch.LongTensor,
    target_probs: torch.Tensor,
    neighbours: torch.LongTensor,
    *,
    delta: float = 0.0,
    lam: float | None = None,
) -> tuple[torch.Tensor, torch.LongTensor, torch.LongTensor]:
    """(p~(x_i) [B, W], number m_i of merged neighbours [B, W], neighbour ids [B, W, k]).

    With n_1..n_k = neighbours[x] (proximity order) and c_j = sum_{l<=j} p(n_l):
      m = the number of leading j with c_j <= budget,  budget = delta (TV bound)
                                                       or (lam - 1) * p(x) (lambda variant),
      p~(x) = p(x) + c_m   (c_0 = 0).
    Moving the mass of n_1..n_m onto x changes p by exactly c_m in total variation, hence <= delta.
    """
    if lam is not None:
        if lam < 1:
            raise MMSpecError(f"lam must be >= 1, got {lam}")
    elif delta < 0:
        raise MMSpecError(f"delta must be >= 0, got {delta}")
    width = draft_tokens.shape[1]
    p = target_probs[:, :width]
    ids = neighbours[draft_tokens]  # [B, W, k]
    p_x = p.gather(-1, draft_tokens[..., None]).squeeze(-1)
    cumulative = p.gather(-1, ids).cumsum(-1)
    budget = (lam - 1.0) * p_x if lam is not None else torch.full_like(p_x, float(delta))
    num_merged = leading_true_count((cumulative <= budget[..., None]).flatten(0, 1)).view_as(p_x)
    added = cumulative.gather(-1, (num_merged - 1).clamp(min=0)[..., None]).squeeze(-1)
    added = torch.where(num_merged > 0, added, torch.zeros_like(added))
    return p_x + added, num_merged, ids


def lantern_decide(draft_tokens, draft_probs, target_probs, uniforms, *, neighbours, delta=0.0, lam=None) -> Decision:
    """LANTERN's relaxed acceptance: accept x_i iff u_i * q_i(x_i) <= p~_i(x_i) (see `lantern_merged`).

    Residual on a rejection at row n (draft x, merged neighbours M = {n_1..n_m}): exact speculative
    sampling against the draft-specific relaxed target p~_x (p with the mass of M moved onto x):
        r  ∝  max(p~_x - q, 0)  =  max(p - q, 0) with the entries of M set to 0
    (at x itself max(p~_x(x) - q(x), 0) = 0 because a rejection implies q(x) > p~_x(x)).
    With delta = 0 (or lam = 1) the merged neighbours carry no target mass, so p~ = p and the residual
    is max(p - q, 0): plain speculative sampling, bit for bit.
    """
    q = resolve_draft_probs(draft_tokens, draft_probs, target_probs)
    p_tilde, num_merged, ids = lantern_merged(draft_tokens, target_probs, neighbours, delta=delta, lam=lam)
    q_x = q.gather(-1, draft_tokens[..., None]).squeeze(-1)
    vocab = target_probs.shape[-1]
    batch = draft_tokens.shape[0]
    rows = torch.arange(batch, device=target_probs.device)

    def excluded(at: torch.LongTensor) -> torch.Tensor:
        row_ids = ids[rows, at]  # [B, k]
        merged = torch.arange(row_ids.shape[-1], device=row_ids.device) < num_merged[rows, at][:, None]
        mask = torch.zeros(batch, vocab, dtype=torch.bool, device=row_ids.device)
        return mask.scatter_(-1, row_ids, merged)

    return _decide(draft_tokens, q, target_probs, uniforms * q_x <= p_tilde, excluded)


def lantern_accept(
    draft_tokens,
    draft_probs,
    target_probs,
    generator=None,
    *,
    neighbours: torch.LongTensor,
    delta: float = 0.0,
    lam: float | None = None,
) -> Verdict:
    """LANTERN (Jang et al. 2024; delta = TV bound) and LANTERN++'s lambda variant (lam: p~(x) <= lam p(x)).

    Works with any drafter (q = its sampling distribution, or one-hot for deterministic drafts,
    including SJD's Jacobi iterate with d as q). Relaxed: the output moves away from p by at most
    the per-step budget; delta = 0 / lam = 1 is exact speculative sampling.
    """
    uniforms = draw_uniforms(draft_tokens, generator, target_probs.device)
    return lantern_decide(
        draft_tokens, draft_probs, target_probs, uniforms, neighbours=neighbours, delta=delta, lam=lam
    ).sample(generator)
