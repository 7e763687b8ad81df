"""Chain verification in one fused kernel: greedy matching and (relaxed) speculative sampling.

Shapes (B rows, k draft slots, V tokens; the layout of `mmspec.rules`, padded rather than packed):

    draft_tokens   [B, k]        int64   row b's drafts; slots at or past lengths[b] are padding
    lengths        [B] | None    int64   drafts per row (ragged batches); None: every row drafted k
    target         [B, k + 1]    int     greedy: the target's argmax per position, or
                   [B, k + 1, V] float   its logits (the kernel takes the argmax, reading only the rows it needs)
    target_probs   [B, k + 1, V] float   sampled: p; row i judges draft i, row k gives the bonus token
    draft_probs    [B, k, V] | None      q each draft was drawn from; None: deterministic drafts (one-hot q)
    uniforms       [B, k]        float32 U[0, 1): draft i is accepted when uniforms[:, i] * q_i(x_i) < p_i(x_i)
    exponentials   [B, V]        float32 Exp(1) noise for the one token drawn per row (residual or bonus):
                                         argmax_v w(v) / exponentials[v] is a draw from w / sum(w)
    ->  num_accepted [B] int64 (leading accepted drafts), next_token [B] int64 (correction or bonus)

vLLM's `v1/sample/rejection_sampler.py` packs drafts of all requests into one flat list with cumulative
counts and uses the same two kinds of noise (uniforms for acceptance, exponentials for the recovered and
bonus tokens); here rows are padded to k, as mmspec's `Proposal` (tokens + lengths) is.

Relaxed acceptance runs in the same kernel through three optional inputs:

    accept_target      [B, k] float  replaces p_i(x_i) in the acceptance test (LANTERN: p~(x_i), the drafted
                                     token's boosted probability; GSD: the target mass of x_i's group)
    accept_draft       [B, k] float  replaces q_i(x_i) (GSD: the drafter's mass of the group); an acceptance
                                     probability a computed elsewhere is accept_target = a, accept_draft = 1
    residual_excluded  [B, k, V] bool tokens removed from the residual after a rejection at slot i (LANTERN:
                                     the drafted token's merged neighbours); when that leaves no mass, p_i
                                     without them, then p_i, as `mmspec.rules.accept_and_residual` does

Draws: the core's rules (`mmspec.rules`) draw the appended token with `torch.multinomial`; these kernels use
the exponential race, so with one seed they make the same acceptance decisions (the uniforms come first in
both) but may append a different token, from the same distribution (the tests check both).

A row whose residual max(p_i - q_i, 0) has no mass (p == q up to rounding) draws from p_i, as the core does.
A padding slot is never accepted, and after a row's last real draft the token comes from p at that slot
(its bonus). Kernels: one program per row, no host synchronisation, no data-dependent shapes (CUDA-graph
safe). The torch references below define the bits: on the same inputs each kernel returns the same tensors.
"""

from __future__ import annotations

import torch

from mmspec.errors import MMSpecError

from .triton_launch import block_size, built, draw_exponentials, draw_uniforms, race_scores, runs_triton

# --------------------------------------------------------------------------- shapes


