"""The drafter contract: propose up to k tokens, then observe what the target decided."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from ..errors import MMSpecError
from ..policies import DraftLengthPolicy
from ..ragged import RaggedBatch
from ..sampling import SamplingConfig
from ..trees import DraftTree, TreeConfig
from ..types import Proposal, Verdict


class Drafter(ABC):
    """A source of draft tokens.

    `vocab_size` (None if the drafter does not score a vocabulary) is checked against the
    target's. `forwards` counts the drafter's own model calls for the stats.
    """

    vocab_size: int | None = None
    needs_target_hidden_states: bool = False
    forwards: int = 0
    # True when drafts can be made from the prompt alone, before the target's prefill (then the
    # first verification rides along with the prefill); False for drafters that read target features.
    drafts_from_prompt: bool = True
    # The logits processors the target applies this call (repetition penalty, suppressed tokens,
    # ...), set by the loop; a drafter that scores the target's vocabulary applies them to its own
    # logits with its own prefixes, so its drafts follow the same rules and are accepted more often.
    logits_processor: Any = None
    # True when `propose_tree` is implemented (EAGLE-2 draft trees, see `mmspec.trees`).
    drafts_trees: bool = False
    # True when `propose_batch` / `select_rows` are implemented (batch size > 1, see `mmspec.ragged`).
    drafts_batches: bool = False

    def bind(self, target: Any) -> None:
        """Called once with the `Target` wrapper; self-speculative drafters keep a reference."""

    def accept_inputs(self, input_ids: torch.LongTensor | None, model_inputs: dict[str, Any]) -> None:
        """Called first in every call, with the caller's own inputs, before the target derives anything
        from them (a drafter that runs its own encoder needs the raw encoder inputs)."""

    def prefill(self, sequence: torch.LongTensor, model_inputs: dict[str, Any]) -> None:
        """Called once per generation, before the target's prefill, with the prompt and the target's extra inputs.

        `model_inputs` is the same dict the target's prefill receives next: a drafter may replace
        an input with a derived one both can use (e.g. `encoder_outputs` for `input_features`,
        so the encoder runs once).
        """

    def on_target_prefill(self, sequence: torch.LongTensor, step: Any) -> None:
        """Called right after the target's prefill of `sequence` (drafters that read the target's state)."""

    @abstractmethod
    def propose(
        self,
        sequence: torch.LongTensor,
        max_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        policy: DraftLengthPolicy,
    ) -> Proposal:
        """Up to `max_tokens` draft tokens continuing `sequence` [B, L]."""

    def propose_tree(self, sequence: torch.LongTensor, config: TreeConfig, sampling: SamplingConfig,
                     generator: torch.Generator | None) -> DraftTree:
        """A draft tree below the newest token of `sequence` [1, L], no deeper than `config.depth`.
        After verification `observe` receives a verdict whose `path` lists the accepted nodes."""
        raise MMSpecError(f"{type(self).__name__} cannot draft trees; draft chains (leave tree unset)")

    def propose_batch(self, batch: RaggedBatch, max_tokens: int, sampling: SamplingConfig,
                      generator: torch.Generator | None) -> Proposal:
        """Up to `max_tokens` drafts per live row of `batch`, continuing each row's newest column. Rows
        may draft fewer (`Proposal.lengths`). Rejected drafts become holes in `batch` afterwards."""
        raise MMSpecError(f"{type(self).__name__} drafts one sequence at a time; pass a batch of one")

    def prefill_batch(self, batch: RaggedBatch, model_inputs: dict[str, Any]) -> None:
        """Batch decoding's `prefill`: called once, before the target's prefill of `batch`."""
        self.prefill(batch.tokens, model_inputs)

    def on_target_prefill_batch(self, batch: RaggedBatch, step: Any) -> None:
        """Batch decoding: called right after the target's prefill of `batch` (drafters that read its state)."""

    def observe_batch(self, batch: RaggedBatch, verdict: Verdict, target_step: Any) -> None:
        """Batch decoding: called after verification, before `batch` receives the round's columns."""

    def select_rows(self, keep: torch.LongTensor) -> None:
        """Keep only the live rows at indices `keep` (the others finished)."""

    def observe(self, sequence: torch.LongTensor, verdict: Verdict, target_step: Any) -> None:
        """Called after the target committed tokens; `sequence` is the new committed sequence."""
