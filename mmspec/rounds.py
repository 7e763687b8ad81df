"""The shapes a call's rounds take: what differs between one sequence, a draft tree and a batch.

The loop (`SpeculativeDecoder.generate`) is the same for all three; it picks one of these once per call:

    ChainRounds   one sequence drafting a chain; rejected drafts are cropped from the caches
    TreeRounds    one sequence drafting a tree (`mmspec.trees`); the caches keep the accepted path
    BatchRounds   several rows (`mmspec.ragged`); rejected drafts become masked holes, finished rows leave

Each gives the loop's steps for its shape: `begin` (the drafter's `begin`, the drafts that ride along with the
target's prefill, if any), `start` (the target's prefill), `first` (the prefill's token when no drafts rode
along), `propose`, `verify`, `commit` (append the verdict's tokens, roll back, tell the drafter), `live` and
`finish` (the output sequences, the stats' counts). The call's settings and callbacks stay in `DecodeState`.
"""

from __future__ import annotations

from typing import Any

import torch

from .decode_state import DecodeState
from .drafters import DraftView
from .errors import MMSpecError
from .ragged import RaggedBatch
from .rule_capabilities import check_proposal
from .rules import drop_nonfinite_drafts
from .stats import SpecStats
from .targets import TargetStep
from .trees import DraftTree, TreeConfig
from .types import Proposal, Verdict


def choose_rounds(state: DecodeState, batched: bool, model_inputs: dict[str, Any], pad_token_id: int
                  ) -> ChainRounds | BatchRounds:
    """The call's shape, chosen once; refuses, with one line, what that shape cannot decode. Takes the attention
    mask out of `model_inputs` for decoder-only targets: a batch's marks each prompt's left padding (the batch then
    joins its columns), one sequence needs none."""
    target, drafter = state.target, state.drafter
    if not batched:
        if not target.is_encoder_decoder:
            mask = model_inputs.pop("attention_mask", None)
            if mask is not None and not bool(mask.bool().all()):
                raise MMSpecError("attention_mask with padding is not supported (batch size 1 needs no padding)")
        return ChainRounds(state) if state.tree is None else TreeRounds(state)
    if state.streamer is not None or state.on_round is not None:
        raise MMSpecError("streamers and on_round hooks follow one sequence; pass a batch of one")
    if state.tree is not None:
        raise MMSpecError("draft trees decode one sequence at a time; pass a batch of one or draft chains")
    if not target.decodes_batches:
        raise MMSpecError(f"{type(target).__name__} decodes one sequence at a time; pass a batch of one")
    if not drafter.drafts_batches:
        raise MMSpecError(f"{type(drafter).__name__} drafts one sequence at a time; pass a batch of one")
    if target.sliding_window is not None:
        raise MMSpecError("a sliding-window target decodes one sequence at a time here; pass a batch of one")
    if state.policy.needs_confidence:
        raise MMSpecError("confidence-stopped draft lengths follow one sequence; use a fixed draft length for a batch")
    padding = None if target.is_encoder_decoder else model_inputs.pop("attention_mask", None)
    return BatchRounds(state, padding, pad_token_id)