def resolved_lengths(draft_tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """lengths as int64 [B] on the drafts' device (every row k when None), clamped to [0, k]."""
    batch, k = draft_tokens.shape
    if lengths is None:
        return torch.full((batch,), k, dtype=torch.long, device=draft_tokens.device)
    if lengths.shape != (batch,):
        raise MMSpecError(f"lengths must be [B] = [{batch}], got {tuple(lengths.shape)}")
    return lengths.to(device=draft_tokens.device, dtype=torch.long).clamp(0, k)


def check_draft_tokens(draft_tokens: torch.Tensor) -> tuple[int, int]:
    if draft_tokens.dim() != 2 or draft_tokens.dtype.is_floating_point:
        raise MMSpecError(f"draft_tokens must be an integer tensor [B, k], got {draft_tokens.dtype} {tuple(draft_tokens.shape)}")
    return int(draft_tokens.shape[0]), int(draft_tokens.shape[1])


def check_greedy_target(draft_tokens: torch.Tensor, target: torch.Tensor) -> None:
    batch, k = check_draft_tokens(draft_tokens)
    wanted = (batch, k + 1)
    if target.shape[:2] != wanted or target.dim() != (3 if target.dtype.is_floating_point else 2):
        raise MMSpecError(f"target must be argmax ids [B, k + 1] = {list(wanted)} or logits [B, k + 1, V], "
                          f"got {target.dtype} {tuple(target.shape)}")


def check_sampled_inputs(draft_tokens, target_probs, draft_probs, accept_target, accept_draft, residual_excluded,
                         uniforms, exponentials) -> None:
    batch, k = check_draft_tokens(draft_tokens)
    if target_probs.dim() != 3 or target_probs.shape[:2] != (batch, k + 1):
        raise MMSpecError(f"target_probs must be [B, k + 1, V] with B={batch}, k={k}, got {tuple(target_probs.shape)}")
    vocab = int(target_probs.shape[2])
    expected = {"draft_probs": (draft_probs, (batch, k, vocab)), "accept_target": (accept_target, (batch, k)),
                "accept_draft": (accept_draft, (batch, k)), "residual_excluded": (residual_excluded, (batch, k, vocab)),
                "uniforms": (uniforms, (batch, k)), "exponentials": (exponentials, (batch, vocab))}
    for name, (tensor, shape) in expected.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise MMSpecError(f"{name} must be {list(shape)}, got {tuple(tensor.shape)}")


# --------------------------------------------------------------------------- greedy: reference


def greedy_chain_reference(draft_tokens: torch.Tensor, target: torch.Tensor,
                           lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept drafts while they equal the target's argmax (first index on ties); then take its argmax."""
    check_greedy_target(draft_tokens, target)
    choice = (target.argmax(-1) if target.dtype.is_floating_point else target).long()
    k = draft_tokens.shape[1]
    valid = torch.arange(k, device=draft_tokens.device)[None] < resolved_lengths(draft_tokens, lengths)[:, None]
    matches = (draft_tokens.long() == choice[:, :k]) & valid
    num_accepted = matches.long().cumprod(dim=1).sum(dim=1)
    return num_accepted, choice.gather(1, num_accepted[:, None]).squeeze(1)


# --------------------------------------------------------------------------- greedy: dispatcher


def greedy_chain_verify(draft_tokens: torch.Tensor, target: torch.Tensor, lengths: torch.Tensor | None = None,
                        *, use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain verification: Triton on CUDA tensors, the torch reference elsewhere (see the module
    docstring for shapes). Returns (num_accepted [B], next_token [B])."""
    if not runs_triton(target, use_triton) or draft_tokens.numel() == 0:  # no drafts: no kernel over empty tensors
        return greedy_chain_reference(draft_tokens, target, lengths)
    check_greedy_target(draft_tokens, target)
    batch, k = draft_tokens.shape
    from_logits = target.dtype.is_floating_point
    vocab = int(target.shape[2]) if from_logits else 1
    num_accepted = torch.empty(batch, dtype=torch.long, device=target.device)
    next_token = torch.empty(batch, dtype=torch.long, device=target.device)
    built(rejection_kernels().greedy_chain_kernel)[(batch,)](
        draft_tokens.long().contiguous(), resolved_lengths(draft_tokens, lengths), target.contiguous(),
        num_accepted, next_token, k, vocab, FROM_LOGITS=from_logits, BLOCK=block_size(vocab))
    return num_accepted, next_token


# --------------------------------------------------------------------------- sampled: reference


def sampled_chain_decide_reference(
    draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor, *, lengths: torch.Tensor | None = None, accept_target: torch.Tensor | None = None,
    accept_draft: torch.Tensor | None = None, residual_excluded: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted [B], the weights [B, V] the next token is drawn from, not normalised): the
    deterministic half of the sampled rule, which tests compare with the core's rules."""
    check_sampled_inputs(draft_tokens, target_probs, draft_probs, accept_target, accept_draft, residual_excluded,
                         uniforms, None)
    batch, k = draft_tokens.shape
    p = target_probs.float()
    tokens = draft_tokens.long()
    length = resolved_lengths(draft_tokens, lengths)
    rows = torch.arange(batch, device=p.device)
    if k == 0:
        return length * 0, p[:, 0]
    drafted = tokens[..., None]
    target_mass = accept_target.float() if accept_target is not None else p[:, :k].gather(-1, drafted).squeeze(-1)
    if accept_draft is not None:
        draft_mass = accept_draft.float()
    elif draft_probs is not None:
        draft_mass = draft_probs.float().gather(-1, drafted).squeeze(-1)
    else:
        draft_mass = torch.ones_like(target_mass)
    valid = torch.arange(k, device=p.device)[None] < length[:, None]
    accepted = (uniforms.float() * draft_mass < target_mass) & valid
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)
    rejected = (num_accepted < length)[:, None]
    at = num_accepted.clamp(max=k - 1)
    p_next = p[rows, num_accepted]
    if draft_probs is not None:
        q_next = draft_probs.float()[rows, at]
    else:
        q_next = torch.nn.functional.one_hot(tokens[rows, at], p.shape[-1]).float()
    residual = (p_next - q_next * rejected).clamp(min=0)
    kept = p_next
    if residual_excluded is not None:
        drop = residual_excluded[rows, at].bool() & rejected
        residual = residual.masked_fill(drop, 0.0)
        kept = p_next.masked_fill(drop, 0.0)
    fallback = torch.where((kept > 0).any(-1, keepdim=True), kept, p_next)
    return num_accepted, torch.where((residual > 0).any(-1, keepdim=True), residual, fallback)


def sampled_chain_reference(
    draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor, exponentials: torch.Tensor, *, lengths: torch.Tensor | None = None,
    accept_target: torch.Tensor | None = None, accept_draft: torch.Tensor | None = None,
    residual_excluded: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) with the caller's noise; lossless
    unless the relaxed inputs are given. Returns (num_accepted [B], next_token [B])."""
    if exponentials.shape != (draft_tokens.shape[0], target_probs.shape[-1]):
        raise MMSpecError(f"exponentials must be [B, V], got {tuple(exponentials.shape)}")
    num_accepted, weights = sampled_chain_decide_reference(
        draft_tokens, target_probs, draft_probs, uniforms, lengths=lengths, accept_target=accept_target,
        accept_draft=accept_draft, residual_excluded=residual_excluded)
    return num_accepted, race_scores(weights, exponentials.float()).argmax(-1)


# --------------------------------------------------------------------------- sampled: dispatcher


def sampled_chain_verify(
    draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None = None, *,
    lengths: torch.Tensor | None = None, accept_target: torch.Tensor | None = None,
    accept_draft: torch.Tensor | None = None, residual_excluded: torch.Tensor | None = None,
    generator: torch.Generator | None = None, uniforms: torch.Tensor | None = None,
    exponentials: torch.Tensor | None = None, use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled chain verification: Triton on CUDA tensors, the torch reference elsewhere (module docstring
    for shapes). Noise not given is drawn from `generator`: uniforms [B, k], then exponentials [B, V]."""
    batch, k = check_draft_tokens(draft_tokens)
    device = target_probs.device
    if uniforms is None:
        uniforms = draw_uniforms((batch, k), generator, device)
    if exponentials is None:
        exponentials = draw_exponentials((batch, int(target_probs.shape[-1])), generator, device)
    if not runs_triton(target_probs, use_triton) or k == 0 or batch == 0:  # no kernel over empty tensors
        return sampled_chain_reference(draft_tokens, target_probs, draft_probs, uniforms, exponentials, lengths=lengths,
                                       accept_target=accept_target, accept_draft=accept_draft,
                                       residual_excluded=residual_excluded)
    check_sampled_inputs(draft_tokens, target_probs, draft_probs, accept_target, accept_draft, residual_excluded,
                         uniforms, exponentials)
    vocab = int(target_probs.shape[-1])
    num_accepted = torch.empty(batch, dtype=torch.long, device=device)
    next_token = torch.empty(batch, dtype=torch.long, device=device)
    p = target_probs.contiguous()
    excluded = residual_excluded.to(torch.bool).contiguous().view(torch.uint8) if residual_excluded is not None else None
    built(rejection_kernels().sampled_chain_kernel)[(batch,)](
        draft_tokens.long().contiguous(), resolved_lengths(draft_tokens, lengths), p,
        draft_probs.contiguous() if draft_probs is not None else p,
        accept_target.float().contiguous() if accept_target is not None else uniforms,
        accept_draft.float().contiguous() if accept_draft is not None else uniforms,
        excluded if excluded is not None else draft_tokens,
        uniforms.float().contiguous(), exponentials.float().contiguous(), num_accepted, next_token, k, vocab,
        HAS_Q=draft_probs is not None, HAS_ACCEPT_P=accept_target is not None,
        HAS_ACCEPT_Q=accept_draft is not None, HAS_EXCLUDED=excluded is not None, BLOCK=block_size(vocab, 2048))
    return num_accepted, next_token


def rejection_kernels():
    """The Triton kernels' module, imported on first use (it needs Triton)."""
    from . import rejection_kernels as kernels

    return kernels
