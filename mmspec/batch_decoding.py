"""The draft/verify loop over a batch whose rows accept different numbers of drafts.

    prefill the left-padded prompts; each row picks its first token
    while rows are live:
        proposal = drafter.propose_batch(batch, k)     # drafts [B, k] (rows may draft fewer)
        step     = target.score_batch(batch, drafts)   # ONE target forward for all rows
        verdict  = rule(proposal, step.logits, ...)    # accepted count [B] + correction / bonus [B]
        append the k draft columns and the new token column; rejected drafts become holes
        rows that stopped leave the batch (their caches too)

Same rules, drafters and target as the batch-1 loop in `mmspec.decoding`; only the rollback
differs: a batch-1 cache is cropped, a batch's rejected columns are masked (`mmspec.ragged`).
Each row follows the tokens it would follow alone, so greedy output equals the row decoded alone
and sampling keeps each row's distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .drafters import Drafter
from .errors import MMSpecError
from .policies import DraftLengthPolicy
from .ragged import RaggedBatch
from .rule_capabilities import check_proposal
from .rules import drop_nonfinite_drafts
from .sampling import choose_next
from .stats import SpecStats
from .targets import Target, TargetStep
from .trees import TreeConfig
from .types import Proposal

if TYPE_CHECKING:
    from .decode_state import DecodeState


def check_batch_support(target: Target, drafter: Drafter, tree: TreeConfig | None, policy: DraftLengthPolicy) -> None:
    """Refuse, with one clear line, what a batch cannot be decoded with."""
    if tree is not None:
        raise MMSpecError("draft trees decode one sequence at a time; pass a batch of one or draft chains")
    if not target.decodes_batches:
        raise MMSpecError(f"{type(target).__name__} decodes one sequence at a time; pass a batch of one")
    if not drafter.drafts_batches:
        raise MMSpecError(f"{type(drafter).__name__} drafts one sequence at a time; pass a batch of one")
    if target.sliding_window is not None:
        raise MMSpecError("a sliding-window target decodes one sequence at a time here; pass a batch of one")
    if policy.needs_confidence:
        raise MMSpecError("confidence-stopped draft lengths follow one sequence; use a fixed draft length for a batch")


def decode_batch(
    state: DecodeState,
    sequence: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    model_inputs: dict[str, Any],
    *,
    pad_token_id: int,
) -> torch.LongTensor:
    """Decode every row of `sequence` [B, P] (left-padded where `attention_mask` has zeros): returns
    prompt + new tokens [B, P + longest], rows that stopped early padded with `pad_token_id`. Fills
    `stats` with the sums over rows and `stats.rows` with each row's own counts (a forward counts once
    for every row it served, so tau stays tokens per row per forward); times are the batch's."""
    target, drafter, rule, policy, stats = state.target, state.drafter, state.rule, state.policy, state.stats
    sampling, generator, stops, max_new_tokens = state.sampling, state.generator, state.stops, state.max_new_tokens
    batch = RaggedBatch(sequence, attention_mask)
    if attention_mask is not None and not bool(attention_mask[:, -1].bool().all()):
        raise MMSpecError("pad batches on the left (tokenizer padding_side='left'): a row ends in padding")

    def commit(tokens: torch.LongTensor, valid: torch.Tensor) -> None:
        """Append the round's columns; rows that stopped leave the batch (and every cache)."""
        committed, finished = batch.commit(tokens, valid, stops, max_new_tokens)
        if state.on_tokens is not None:
            state.on_tokens(committed)
        if finished:
            keep = torch.tensor([b for b in range(batch.size) if b not in finished], dtype=torch.long,
                                device=batch.tokens.device)
            batch.select(keep)
            if batch.size:
                target.select_rows(keep)
                drafter.select_rows(keep)

    # Each row keeps its own counts: a forward over 4 live rows counts once for each of them.
    row_stats = [SpecStats(method=stats.method) for _ in range(batch.size)]

    def count(role: str, forwards: int) -> None:
        for live in batch.rows.tolist():
            setattr(row_stats[live], f"{role}_forwards", getattr(row_stats[live], f"{role}_forwards") + forwards)

    def judge(proposal: Proposal, step: TargetStep) -> None:
        """Verify one round's drafts against the target's logits [B, k + 1, V] and commit."""
        check_proposal(state.capabilities, rule, proposal)
        verdict = rule(proposal, step.logits, sampling, generator)
        accepted = verdict.num_accepted
        slots = torch.arange(proposal.length, device=accepted.device)[None]
        valid = torch.cat([slots < accepted[:, None], torch.ones_like(accepted[:, None], dtype=torch.bool)], dim=1)
        drafted = [proposal.length] * batch.size if proposal.lengths is None else proposal.lengths.tolist()
        for live, row_drafted, n in zip(batch.rows.tolist(), drafted, accepted.tolist()):
            row_stats[live].record_round(row_drafted, n)
        policy.update(proposal.length, int(accepted.max()))
        drafter.observe_batch(batch, verdict, step)
        commit(torch.cat([proposal.tokens, verdict.next_token[:, None]], dim=1), valid)

    with stats.timer("prefill"):
        before = drafter.forwards
        drafter.prefill_batch(batch, model_inputs)
        proposal = None
        k = min(policy.max_tokens(), max_new_tokens - 1)
        if drafter.drafts_from_prompt and k > 0:
            # As in the batch-1 loop: the first drafts ride along with the prefill (one forward fewer per row).
            proposal = drop_nonfinite_drafts(drafter.propose_batch(batch, k, sampling, generator))
            if not proposal.length or not target.drafts_can_join_prefill(proposal.tokens, model_inputs):
                proposal = None
                drafter.prefill_batch(batch, model_inputs)  # forget those drafts; the next round drafts again
        step = target.start_batch(batch, None if proposal is None else proposal.tokens, **model_inputs)
        count("target", 1)
        drafter.on_target_prefill_batch(batch, step)
        count("drafter", drafter.forwards - before)
        if proposal is not None:
            judge(proposal, step)
        else:
            first = choose_next(step.logits[:, -1], sampling, generator)
            commit(first[:, None], torch.ones_like(first[:, None], dtype=torch.bool))

    while batch.size:
        room = max(max_new_tokens - len(batch.generated[live]) for live in batch.rows.tolist())
        k = min(policy.max_tokens(), room - 1)
        with stats.timer("draft"):
            before = drafter.forwards
            proposal = drop_nonfinite_drafts(drafter.propose_batch(batch, k, sampling, generator))
            count("drafter", drafter.forwards - before)
        with stats.timer("verify"):
            step = target.score_batch(batch, proposal.tokens)
            count("target", 1)
            judge(proposal, step)
    for row, tokens in zip(row_stats, batch.generated):
        row.new_tokens = len(tokens)
        row.prefill_time, row.draft_time, row.verify_time = stats.prefill_time, stats.draft_time, stats.verify_time
    total = sum(row_stats[1:], row_stats[0])
    for name in ("rounds", "drafted", "accepted", "position_attempts", "position_accepts", "target_forwards",
                 "drafter_forwards", "new_tokens"):
        setattr(stats, name, getattr(total, name))
    stats.rows = row_stats
    return batch.sequences(sequence, pad_token_id)