class ChainRounds:
    """One sequence drafting chains: the target scores [newest token, drafts] and crops the rejected ones."""

    rides_along = True  # the first drafts may join the target's prefill, as in transformers' assisted generation

    def __init__(self, state: DecodeState) -> None:
        self.state = state
        # The working copies start with the shared objects' counters: the call's forwards are what it adds.
        self.forwards_before = (state.target.forwards, state.drafter.forwards)
        self.sequence: torch.Tensor  # the prompt, then every committed token (set by `begin`)
        self.prompt_length = 0
        self.done = False

    @property
    def live(self) -> bool:
        return not self.done and self.sequence.shape[1] - self.prompt_length < self.state.max_new_tokens

    def budget(self) -> int:
        """The most drafts this round may hold: one token of the room left is the target's own."""
        return self.state.max_new_tokens - (self.sequence.shape[1] - self.prompt_length) - 1

    def view(self, max_tokens: int = 0, tree: TreeConfig | None = None) -> DraftView:
        """What the drafter sees now."""
        state = self.state
        return DraftView(self.sequence, state.sampling, state.generator, state.policy, state.processors, max_tokens,
                         tree=tree, inputs=state.inputs)

    def begin(self, sequence: torch.Tensor, model_inputs: dict[str, Any]) -> Proposal | None:
        """Prefill the drafter; the drafts to verify with the target's prefill (None: none ride along)."""
        self.sequence, self.prompt_length = sequence, sequence.shape[1]
        self.state.drafter.begin(self.view(), model_inputs)
        if not (self.rides_along and self.state.drafter.drafts_from_prompt):
            return None
        return self.propose()

    def start(self, proposal: Proposal | None, model_inputs: dict[str, Any]) -> TargetStep:
        target, drafter = self.state.target, self.state.drafter
        if proposal is not None:
            return target.start(self.sequence, proposal.tokens, **model_inputs)
        step = target.start(self.sequence, **model_inputs)
        drafter.observe(self.view(), None, step)
        return step

    def first(self, token: torch.Tensor) -> None:
        """Commit the prefill's token [1] (no drafts rode along)."""
        self.state.announce(token, token[:0])
        self.sequence = torch.cat([self.sequence, token[:, None]], dim=1)
        self.done = int(token[0]) in self.state.stops

    def propose(self) -> Proposal:
        """The drafter's chain, drafts from a non-finite distribution counted as rejected."""
        state = self.state
        k = min(state.policy.max_tokens(), self.budget())
        proposal = drop_nonfinite_drafts(state.drafter.propose(self.view(k)))  # type: ignore[arg-type]
        check_proposal(state.capabilities, state.rule, proposal)
        return proposal

    def verify(self, proposal: Proposal | DraftTree) -> TargetStep:
        return self.state.target.verify(self.sequence, proposal if isinstance(proposal, DraftTree) else proposal.tokens)

    def commit(self, proposal: Proposal, step: TargetStep, verdict: Verdict) -> None:
        """Append the accepted drafts plus the target's token, crop the rejected drafts from the target's cache."""
        state = self.state
        accepted = verdict.first_accepted()
        new_tokens = torch.cat([proposal.tokens[0, :accepted], verdict.next_token[:1]])
        new_tokens, self.done = truncate_at_stop(new_tokens, state.stops)
        self.sequence = torch.cat([self.sequence, new_tokens[None]], dim=1)
        if state.listening:
            state.announce(new_tokens, proposal.tokens[0], accepted)
        state.target.rollback(proposal.tokens, verdict)
        state.drafter.observe(self.view(), verdict, step)
        state.policy.update(proposal.length, accepted)
        state.stats.record_round(proposal.length, accepted)

    def finish(self) -> torch.Tensor:
        stats = self.state.stats
        stats.new_tokens = self.sequence.shape[1] - self.prompt_length
        stats.target_forwards = self.state.target.forwards - self.forwards_before[0]
        stats.drafter_forwards = self.state.drafter.forwards - self.forwards_before[1]
        return self.sequence


