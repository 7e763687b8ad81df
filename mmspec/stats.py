"""One statistics object for every method and modality."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Iterator


@dataclass
class SpecStats:
    """Counters and timings of one generation (or a sum of several).

    tau is tokens committed per target forward, bonus included, so plain decoding gives 1.0;
    alpha is accepted drafts / drafted tokens. Per-position acceptance: of the rounds that
    reached draft position i (all earlier drafts accepted), the share that accepted it. With draft
    trees a round's "drafted" is the tree's depth (the most it could accept) and position i is depth i.
    """

    method: str = "speculative"
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    position_attempts: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    target_forwards: int = 0
    drafter_forwards: int = 0
    new_tokens: int = 0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    total_time: float = 0.0
    # A batch's per-row stats (counts of that row, times of the whole batch); None for one sequence.
    rows: list["SpecStats"] | None = field(default=None, repr=False)

    def record_round(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        while len(self.position_attempts) < drafted:
            self.position_attempts.append(0)
            self.position_accepts.append(0)
        for i in range(min(accepted + 1, drafted)):
            self.position_attempts[i] += 1
        for i in range(accepted):
            self.position_accepts[i] += 1

    @contextmanager
    def timer(self, phase: str) -> Iterator[None]:
        """Adds the wall time of the block to `<phase>_time`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            name = f"{phase}_time"
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def step_compression(self) -> float:
        """Image-AR name for tau: tokens per target forward."""
        return self.tau

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / n if n else 0.0 for a, n in zip(self.position_accepts, self.position_attempts)]

    def __add__(self, other: "SpecStats") -> "SpecStats":
        """The shared counters and times summed; a subclass's own records (per scale, per window) are not."""
        total = SpecStats(method=self.method)
        for spec in fields(SpecStats):
            name, value = spec.name, getattr(self, spec.name)
            if name in ("method", "rows"):
                continue
            if isinstance(value, list):
                mine, theirs = value, getattr(other, name)
                size = max(len(mine), len(theirs))
                merged = [(mine[i] if i < len(mine) else 0) + (theirs[i] if i < len(theirs) else 0) for i in range(size)]
                setattr(total, name, merged)
            else:
                setattr(total, name, value + getattr(other, name))
        return total

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("rows")
        data.update(
            tau=self.tau,
            step_compression=self.tau,
            alpha=self.alpha,
            tokens_per_second=self.tokens_per_second,
            per_position_acceptance=self.per_position_acceptance,
        )
        return data

    def summary(self) -> str:
        return (
            f"{self.method}: {self.new_tokens} new tokens, tau {self.tau:.2f}, alpha {self.alpha:.2f}, "
            f"{self.target_forwards} target / {self.drafter_forwards} drafter forwards, "
            f"{self.total_time * 1e3:.0f} ms ({self.tokens_per_second:.1f} tok/s; prefill {self.prefill_time * 1e3:.0f}, "
            f"draft {self.draft_time * 1e3:.0f}, verify {self.verify_time * 1e3:.0f} ms)"
        )
