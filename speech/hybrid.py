"""Hybrid decoding: a fast decoder's whole hypothesis is the draft; the big decoder verifies and corrects.

Lim et al., "Hybrid Decoding: Rapid Pass and Selective Detailed Correction for Sequence Models"
(arXiv 2508.19671). Per utterance:

1. the encoder runs once; the fast decoder (a CTC head on the same encoder output) produces the
   whole hypothesis in one non-autoregressive pass;
2. the big decoder verifies the hypothesis in one teacher-forced pass (the shared loop's verify
   step; the first draft rides along with the decoder prefill) and accepts the matching prefix;
3. at the first mismatch the big decoder's own token is committed (the correction), and the rest
   of the hypothesis is RE-ALIGNED to the corrected transcript (`align_hypothesis`) so it keeps
   serving as the draft; repeat until end-of-text is verified.

Re-alignment (our design; the paper's method section is not public). The drafter keeps `offset`,
the hypothesis position minus the committed length at the last alignment, so that
`anchor = len(committed) + offset` is where the hypothesis resumes if the correction was a
substitution. Each round it looks for, in order:

- an exact match: the committed text is a prefix of the hypothesis (no error so far);
- the longest suffix of the committed text (up to `max_suffix` tokens) that occurs in the
  hypothesis ending near the anchor (a suffix of n tokens may land up to min(window, 2n)
  positions away; closest to the anchor wins, ties go forward): this handles an inserted
  hypothesis token (the correction is found a little ahead), a deleted one (the next correction
  is found a little behind), and resynchronises after longer disagreements;
- otherwise, right after a correction, the substitution guess: resume at the anchor (skip the
  hypothesis token that was replaced);
- otherwise nothing: the loop decodes one token normally and alignment is tried again next round.

Guards: the hypothesis is consumed only forward (a position before the furthest accepted draft is
never proposed again, so a draft can never loop over the same stretch, in relaxed mode neither);
after `max_misses` consecutive rounds whose drafts were all rejected the drafter goes quiet until
a suffix of at least `resync_tokens` tokens matches again (non-progress guard: no more wasted
verification of a hypothesis that has drifted away).

Acceptance: `strict` is the core's exact greedy match (output identical to the target's greedy
decoding); `relaxed` is `relaxed_top_r_rule` below (not lossless).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any, Protocol, Sequence

import torch

from ..decoding import SpeculativeDecoder, SpeculativeOutput
from ..drafters.base import Drafter, DraftView
from ..errors import MMSpecError
from ..policies import DraftLengthPolicy, FixedDraftLength
from ..ragged import RaggedBatch
from ..rule_capabilities import RuleCapabilities, declare_rule
from ..rules import AcceptanceRule, greedy_match, leading_true_count
from ..sampling import SamplingConfig
from ..types import Proposal, Verdict
from .target import WhisperTarget, encoder_outputs_of

MODES = ("strict", "relaxed")
DEFAULT_DRAFT_TOKENS = 64


class HypothesisSource(Protocol):
    """What the drafter needs from a fast decoder: whole hypotheses from encoder states [B, T, D]."""

    def hypothesis(self, encoder_hidden_states: torch.Tensor) -> list[list[int]]: ...


def align_hypothesis(
    committed: Sequence[int],
    hypothesis: Sequence[int],
    anchor: int,
    *,
    window: int = 8,
    max_suffix: int = 8,
    min_suffix: int = 1,
    floor: int = 0,
) -> int | None:
    """Where in `hypothesis` the committed transcript ends: the index the draft resumes from, or None.

    Pure function. `committed` is the transcript so far (after the forced prompt), `anchor` the
    expected resume position. An exact prefix match wins; otherwise the longest suffix of
    `committed` (between `min_suffix` and `max_suffix` tokens) found in `hypothesis` ending within
    min(`window`, 2 x suffix length) of `anchor` and not before `floor`; among equally long
    matches the one closest to the anchor, ties to the later one.
    """
    committed = list(committed)
    hypothesis = list(hypothesis)
    length = len(committed)
    if length <= len(hypothesis) and hypothesis[:length] == committed and length >= floor:
        return length
    for n in range(min(max_suffix, length), min_suffix - 1, -1):
        # A short suffix matches by chance far more often than a long one: it may only move the
        # draft a little (an inserted or deleted token or two); long ones may jump the whole window.
        reach = min(window, 2 * n)
        lo = max(floor, anchor - reach, n)
        hi = min(len(hypothesis), anchor + reach)
        tail = committed[length - n :]
        best: int | None = None
        for end in range(lo, hi + 1):
            if hypothesis[end - n : end] == tail:
                if best is None or abs(end - anchor) < abs(best - anchor) or (
                    abs(end - anchor) == abs(best - anchor) and end > best
                ):
                    best = end
        if best is not None:
            return best
    return None


@dataclass
class HybridStats:
    """How the hypothesis was used in the last generation (for benchmarks and debugging)."""

    hypothesis_length: int = 0
    exact: int = 0
    suffix: int = 0
    substitution: int = 0
    unaligned: int = 0
    quiet: int = 0

    def __add__(self, other: "HybridStats") -> "HybridStats":
        return HybridStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


class HybridDrafter(Drafter):
    """Drafts the remainder of a fast decoder's whole-utterance hypothesis (see the module docstring).

    Args:
        fast_decoder: a `CTCFastDecoder` (or anything with `hypothesis(encoder_states)`).
        window: how far (in hypothesis tokens) from the expected position a re-alignment may land.
        max_suffix: the longest committed suffix tried when re-aligning.
        max_misses: consecutive fully rejected rounds before the drafter goes quiet.
        resync_tokens: suffix length needed to start drafting again after going quiet.
    """

    def __init__(
        self,
        fast_decoder: HypothesisSource,
        *,
        window: int = 8,
        max_suffix: int = 8,
        max_misses: int = 3,
        resync_tokens: int = 2,
    ) -> None:
        if window < 0 or max_suffix < 1 or max_misses < 1 or resync_tokens < 1:
            raise MMSpecError("HybridDrafter needs window >= 0, max_suffix >= 1, max_misses >= 1, resync_tokens >= 1")
        self.fast_decoder = fast_decoder
        config = getattr(fast_decoder, "config", None)
        self.vocab_size = getattr(config, "vocab_size", None)
        self.window = window
        self.max_suffix = max_suffix
        self.max_misses = max_misses
        self.resync_tokens = resync_tokens
        self.target: Any = None
        self.forwards = 0
        self.hypothesis: list[int] = []
        self.stats = HybridStats()
        self._reset()

    def _reset(self) -> None:
        self.prompt_length = 0
        self.offset = 0
        self.floor = 0
        self.misses = 0
        self.after_correction = False
        self._last: tuple[int, int] | None = None  # (hypothesis start, drafts proposed) of the last proposal

    def bind(self, target: Any) -> None:
        self.target = target

    def _start(self, sequence: torch.LongTensor, model_inputs: dict[str, Any]) -> torch.Tensor:
        """A new utterance: cursors reset; the encoder states (run once: their output replaces input_features
        for the target)."""
        self._reset()
        self.prompt_length = sequence.shape[1]
        if self.target is None:
            raise MMSpecError("HybridDrafter must be bound to a target (use it through SpeculativeDecoder)")
        return encoder_outputs_of(self.target.model, model_inputs).last_hidden_state

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        """Run the encoder and the fast decoder: one hypothesis per recording (a batch's each with its own cursor)."""
        self._hypotheses = self.fast_decoder.hypothesis(self._start(view.sequence, model_inputs))
        self.forwards += 1
        self.set_hypothesis(self._hypotheses[0])
        if view.batch is not None:
            self._start_cursors(view.batch)

    def set_hypothesis(self, tokens: Sequence[int]) -> None:
        self.hypothesis = [int(t) for t in tokens]
        self.stats = HybridStats(hypothesis_length=len(self.hypothesis))

    def propose(self, view: DraftView) -> Proposal:
        sequence, batch, max_tokens = view.sequence, view.batch, view.max_tokens
        if batch is None:
            drafts = [self.draft_for(sequence[0, self.prompt_length :].tolist(), max_tokens)]
        else:
            drafts = [self._cursors[row].draft_for(batch.generated[row], max_tokens) for row in batch.rows.tolist()]
        longest = max(len(d) for d in drafts)
        if longest == 0:
            return Proposal.empty(sequence)
        if batch is None:
            return Proposal(tokens=torch.tensor(drafts, dtype=sequence.dtype, device=sequence.device))
        tokens = sequence.new_zeros((batch.size, longest))
        for b, row_drafts in enumerate(drafts):
            tokens[b, : len(row_drafts)] = torch.tensor(row_drafts, dtype=tokens.dtype, device=tokens.device)
        return Proposal(tokens=tokens, lengths=torch.tensor([len(d) for d in drafts], device=tokens.device))

    def draft_for(self, committed: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` hypothesis tokens continuing the `committed` transcript (none if it cannot align)."""
        self._last = None
        if max_tokens <= 0 or not self.hypothesis:
            return []
        start = self._align(committed)
        if start is None or start >= len(self.hypothesis):
            return []
        self.offset = start - len(committed)
        drafts = self.hypothesis[start : start + max_tokens]
        self._last = (start, len(drafts))
        return drafts

    def _align(self, committed: list[int]) -> int | None:
        anchor = len(committed) + self.offset
        quiet = self.misses >= self.max_misses
        start = align_hypothesis(
            committed, self.hypothesis, anchor, window=self.window, max_suffix=self.max_suffix,
            min_suffix=self.resync_tokens if quiet else 1, floor=self.floor,
        )
        if start is not None:
            if start == len(committed) and self.hypothesis[: len(committed)] == committed:
                self.stats.exact += 1
            else:
                self.stats.suffix += 1
            if quiet:
                self.misses = 0
            return start
        if quiet:
            self.stats.quiet += 1
            return None
        if self.after_correction and self.floor <= anchor < len(self.hypothesis):
            self.stats.substitution += 1
            return anchor
        self.stats.unaligned += 1
        return None

    def observe(self, view: DraftView, verdict: Verdict | None, target_step: Any) -> None:
        if verdict is None:
            return
        if view.batch is None:
            self.after_verdict(int(verdict.num_accepted[0]))
            return
        for row, accepted in zip(view.batch.rows.tolist(), verdict.num_accepted.tolist()):
            self._cursors[row].after_verdict(accepted)
        self.stats = sum((c.stats for c in self._cursors.values()), HybridStats())

    def after_verdict(self, accepted: int) -> None:
        """Move the cursor past what the target accepted of the last drafts."""
        if self._last is None:
            self.after_correction = False
            return
        start, drafted = self._last
        if accepted:
            self.floor = max(self.floor, start + accepted)
        self.misses = self.misses + 1 if accepted == 0 and drafted > 0 else 0
        # The round ended with the target's own token (a correction, or a bonus that may differ from
        # the hypothesis): next round may guess a substitution at the anchor.
        self.after_correction = True


    # --- batches: one alignment cursor per recording, each over its own hypothesis ------------------

    drafts_batches = True

    def _start_cursors(self, batch: RaggedBatch) -> None:
        """One alignment cursor per recording, over its own hypothesis (`self._hypotheses[row]`)."""
        self._cursors = {}
        for row in batch.rows.tolist():
            cursor = copy.copy(self)
            cursor._reset()
            cursor.prompt_length = batch.width
            cursor.set_hypothesis(self._hypotheses[row])
            self._cursors[row] = cursor


# --- acceptance ---------------------------------------------------------------------------------

def relaxed_top_r_rule(top_r: int = 3, margin: float = 2.0) -> AcceptanceRule:
    """A relaxed acceptance rule for hybrid decoding: accept a draft the big decoder ranks highly enough.

    Draft token x at position i is accepted while (both):
      - x is among the target's `top_r` tokens at position i, and
      - log p_i(argmax) - log p_i(x) <= `margin` (nats) (p = softmax of the target's processed logits).
    At the first draft that fails, the target's argmax is committed (as in greedy decoding); after
    a fully accepted draft the bonus token is the target's argmax.

    NOT lossless: the output may differ from the target's greedy transcript wherever the target
    is unsure between near-equal tokens and the fast decoder picked a runner-up. The aim is the
    repetition robustness reported for hybrid decoding: the non-autoregressive hypothesis does not
    feed on its own output, so letting it win near-ties keeps the big decoder from locking into a
    repetition loop. `top_r=1` (or `margin=0`) reduces to strict greedy match. Its effect on WER
    and on repetitions must be measured (`mmspec bench speech`), not assumed.

    Greedy only: with sampling, use the strict rule (speculative sampling is lossless).
    """
    if top_r < 1:
        raise MMSpecError(f"top_r must be >= 1, got {top_r}")
    if margin < 0:
        raise MMSpecError(f"margin must be >= 0, got {margin}")

    def relaxed_top_r(
        proposal: Proposal,
        target_logits: torch.Tensor,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> Verdict:
        if sampling is not None and sampling.do_sample:
            raise MMSpecError("the relaxed hybrid rule is greedy only; use mode='strict' to sample")
        k = proposal.length
        log_probs = target_logits.float().log_softmax(-1)
        choice = log_probs.argmax(dim=-1)
        if k == 0:
            return Verdict(num_accepted=torch.zeros(choice.shape[0], dtype=torch.long, device=choice.device), next_token=choice[:, 0])
        head = log_probs[:, :k]
        draft_lp = head.gather(-1, proposal.tokens[..., None]).squeeze(-1)
        best_lp = head.max(dim=-1).values
        rank = (head > draft_lp[..., None]).sum(dim=-1)  # tokens strictly better than the draft
        ok = (rank < top_r) & (best_lp - draft_lp <= margin) & torch.isfinite(draft_lp)
        valid = proposal.valid()  # a batch's rows may draft fewer: their padding is never accepted
        num_accepted = leading_true_count(ok if valid is None else ok & valid)
        next_token = choice.gather(1, num_accepted[:, None]).squeeze(1)
        return Verdict(num_accepted=num_accepted, next_token=next_token)

    return declare_rule(RuleCapabilities(ragged_drafts=True, settings={"top_r": top_r, "margin": margin}))(relaxed_top_r)


def hybrid_rule(mode: str = "strict", top_r: int = 3, margin: float = 2.0) -> AcceptanceRule:
    """The acceptance rule for a hybrid decoding mode: `strict` (exact greedy match) or `relaxed`."""
    if mode not in MODES:
        raise MMSpecError(f"unknown hybrid mode {mode!r}; choose from {', '.join(MODES)}")
    return greedy_match if mode == "strict" else relaxed_top_r_rule(top_r, margin)


def hybrid_policy(num_tokens: int = DEFAULT_DRAFT_TOKENS) -> DraftLengthPolicy:
    """Draft the whole remaining hypothesis (up to `num_tokens`) each round."""
    return FixedDraftLength(num_tokens)


def hybrid_drafter_for(fast_decoder: Any, **kwargs: Any) -> HybridDrafter:
    """The hybrid drafter a fast decoder needs: its own (`make_hybrid_drafter`, e.g. the AR fast
    decoder's incremental one), else the generic `HybridDrafter`."""
    make = getattr(fast_decoder, "make_hybrid_drafter", None)
    return make(**kwargs) if make is not None else HybridDrafter(fast_decoder, **kwargs)


def hybrid_generate(
    target: Any,
    fast_decoder: HypothesisSource,
    input_features: torch.Tensor,
    *,
    mode: str = "strict",
    max_new_tokens: int = 128,
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS,
    top_r: int = 3,
    margin: float = 2.0,
    language: str | None = None,
    task: str | None = None,
    **drafter_kwargs: Any,
) -> SpeculativeOutput:
    """Transcribe one chunk (or a batch [B, mels, frames]) with hybrid decoding; `sequences` = forced prompt +
    transcript (+ end-of-text; rows of a batch that end early are padded with end-of-text, as `generate` pads).

    `target` is a Whisper model or a `WhisperTarget`. In `strict` mode the output equals
    `model.generate(input_features, do_sample=False, max_new_tokens=..., return_dict_in_generate=True).sequences`.
    The call's drafter is available as `output.drafter` for its alignment statistics.
    """
    if not isinstance(target, WhisperTarget):
        target = WhisperTarget(target, language=language, task=task)
    drafter = hybrid_drafter_for(fast_decoder, **drafter_kwargs)
    decoder = SpeculativeDecoder(target, drafter, policy=hybrid_policy(num_draft_tokens), rule=hybrid_rule(mode, top_r, margin),
                                 method=f"hybrid-{mode}")
    inputs: dict[str, Any] = {"input_features": input_features}
    if input_features.shape[0] == 1:
        inputs["decoder_input_ids"] = target.prompt_ids(inputs)
        prompt_length = inputs["decoder_input_ids"].shape[1]
    else:  # a batch: the target builds each recording's prompt (all of one length) itself
        prompt_length = target.prompt_ids({"input_features": input_features[:1]}).shape[1]
    max_new_tokens = target.max_new_tokens_for(prompt_length, max_new_tokens)
    return decoder.generate(None, max_new_tokens=max_new_tokens, **inputs)