class TreeRounds(ChainRounds):
    """One sequence drafting trees: all nodes are verified in one forward, the caches keep the accepted path."""

    rides_along = False  # a tree is drafted below a token the target chose

    def propose(self) -> DraftTree:  # type: ignore[override]
        state = self.state
        assert state.tree is not None
        max_drafts = self.budget()
        if max_drafts < 1:
            return DraftTree.empty(self.sequence.device)
        return state.drafter.propose(self.view(max_drafts, state.tree.limited(max_drafts)))  # type: ignore[return-value]

    def commit(self, tree: DraftTree, step: TargetStep, verdict: Verdict) -> None:  # type: ignore[override]
        state = self.state
        path = verdict.path
        assert path is not None
        new_tokens = torch.cat([tree.path_tokens(path), verdict.next_token[:1]])
        new_tokens, self.done = truncate_at_stop(new_tokens, state.stops)
        self.sequence = torch.cat([self.sequence, new_tokens[None]], dim=1)
        # The hook's drafts: the accepted path, then the drafter's own first choice below it (rejected).
        proposed = tree.path_tokens(path + tree.best_branch(path[-1] if path else -1))
        state.announce(new_tokens, proposed, len(path))
        state.target.rollback(tree, verdict)
        # Drafters see the verify forward as if it had covered [root, path] only, as after a chain.
        rows = torch.tensor([0] + [i + 1 for i in path], device=step.logits.device)
        hidden = None if step.hidden_states is None else tuple(h.index_select(1, rows.to(h.device)) for h in step.hidden_states)
        state.drafter.observe(self.view(), verdict, TargetStep(logits=step.logits.index_select(1, rows), hidden_states=hidden))
        # For trees `drafted` is the tree's depth: the most tokens a round could accept.
        state.stats.record_round(int(tree.depths().max()) if tree.size else 0, len(path))


