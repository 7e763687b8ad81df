"""Acceptance rules: pure tensor functions from (proposal, target logits, generator) to a verdict.

`target_logits` has k + 1 positions: position i scores the token after draft i - 1
(position 0 scores draft 0, position k gives the bonus token).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from .rule_capabilities import RuleCapabilities, declare_rule
from .sampling import SamplingConfig, choose_next, probabilities, rand, sample
from .types import Proposal, Verdict


class AcceptanceRule(Protocol):
    def __call__(
        self,
        proposal: Proposal,
        target_logits: torch.Tensor,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Verdict: ...


# A rule written on the target's distribution instead of its logits:
# (draft_tokens [B, k], draft_probs [B, k, V] | None, target_probs [B, k + 1, V], generator) -> Verdict.
# `on_target_probabilities` makes it an `AcceptanceRule`.
ProbabilityRule = Callable[[torch.Tensor, "torch.Tensor | None", torch.Tensor, "torch.Generator | None"], Verdict]


def leading_true_count(accepted: torch.Tensor) -> torch.Tensor:
    """Per row, the number of leading True values in a bool tensor [B, k]."""
    return accepted.cumprod(dim=1, dtype=torch.long).sum(dim=1)  # the cast inside cumprod: one op less per round


# Whether chain rules verify in one fused Triton kernel (`mmspec.kernels.rejection`: one launch, no host
# synchronisation). None: `greedy_match` on CUDA tensors when Triton is installed (the same decisions bit for bit);
# `speculative_sampling` keeps torch, since the kernel draws the appended token by an exponential race (the same
# distribution, other random numbers), and a seed must give the same tokens on every device. True: both rules, always
# (CPU tensors need Triton's interpreter, TRITON_INTERPRET=1: tests). False: never.
FUSED_CHAIN_KERNELS: bool | None = None


def fused_chain_kernels(logits: torch.Tensor) -> bool:
    from .kernels.triton_launch import runs_triton

    return runs_triton(logits, FUSED_CHAIN_KERNELS)


def greedy_match(
    proposal: Proposal,
    target_logits: torch.Tensor,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Exact match: accept drafts while they equal the target's argmax; then take the target's argmax."""
    if proposal.length and fused_chain_kernels(target_logits):
        from .kernels.rejection import greedy_chain_verify

        num_accepted, next_token = greedy_chain_verify(proposal.tokens, target_logits, proposal.lengths, use_triton=True)
        return Verdict(num_accepted=num_accepted, next_token=next_token)
    choice = target_logits.argmax(dim=-1)
    k = proposal.length
    matches = proposal.tokens == choice[:, :k]
    valid = proposal.valid()
    num_accepted = leading_true_count(matches if valid is None else matches & valid)
    next_token = choice.gather(1, num_accepted[:, None]).squeeze(1)
    return Verdict(num_accepted=num_accepted, next_token=next_token)


def one_hot_drafts(proposal: Proposal, vocab_size: int) -> torch.Tensor:
    """q for deterministic drafts: all mass on the drafted token, [B, k, V]."""
    return torch.nn.functional.one_hot(proposal.tokens, vocab_size).float()


