"""Draft-length policies: how many tokens the drafter proposes each round.

A policy is asked `max_tokens()` before a round, `keep_drafting(confidence)` after each drafted
token (confidence = the drafter's probability of the token it just proposed), and `update()`
with the round's outcome. Policies are swappable and independent of drafters and rules.
"""

from __future__ import annotations

from .errors import MMSpecError


class DraftLengthPolicy:
    """Base policy: a fixed maximum, never stops early. Subclasses override what they change."""

    needs_confidence = False

    def __init__(self, num_tokens: int = 5) -> None:
        if num_tokens < 1:
            raise MMSpecError(f"the number of draft tokens must be >= 1, got {num_tokens}")
        self.num_tokens = num_tokens

    def max_tokens(self) -> int:
        return self.num_tokens

    def keep_drafting(self, confidence: float) -> bool:
        return True

    def update(self, drafted: int, accepted: int) -> None:
        pass

    def fresh(self) -> "DraftLengthPolicy":
        """A copy in its initial state, so each generation starts from the same schedule."""
        return type(self)(**self._init_kwargs())

    def _init_kwargs(self) -> dict:
        return {"num_tokens": self.num_tokens}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self._init_kwargs().items())
        return f"{type(self).__name__}({args})"


class FixedDraftLength(DraftLengthPolicy):
    """Always draft k tokens."""


class HeuristicDraftLength(DraftLengthPolicy):
    """transformers' "heuristic" schedule: +2 after a fully accepted round, -1 (min 1) otherwise."""

    def __init__(self, num_tokens: int = 5, max_num_tokens: int = 32) -> None:
        super().__init__(num_tokens)
        self.initial = num_tokens
        self.max_num_tokens = max_num_tokens

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if accepted == drafted:
            self.num_tokens = min(self.num_tokens + 2, self.max_num_tokens)
        else:
            self.num_tokens = max(1, self.num_tokens - 1)

    def _init_kwargs(self) -> dict:
        return {"num_tokens": self.initial, "max_num_tokens": self.max_num_tokens}


class ConfidenceStopDraftLength(DraftLengthPolicy):
    """Adaptive stop (SpecDec++-style, without a trained head): draft up to k tokens, but stop as
    soon as the drafter's probability of its own proposal falls below `threshold`, since a
    low-confidence draft is likely rejected and every further draft token would be wasted."""

    needs_confidence = True

    def __init__(self, num_tokens: int = 8, threshold: float = 0.4) -> None:
        super().__init__(num_tokens)
        if not 0.0 <= threshold <= 1.0:
            raise MMSpecError(f"confidence threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def keep_drafting(self, confidence: float) -> bool:
        return confidence >= self.threshold

    def _init_kwargs(self) -> dict:
        return {"num_tokens": self.num_tokens, "threshold": self.threshold}


POLICIES = {"fixed": FixedDraftLength, "heuristic": HeuristicDraftLength, "adaptive": ConfidenceStopDraftLength}


def make_policy(name: str, num_tokens: int, **kwargs) -> DraftLengthPolicy:
    if name not in POLICIES:
        raise MMSpecError(f"unknown draft-length policy {name!r}; choose from {sorted(POLICIES)}")
    return POLICIES[name](num_tokens=num_tokens, **kwargs)
