"""The statistics of the image methods that do not decode token by token: VAR's scales (ar and CoDe) and MAR's
steps and verified windows (ar and CSpD), as `SpecStats` with typed per-scale / per-window records.

Every image pipeline's output carries a `SpecStats` as `stats`; these subclasses add what only these methods
have, so `out.stats.target_forwards` reads alike everywhere and `out.stats.scales` / `out.stats.windows` say
the rest. Summing stats (`a + b`) keeps the shared counters (`SpecStats.__add__`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmspec.stats import SpecStats


@dataclass(frozen=True)
class ScaleRecord:
    """One scale of a next-scale generation, over the whole batch.

    scale: its index (0 = the 1 x 1 map); side: its map's side (side x side tokens per image); tokens: the
    tokens it made (all images); by: the model that made it ("model": the large VAR, "refiner": CoDe's small
    one); prefill: whether that forward was a block-causal prefill over the earlier scales (the refiner's first).
    """

    scale: int
    side: int
    tokens: int
    by: str
    prefill: bool = False


@dataclass
class ScaleStats(SpecStats):
    """`SpecStats` of a VAR generation (ar or CoDe) plus one `ScaleRecord` per scale.

    draft_scales: CoDe's split N (the large model runs scales 0..N-1, the refiner the rest); None for ar.
    target_forwards counts the large model's forwards, drafter_forwards the refiner's.
    """

    draft_scales: int | None = None
    scales: list[ScaleRecord] = field(default_factory=list)

    def scales_by(self, model: str) -> int:
        """How many scales `model` ("model" or "refiner") made."""
        return sum(1 for record in self.scales if record.by == model)


@dataclass(frozen=True)
class WindowRecord:
    """One window CSpD verified in one target forward.

    steps: schedule steps the draft ran in it; drafted / accepted: its tokens drafted and kept (all images);
    residual_fallbacks: rejected tokens whose residual redraw never succeeded (they take a draw of the target's
    density); left: tokens still unknown after the window.
    """

    steps: int
    drafted: int
    accepted: int
    residual_fallbacks: int
    left: int


@dataclass
class StepStats(SpecStats):
    """`SpecStats` of a MAR generation (ar or CSpD): the schedule it followed and CSpD's windows.

    schedule: tokens still unknown after each target step (ar: every step of the cosine schedule; CSpD: the
    pre-filled steps, then one entry per verified window: the schedule its output is distributed as);
    prefill_steps: steps the target ran itself before drafting (CSpD); windows: one `WindowRecord` per
    verified window (empty for ar).
    """

    schedule: list[int] = field(default_factory=list)
    prefill_steps: int = 0
    windows: list[WindowRecord] = field(default_factory=list)

    @property
    def residual_fallbacks(self) -> int:
        return sum(window.residual_fallbacks for window in self.windows)