def accept_and_residual(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    accepted: torch.Tensor,
    excluded: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared tail of speculative-sampling-style rules.

    Given per-draft acceptance `accepted` [B, k], returns the accepted prefix length [B] and the
    distribution [B, V] of the token appended after it: the residual norm(max(p_n - q_n, 0)) at
    the first rejection n, or p_k (bonus) when all drafts are accepted. `excluded(n)` may return
    a bool mask [B, V] of tokens removed from the residual at row n (relaxed rules). When the
    residual has no mass (p == q up to rounding), p_n itself (minus excluded tokens, if that
    leaves mass) is the right fallback.
    """
    batch, k = draft_tokens.shape
    num_accepted = leading_true_count(accepted)
    rows = torch.arange(batch, device=p.device)
    p_next = p[rows, num_accepted]
    fallback = p_next
    if k > 0:
        at = num_accepted.clamp(max=k - 1)
        rejected = (num_accepted < k)[:, None]
        raw = (p_next - q[rows, at]).clamp(min=0)
        if excluded is not None:
            drop = excluded(at) & rejected
            raw = raw.masked_fill(drop, 0.0)
            kept = p_next.masked_fill(drop, 0.0)
            fallback = torch.where(kept.sum(-1, keepdim=True) > 0, kept, p_next)
        residual = torch.where(rejected, raw, p_next)
    else:
        residual = p_next
    mass = residual.sum(dim=-1, keepdim=True)
    return num_accepted, torch.where(mass > 0, residual / mass.clamp(min=1e-30), fallback)


def speculative_sampling(
    proposal: Proposal,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
) -> Verdict:
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept draft x_i when u * q_i(x_i) < p_i(x_i) with u ~ U[0, 1) (probability min(1, p/q)); at the first rejection draw the
    correction from norm(max(p_i - q_i, 0)); if all k are accepted draw a bonus token from p_k.
    The output is distributed exactly as sampling from p alone. Exactly k uniforms and one
    multinomial draw are consumed per call, so seeded runs repeat.
    """
    p = probabilities(target_logits, sampling)
    batch, k = proposal.tokens.shape
    if k and FUSED_CHAIN_KERNELS and fused_chain_kernels(target_logits):
        # The same uniforms decide acceptance; the appended token is one exponential-race draw from the same
        # residual (or bonus) distribution instead of a multinomial one.
        from .kernels.rejection import sampled_chain_verify

        num_accepted, next_token = sampled_chain_verify(proposal.tokens, p, proposal.probs, lengths=proposal.lengths,
                                                        generator=generator, use_triton=True)
        return Verdict(num_accepted=num_accepted, next_token=next_token)
    q = proposal.probs if proposal.probs is not None else one_hot_drafts(proposal, p.shape[-1])
    valid = proposal.valid()
    if valid is not None:
        q = q * valid[..., None]  # a padding slot drafted nothing: its residual is p itself (a bonus token)
    tokens = proposal.tokens[..., None]
    p_draft = p[:, :k].gather(-1, tokens).squeeze(-1)
    q_draft = q.gather(-1, tokens).squeeze(-1)
    uniforms = rand((batch, k), generator, p.device)
    # Strict: a token the target gives probability 0 is never accepted, even when u is exactly 0.
    accepted = uniforms * q_draft < p_draft
    num_accepted, next_probs = accept_and_residual(proposal.tokens, q, p, accepted if valid is None else accepted & valid)
    return Verdict(num_accepted=num_accepted, next_token=sample(next_probs, generator))


def target_choice(
    proposal: Proposal,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
) -> Verdict:
    """Plain decoding: accept no draft and take the target's own next token exactly as `choose_next`
    picks it (argmax, or one draw from the warped distribution of position 0)."""
    num_accepted = torch.zeros(target_logits.shape[0], dtype=torch.long, device=target_logits.device)
    return Verdict(num_accepted=num_accepted, next_token=choose_next(target_logits[:, 0], sampling, generator))


def target_distribution(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The target's distribution [..., V]: warped probabilities when sampling, one-hot on the argmax when greedy."""
    if sampling.do_sample:
        return probabilities(logits, sampling)
    return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()


def on_target_probabilities(rule: ProbabilityRule, capabilities: RuleCapabilities | None = None) -> AcceptanceRule:
    """A `ProbabilityRule` as a core `AcceptanceRule`: p = `target_distribution(target_logits)` (one-hot
    when greedy, so a lossless rule then reduces to greedy decoding), and the verdict carries p
    (`Verdict.target_probs`) for drafters that draft from it (Jacobi iterates). `capabilities`: what the
    rule declares (a chain rule's defaults when None)."""

    def accept(proposal: Proposal, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None) -> Verdict:
        p = target_distribution(target_logits, sampling)
        verdict = rule(proposal.tokens, proposal.probs, p, generator)
        verdict.target_probs = p
        return verdict

    return accept if capabilities is None else declare_rule(capabilities)(accept)


def drop_nonfinite_drafts(proposal: Proposal) -> Proposal:
    """A draft whose distribution q is not a distribution (NaN, inf or negative entries) counts as rejected:
    its row's proposal ends before it, so the rule draws that position from the target's own distribution
    and the output law is unchanged. One row: the drafts are cut; a batch: the row's length is."""
    q = proposal.probs
    if q is None or q.numel() == 0:
        return proposal
    bad = ~torch.isfinite(q).all(dim=-1) | (q < 0).any(dim=-1)
    if not bool(bad.any()):
        return proposal
    first_bad = torch.where(bad.any(dim=1), bad.long().argmax(dim=1), torch.full_like(bad[:, 0], proposal.length, dtype=torch.long))
    if proposal.tokens.shape[0] == 1 and proposal.lengths is None:
        keep = int(first_bad[0])
        return Proposal(tokens=proposal.tokens[:, :keep], probs=q[:, :keep])
    lengths = first_bad if proposal.lengths is None else torch.minimum(proposal.lengths.to(first_bad.device), first_bad)
    return Proposal(tokens=proposal.tokens, probs=q.masked_fill(bad[..., None], 0.0), lengths=lengths)


# Rules that honour `Proposal.lengths` (rows of a batch drafting different numbers of tokens) say so.
RAGGED_CHAIN_RULE = RuleCapabilities(ragged_drafts=True)
declare_rule(RAGGED_CHAIN_RULE)(greedy_match)
declare_rule(RAGGED_CHAIN_RULE)(speculative_sampling)
declare_rule(RAGGED_CHAIN_RULE)(target_choice)


def default_rule(sampling: SamplingConfig) -> AcceptanceRule:
    return speculative_sampling if sampling.do_sample else greedy_match
