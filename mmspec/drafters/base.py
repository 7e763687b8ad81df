"""The drafter contract: five hooks, one for each moment of a call, whatever the call's shape.

    bind(target)                      once, when a decoder is built (self-speculative drafters keep the target)
    begin(view, model_inputs)         once per call, before the target's prefill
    propose(view)                     a round's drafts: a `Proposal`, or a `DraftTree` when `view.tree` is set
    observe(view, verdict, step)      after the target's forward: its prefill (verdict None), then every round
    select_rows(keep)                 batch decoding: rows that finished leave

The shape of a call (one sequence drafting chains, one drafting trees, a batch of rows) is in the `DraftView`
each hook receives; a drafter declares the shapes beyond chains it drafts (`drafts_trees`, `drafts_batches`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import MMSpecError
from ..policies import DraftLengthPolicy
from ..ragged import RaggedBatch
from ..sampling import SamplingConfig
from ..trees import DraftTree, TreeConfig
from ..types import Proposal, Verdict

# Hooks of earlier versions, and the hook that does their work now.
RETIRED_HOOKS = {
    "accept_inputs": "begin", "prefill": "begin", "prefill_batch": "begin",
    "on_target_prefill": "observe (verdict None)", "on_target_prefill_batch": "observe (verdict None)",
    "propose_tree": "propose (view.tree)", "propose_batch": "propose (view.batch)", "observe_batch": "observe (view.batch)",
}


@dataclass
class DraftView:
    """What a drafter sees of one call at one hook.

    `sequence` [B, L] is the committed sequence (a batch's columns, holes included, when `batch` is set).
    `max_tokens` is the most drafts a chain or a row may hold this round; with `tree` set the round drafts a
    tree within that config (already limited to the room left). `processors` are the logits processors the
    target applies this call (repetition penalty, suppressed tokens, ...): a drafter that scores the target's
    vocabulary applies them to its own logits with its own prefixes, so its drafts follow the same rules.
    `inputs` are the caller's own model inputs (a drafter with an encoder of its own runs it on them).
    """

    sequence: torch.Tensor
    sampling: SamplingConfig
    generator: torch.Generator | None
    policy: DraftLengthPolicy
    processors: Any = None
    max_tokens: int = 0
    batch: RaggedBatch | None = None
    tree: TreeConfig | None = None
    inputs: dict[str, Any] | None = None


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
    # The shapes beyond one sequence's chains that `propose` serves: trees (`view.tree`, EAGLE-2 draft trees,
    # see `mmspec.trees`) and batches (`view.batch`, several rows, see `mmspec.ragged`; then `select_rows` too).
    drafts_trees: bool = False
    drafts_batches: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, now in RETIRED_HOOKS.items():
            if name in vars(cls):
                raise MMSpecError(f"{cls.__name__}.{name} is never called: drafter hooks are bind, begin, propose, observe "
                                  f"and select_rows, each taking a DraftView; move its work to {now}")

    def bind(self, target: Any) -> None:
        """Called once with the `Target` wrapper; self-speculative drafters keep a reference."""

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        """A new call: `view.sequence` is the prompt (the decoder prompt of an encoder-decoder), `model_inputs` the
        target's other inputs, the same dict its prefill receives next: a drafter may replace an input with a derived
        one both can use (e.g. `encoder_outputs` for `input_features`, so the encoder runs once). May be called again
        before the target's prefill (batch decoding forgets drafts that cannot ride along)."""

    @abstractmethod
    def propose(self, view: DraftView) -> Proposal | DraftTree:
        """Up to `view.max_tokens` drafts continuing `view.sequence`; with `view.batch` set, per live row (rows may
        draft fewer, `Proposal.lengths`); with `view.tree` set, a `DraftTree` below the newest token, whose accepted
        nodes the next `observe` receives as `verdict.path`."""

    def observe(self, view: DraftView, verdict: Verdict | None, target_step: Any) -> None:
        """After a target forward: its prefill (`verdict` None; only when no drafts rode along with it on one
        sequence, always on a batch), then each round's verification, with the target's step. On one sequence
        `view.sequence` already holds the round's tokens; a batch receives its columns after this call."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the live rows at indices `keep` (the others finished)."""
