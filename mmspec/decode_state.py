"""One decoding call's state, so that a decoder, target and drafter can serve several calls at once.

Everything a call changes lives here: its settings, callbacks, streamer, stop tokens, stats, the policy's
per-call copy, and working copies of the target and drafter (`working_copies`): the same weights, their own
caches, counters and processors. The tokens committed so far live in the call's round strategy
(`mmspec.rounds`), which holds this state. The shared objects the user built are only read.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .drafters import Drafter
from .policies import DraftLengthPolicy
from .rule_capabilities import RuleCapabilities
from .sampling import SamplingConfig
from .stats import SpecStats
from .targets import Target
from .trees import TreeConfig

# on_round(tokens, drafted, accepted, proposed): the tokens committed, the draft count, how many drafts were
# kept, and the drafts themselves (1-D, before verification; empty for the prefill's token).
RoundHook = Callable[[torch.LongTensor, int, int, torch.LongTensor], None]


def working_copies(target: Target, drafter: Drafter) -> tuple[Target, Drafter]:
    """Per-call copies of `target` and `drafter` sharing their weights and tensors: every mmspec object they
    hold (cached models, cursors, helpers) is copied, so a call's caches and counters are its own. A drafter
    bound to the target refers to the target's copy."""
    memo: dict[int, Any] = {}
    return _copied(target, memo), _copied(drafter, memo)


def _owned(value: Any) -> bool:
    """mmspec's stateful objects, and users' subclasses of them (not modules, tensors, classes, pipelines,
    objects that declare themselves shared by every call (`shared_by_calls`: compiled graphs) or other
    libraries' objects)."""
    if isinstance(value, (torch.nn.Module, type)) or getattr(type(value), "shared_by_calls", False):
        return False
    if not any(kind.__module__.startswith("mmspec") for kind in type(value).__mro__[:-1]):
        return False
    return hasattr(value, "__dict__") and not hasattr(value, "components")  # pipelines are shared, not copied


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    key = id(value)
    if key in memo:
        return memo[key]
    if type(value) is dict:
        new_dict: dict[Any, Any] = {}
        memo[key] = new_dict
        new_dict.update((k, _copied(v, memo)) for k, v in value.items())
        return new_dict
    if type(value) is list:
        new_list: list[Any] = []
        memo[key] = new_list
        new_list.extend(_copied(v, memo) for v in value)
        return new_list
    if type(value) is tuple:
        return tuple(_copied(v, memo) for v in value)
    if isinstance(value, types.MethodType) and _owned(value.__self__):  # a bound method kept as an attribute
        return types.MethodType(value.__func__, _copied(value.__self__, memo))
    if not _owned(value):
        return value
    new = copy.copy(value)
    memo[key] = new
    for name, attribute in vars(new).items():
        vars(new)[name] = _copied(attribute, memo)
    return new


@dataclass
class DecodeState:
    """One call: the working target and drafter, how to judge, when to stop, whom to tell."""

    target: Target
    drafter: Drafter
    rule: Any
    capabilities: RuleCapabilities
    sampling: SamplingConfig
    generator: torch.Generator | None
    policy: DraftLengthPolicy
    stops: set[int]
    stats: SpecStats
    max_new_tokens: int = 0
    tree: TreeConfig | None = None
    on_tokens: Callable[[int], None] | None = None
    on_round: RoundHook | None = None
    streamer: Any = None
    inputs: dict[str, Any] | None = None  # the caller's own model inputs (the drafter's view carries them)
    processors: Any = None  # the logits processors `generate` would apply this call (the drafter's view carries them)

    @property
    def listening(self) -> bool:
        """Whether any callback or streamer waits for `announce` (when none does, its arguments need not be built)."""
        return self.on_tokens is not None or self.on_round is not None or self.streamer is not None

    def announce(self, new_tokens: torch.Tensor, proposed: torch.Tensor, accepted: int = 0) -> None:
        """Tell the progress callbacks and the streamer about tokens just committed (1-D) and the drafts (1-D) behind them."""
        if self.on_tokens is not None:
            self.on_tokens(new_tokens.shape[0])
        if self.on_round is not None:
            self.on_round(new_tokens, int(proposed.shape[0]), accepted, proposed)
        if self.streamer is not None:
            self.streamer.put(new_tokens[None].cpu())