class BatchRounds:
    """Rows of a left-padded batch, each accepting its own drafts: every forward appends the same columns to
    every row and a rejected draft's column becomes a hole (`mmspec.ragged`); rows that stop leave the batch.

    Each row follows the tokens it would follow alone, so greedy output equals the row decoded alone and
    sampling keeps each row's distribution. Each row keeps its own counts: a forward over 4 live rows counts
    once for each of them, so tau stays tokens per row per forward; times are the batch's."""

    def __init__(self, state: DecodeState, padding: torch.Tensor | None, pad_token_id: int) -> None:
        self.state = state
        self.padding = padding
        self.pad_token_id = pad_token_id
        self.batch: RaggedBatch  # made by `begin`, from the prompts
        self.prompt: torch.Tensor
        self.row_stats: list[SpecStats] = []
        self.drafter_forwards = 0

    @property
    def live(self) -> bool:
        return bool(self.batch.size)

    def budget(self) -> int:
        """The most drafts this round may hold: the room of the live row with the least left, less the target's own
        token. Every row gets the same draft columns, and a row's columns past its room would sit past the model's
        last position (Whisper's learned position table ends there) for tokens that could never be committed."""
        batch, room = self.batch, self.state.max_new_tokens
        return min(room - len(batch.generated[live]) for live in batch.rows.tolist()) - 1

    def view(self, max_tokens: int = 0) -> DraftView:
        """What the drafter sees now: the batch's columns."""
        state = self.state
        return DraftView(self.batch.tokens, state.sampling, state.generator, state.policy, state.processors, max_tokens,
                         batch=self.batch, inputs=state.inputs)

    def begin(self, sequence: torch.Tensor, model_inputs: dict[str, Any]) -> Proposal | None:
        state, padding = self.state, self.padding
        batch = self.batch = RaggedBatch(sequence, padding)
        if padding is not None and not bool(padding[:, -1].bool().all()):
            raise MMSpecError("pad batches on the left (tokenizer padding_side='left'): a row ends in padding")
        self.prompt = sequence
        self.row_stats = [SpecStats(method=state.stats.method) for _ in range(batch.size)]
        self.drafter_forwards = state.drafter.forwards
        state.drafter.begin(self.view(), model_inputs)
        k = min(state.policy.max_tokens(), self.budget())
        if not state.drafter.drafts_from_prompt or k <= 0:
            return None
        proposal = self._drafts(k)
        if not proposal.length or not state.target.drafts_can_join_prefill(proposal.tokens, model_inputs):
            state.drafter.begin(self.view(), model_inputs)  # forget those drafts; the next round drafts again
            return None
        check_proposal(state.capabilities, state.rule, proposal)
        return proposal

    def start(self, proposal: Proposal | None, model_inputs: dict[str, Any]) -> TargetStep:
        target, drafter = self.state.target, self.state.drafter
        step = target.start(self.batch, None if proposal is None else proposal.tokens, **model_inputs)
        self._count("target", 1)
        drafter.observe(self.view(), None, step)
        self._count("drafter", drafter.forwards - self.drafter_forwards)
        return step

    def first(self, token: torch.Tensor) -> None:
        """Commit each row's prefill token [B] (no drafts rode along)."""
        self._append(token[:, None], torch.ones_like(token[:, None], dtype=torch.bool))

    def _drafts(self, k: int) -> Proposal:
        return drop_nonfinite_drafts(self.state.drafter.propose(self.view(k)))  # type: ignore[arg-type]

    def propose(self) -> Proposal:
        before = self.state.drafter.forwards
        proposal = self._drafts(min(self.state.policy.max_tokens(), self.budget()))
        self._count("drafter", self.state.drafter.forwards - before)
        check_proposal(self.state.capabilities, self.state.rule, proposal)
        return proposal

    def verify(self, proposal: Proposal) -> TargetStep:
        step = self.state.target.verify(self.batch, proposal.tokens)
        self._count("target", 1)
        return step

    def commit(self, proposal: Proposal, step: TargetStep, verdict: Verdict) -> None:
        """Append the round's k draft columns (the rejected ones as holes) and the target's token column."""
        state, batch = self.state, self.batch
        accepted = verdict.num_accepted
        slots = torch.arange(proposal.length, device=accepted.device)[None]
        valid = torch.cat([slots < accepted[:, None], torch.ones_like(accepted[:, None], dtype=torch.bool)], dim=1)
        drafted = [proposal.length] * batch.size if proposal.lengths is None else proposal.lengths.tolist()
        for live, row_drafted, n in zip(batch.rows.tolist(), drafted, accepted.tolist()):
            self.row_stats[live].record_round(row_drafted, n)
        state.policy.update(proposal.length, int(accepted.max()))
        state.drafter.observe(self.view(), verdict, step)
        self._append(torch.cat([proposal.tokens, verdict.next_token[:, None]], dim=1), valid)

    def _append(self, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """Append the round's columns; rows that stopped leave the batch (and every cache)."""
        state, batch = self.state, self.batch
        committed, finished = batch.commit(tokens, valid, state.stops, state.max_new_tokens)
        if state.on_tokens is not None:
            state.on_tokens(committed)
        if finished:
            keep = torch.tensor([b for b in range(batch.size) if b not in finished], dtype=torch.long,
                                device=batch.tokens.device)
            batch.select(keep)
            if batch.size:
                state.target.select_rows(keep)
                state.drafter.select_rows(keep)

    def _count(self, role: str, forwards: int) -> None:
        name = f"{role}_forwards"
        for live in self.batch.rows.tolist():
            setattr(self.row_stats[live], name, getattr(self.row_stats[live], name) + forwards)

    def finish(self) -> torch.Tensor:
        """Prompt + new tokens [B, P + longest], rows that stopped early padded; `stats` holds the sums over
        rows and `stats.rows` each row's own counts."""
        stats, rows = self.state.stats, self.row_stats
        for row, tokens in zip(rows, self.batch.generated):
            row.new_tokens = len(tokens)
            row.prefill_time, row.draft_time, row.verify_time = stats.prefill_time, stats.draft_time, stats.verify_time
            row.total_time = stats.total_time
        total = sum(rows[1:], rows[0])
        for name in ("rounds", "drafted", "accepted", "position_attempts", "position_accepts", "target_forwards",
                     "drafter_forwards", "new_tokens"):
            setattr(stats, name, getattr(total, name))
        stats.rows = rows
        return self.batch.sequences(self.prompt, self.pad_token_id)


def truncate_at_stop(new_tokens: torch.Tensor, stops: set[int]) -> tuple[torch.Tensor, bool]:
    if not stops:  # nothing to find: skip reading the tokens back from the device
        return new_tokens, False
    for i, token in enumerate(new_tokens.tolist()):
        if token in stops:
            return new_tokens[: i + 1], True
    return new_tokens, False
