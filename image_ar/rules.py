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

Acceptance is strict everywhere: a draft is accepted when u * q(x) < p(x) (u ~ U[0, 1)), which
has probability min(1, p(x) / q(x)) as `<=` does, but never accepts a token whose target (or
grouped / relaxed) probability is 0, even when u is exactly 0 (the core rule's convention).

Randomness: each call draws exactly B x W uniforms (`mmspec.sampling.rand`) and then one sample per
row (`mmspec.sampling.sample`), in that order, from the caller's generator. Both draw on the
generator's device and move the result, so a CPU generator works with a CUDA model and a seed
gives the same numbers on every device. All rules share this, so at their neutral
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
from mmspec.sampling import rand, sample
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
    """One uniform in [0, 1) per draft [B, W], drawn on the generator's device and moved to `device`."""
    batch, width = draft_tokens.shape
    return rand((batch, width), generator, device)


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
    """SJD's probabilistic Jacobi acceptance: accept x_i iff u_i * d_i(x_i) < p_i(x_i)
    (probability min(1, p_i(x_i) / d_i(x_i)); strict, so p_i(x_i) = 0 is never accepted);
    at the first rejection draw from norm(max(p_i - d_i, 0))."""
    d = resolve_draft_probs(draft_tokens, draft_probs, target_probs)
    width = draft_tokens.shape[1]
    x = draft_tokens[..., None]
    p_x = target_probs[:, :width].gather(-1, x).squeeze(-1)
    d_x = d.gather(-1, x).squeeze(-1)
    return _decide(draft_tokens, d, target_probs, uniforms * d_x < p_x)


def sjd_accept(draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
    """Speculative Jacobi decoding's acceptance (Teng et al. 2024); lossless (see `sjd_decide`)."""
    uniforms = draw_uniforms(draft_tokens, generator, target_probs.device)
    return sjd_decide(draft_tokens, draft_probs, target_probs, uniforms).sample(generator)


# --------------------------------------------------------------------------- GSD

GSD_WINDOW = 7
GSD_PROB_THRESHOLD = 0.15
GSD_DISTANCE_THRESHOLD = 0.5
# What GSD measures latent closeness on: the AR model's input token embeddings (the official method),
# or the VQ codebook vectors the decoder looks up (an option).
GSD_LATENTS = ("embeddings", "codebook")


def squared_distances_to(embeddings: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
    """Squared L2 distance from the embedding of each token [...] to every embedding: [..., V]."""
    e = embeddings.float()
    a = e[tokens]
    return ((a * a).sum(-1, keepdim=True) + (e * e).sum(-1) - 2 * a @ e.T).clamp(min=0)


def gsd_rank_window(window: int | tuple[int, int]) -> tuple[int, int]:
    """(below, above): how many tokens less probable and more probable than x the rank window spans.

    An int W is the official window: the slice order[r - W : r + W] of the targets' ascending sort,
    i.e. W tokens below x and W - 1 above it (7 -> 7 below, 6 above). A pair is taken as (below, above).
    """
    below, above = (window, window - 1) if isinstance(window, int) else (int(window[0]), int(window[1]))
    if below < 0 or above < -1:
        raise MMSpecError(f"the GSD rank window must be >= 0, got {window}")
    return below, above


def gsd_group_mask(
    draft_tokens: torch.LongTensor,
    target_probs: torch.Tensor,
    *,
    window: int | tuple[int, int] = GSD_WINDOW,
    prob_threshold: float | None = GSD_PROB_THRESHOLD,
    embeddings: torch.Tensor | None = None,
    distance_threshold: float | None = GSD_DISTANCE_THRESHOLD,
) -> torch.Tensor:
    """The dynamic group G(x_i) of each draft as a bool mask [B, W, V].

    G(x) = {x} plus every token g with
      -below <= r(g) - r(x) <= above       r = position in the ascending sort of the target's
                                           probabilities at that row (ties by token id);
                                           (below, above) = `gsd_rank_window(window)`: for the
                                           default 7, the 7 tokens just less probable than x and
                                           the 6 just more probable (the official slice
                                           order[r - 7 : r + 7])
      and |p(g) - p(x)| < prob_threshold   (skipped when None)
      and ||e_g - e_x||^2 < distance_threshold   (squared L2 between rows of `embeddings`: officially
                                           the AR model's input token embeddings
                                           (`CFGTarget.token_embeddings()`), optionally the VQ
                                           codebook; skipped when embeddings or the threshold is None).
    The window is clipped at both ends of the ranking: a draft ranked first has only less probable
    neighbours. (The official slice does not clip at the low end: for the W least probable tokens
    its negative start gives an empty slice, a 0/0 ratio and a certain rejection; here they keep
    the part of the window that exists.) `window = 0` or `prob_threshold = 0` gives G(x) = {x}, i.e. SJD.
    """
    below, above = gsd_rank_window(window)
    width = draft_tokens.shape[1]
    p = target_probs[:, :width]
    vocab = p.shape[-1]
    order = torch.sort(p, dim=-1, stable=True).indices  # ascending, ties by token id
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(vocab, device=p.device).expand_as(order))
    x = draft_tokens[..., None]
    offset = rank - rank.gather(-1, x)
    group = (offset >= -below) & (offset <= above)
    if prob_threshold is not None:
        group &= (p - p.gather(-1, x)).abs() < prob_threshold
    if embeddings is not None and distance_threshold is not None:
        if embeddings.shape[0] != vocab:
            raise MMSpecError(f"GSD's latent table has {embeddings.shape[0]} rows for {vocab} tokens")
        group &= squared_distances_to(embeddings.to(p.device), draft_tokens) < distance_threshold
    return group | torch.nn.functional.one_hot(draft_tokens, vocab).bool()


def gsd_decide(draft_tokens, draft_probs, target_probs, uniforms, **group_options) -> Decision:
    """Grouped acceptance: accept x_i iff u_i * sum_G d_i < sum_G p_i, G = G(x_i) from `gsd_group_mask`
    (probability min(1, sum_G p / sum_G d); strict: a group without target mass is never accepted);
    on rejection the SJD residual norm(max(p - d, 0))."""
    d = resolve_draft_probs(draft_tokens, draft_probs, target_probs)
    width = draft_tokens.shape[1]
    group = gsd_group_mask(draft_tokens, target_probs, **group_options)
    p_group = (target_probs[:, :width] * group).sum(-1)
    d_group = (d * group).sum(-1)
    return _decide(draft_tokens, d, target_probs, uniforms * d_group < p_group)


def gsd_accept(
    draft_tokens,
    draft_probs,
    target_probs,
    generator=None,
    *,
    window: int | tuple[int, int] = GSD_WINDOW,
    prob_threshold: float | None = GSD_PROB_THRESHOLD,
    embeddings: torch.Tensor | None = None,
    distance_threshold: float | None = GSD_DISTANCE_THRESHOLD,
) -> Verdict:
    """Grouped speculative decoding's acceptance (So et al. 2025). Relaxed: not lossless unless G = {x}.

    Defaults follow the authors' code (rank window 7 below / 6 above in an ascending sort, probability
    gap 0.15, squared distance 0.5 between the AR model's input token embeddings, which the caller
    passes as `embeddings`); the distance threshold depends on the embedding scale, so set it per model.
    """
    uniforms = draw_uniforms(draft_tokens, generator, target_probs.device)
    decision = gsd_decide(
        draft_tokens, draft_probs, target_probs, uniforms,
        window=window, prob_threshold=prob_threshold, embeddings=embeddings, distance_threshold=distance_threshold,
    )
    return decision.sample(generator)


# --------------------------------------------------------------------------- LANTERN

# The authors' defaults (LANTERN's generate_images: --lantern_k 1000 --lantern_delta 0.1), set for
# LlamaGen's 16384-code codebook; a smaller codebook needs a smaller k (a model card's lantern_defaults).
LANTERN_K = 1000
LANTERN_DELTA = 0.1


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
        ids = torch.arange(start, min(start + chunk, vocab), device=e.device)
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
      m = the number of leading j with c_j <= budget,  budget = delta (per-candidate TV bound)
                                                       or (lam - 1) * p(x) (lambda variant),
      p~(x) = p(x) + c_m   (c_0 = 0).
    The candidate's boosted distribution p~_x (p with the mass of n_1..n_m moved onto x) is at total
    variation exactly c_m from p, so TV(p, p~_x) <= delta for every candidate x (LANTERN's bound;
    <= (lam - 1) p(x) in the lambda variant). That bounds each candidate's relaxed target, NOT the law
    of the tokens the rule outputs: see `lantern_output_law`.
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
    """LANTERN's relaxed acceptance: accept x_i iff u_i * q_i(x_i) < p~_i(x_i) (see `lantern_merged`; strict,
    so p~_i(x_i) = 0 is never accepted).

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

    return _decide(draft_tokens, q, target_probs, uniforms * q_x < p_tilde, excluded)


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
    """LANTERN (Jang et al. 2024) and LANTERN++'s lambda variant (lam: p~(x) <= lam p(x)).

    Works with any drafter (q = its sampling distribution, or one-hot for deterministic drafts,
    including SJD's Jacobi iterate with d as q). delta = 0 / lam = 1 is exact speculative sampling.

    Relaxed, and what delta bounds: the total variation between p and each candidate's boosted
    distribution p~_x, TV(p, p~_x) <= delta (`lantern_merged`). It does NOT bound the distance
    between p and the law of the output token: each drafted x is judged against its own p~_x, and
    the mixture over drafts can move much further from p (exact law of one step, V = 40, delta = 0.1:
    TV 0.28 from p). That distance depends on q as well as p; `lantern_output_law` computes it
    exactly and `mmspec bench image` reports it next to delta.
    """
    uniforms = draw_uniforms(draft_tokens, generator, target_probs.device)
    return lantern_decide(
        draft_tokens, draft_probs, target_probs, uniforms, neighbours=neighbours, delta=delta, lam=lam
    ).sample(generator)


def lantern_output_law(
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    neighbours: torch.LongTensor,
    *,
    delta: float = 0.0,
    lam: float | None = None,
    chunk: int = 1024,
) -> torch.Tensor:
    """The exact law of the token one LANTERN acceptance step commits [N, V] (float64), analytically.

    For each row: a draft x ~ q = draft_probs (one-hot for a deterministic draft), accepted with
    a(x) = min(1, p~_x(x) / q(x)), else replaced by a draw from the residual r_x that `lantern_decide`
    uses (norm(max(p - q, 0)) without x's merged neighbours, with the same fallbacks):
        law(y) = q(y) a(y) + sum_x q(x) (1 - a(x)) r_x(y).
    With delta = 0 it is p (speculative sampling is exact); otherwise compare it with p to see how far
    the rule really moves the output: TV(law, p) can exceed delta (see `lantern_accept`).
    Cost: O(V^2) per row, in chunks of `chunk` candidates.
    """
    q = draft_probs.double().reshape(-1, draft_probs.shape[-1])
    p = target_probs.double().reshape(-1, target_probs.shape[-1])
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)  # as sampling normalises them
    if q.shape != p.shape:
        raise MMSpecError(f"draft_probs and target_probs must have the same shape, got {tuple(q.shape)} and {tuple(p.shape)}")
    rows, vocab = p.shape
    candidates = torch.arange(vocab, device=p.device)
    # every token as a candidate draft: p~_x(x), merged counts and neighbour ids, each [N, V(, k)]
    p_tilde, num_merged, ids = lantern_merged(candidates.expand(rows, vocab), _rows_for_every_candidate(p), neighbours,
                                              delta=delta, lam=lam)
    accept = torch.where(q > 0, (p_tilde / q.clamp(min=1e-300)).clamp(max=1.0), torch.zeros_like(q))
    law = q * accept
    positive = (p - q).clamp(min=0)  # [N, V]
    rejected_mass = q * (1 - accept)  # weight of each candidate's residual
    for start in range(0, vocab, chunk):
        block = slice(start, min(start + chunk, vocab))
        size = block.stop - block.start
        # merged[n, x, y]: y is one of candidate x's merged neighbours in row n
        rank = torch.arange(ids.shape[-1], device=p.device)
        merged = torch.zeros(rows, size, vocab, dtype=torch.bool, device=p.device)
        merged.scatter_(-1, ids[:, block], rank < num_merged[:, block, None])
        residual = positive[:, None, :].masked_fill(merged, 0.0)
        mass = residual.sum(-1, keepdim=True)
        kept = p[:, None, :].masked_fill(merged, 0.0)
        fallback = torch.where(kept.sum(-1, keepdim=True) > 0, kept, p[:, None, :].expand_as(kept))
        fallback = fallback / fallback.sum(-1, keepdim=True)
        r = torch.where(mass > 0, residual / mass.clamp(min=1e-300), fallback)
        law = law + (rejected_mass[:, block, None] * r).sum(1)
    return law.reshape(target_probs.shape)


def _rows_for_every_candidate(p: torch.Tensor) -> torch.Tensor:
    """p [N, V] as `lantern_merged`'s target_probs for V drafts per row: [N, V + 1, V] (a view)."""
    return p[:, None, :].expand(p.shape[0], p.shape[1] + 1, p.shape[1])


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """0.5 * sum |a - b| over the last dimension."""
    return 0.5 * (a.double() - b.double()).abs().sum(-1)
