"""Side-by-side benchmark harness: every method, same process, same inputs.

Methods are run after a warm-up, interleaved input by input: each input goes through every method
before the next input, in an order that rotates, and the whole pass is repeated. A busy spell of the
machine (a neighbour, a slow minute) then falls on all methods alike instead of on whichever one was
running. Wall times are medians over repetitions of the total over all inputs, shown with their min and
max, and the table warns when they spread too widely to trust (a busy machine).
Every output is compared with the reference method's (plain greedy decoding).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ..stats import SpecStats
from .results import note_report

# A method takes one input and returns (new token ids, stats of that call).
MethodFn = Callable[[Any], tuple[list[int], SpecStats]]

# (max - min) / median of a method's wall times above which its speed-up is not trusted.
UNTRUSTED_SPREAD = 0.25


@dataclass
class MethodResult:
    name: str
    stats: SpecStats
    wall_times: list[float] = field(default_factory=list)
    prefill_times: list[float] = field(default_factory=list)  # per repetition: the summed prefill (mmspec loops)
    # per repetition: the summed time the calls report as their own (`SpecStats.total_time`; an image pipeline's
    # token generation without its decoder)
    generation_times: list[float] = field(default_factory=list)
    identical: bool = True
    mismatches: int = 0

    @property
    def median_wall_time(self) -> float:
        return statistics.median(self.wall_times) if self.wall_times else 0.0

    @property
    def spread(self) -> float:
        """(max - min) / median of the wall times over repetitions (0 with one repetition)."""
        median = self.median_wall_time
        return (max(self.wall_times) - min(self.wall_times)) / median if len(self.wall_times) > 1 and median else 0.0

    @property
    def median_decode_time(self) -> float | None:
        """Median over repetitions of wall time minus prefill (None when the method reports no prefill)."""
        if not self.prefill_times or not any(self.prefill_times):
            return None
        return statistics.median(w - p for w, p in zip(self.wall_times, self.prefill_times))

    @property
    def median_generation_time(self) -> float:
        return statistics.median(self.generation_times) if self.generation_times else 0.0


class TableReport:
    """What every bench report shares: its JSON from `to_dict`, and a text table under its `title`."""

    title: str

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table_head(self, header: str) -> list[str]:
        """The table's first lines: the title, the column header and a rule under it."""
        return [self.title, header, "-" * len(header)]


@dataclass
class BenchReport(TableReport):
    title: str
    reference: str
    results: list[MethodResult]
    settings: dict[str, Any]

    def speed_up(self, result: MethodResult) -> float:
        base = next(r for r in self.results if r.name == self.reference).median_wall_time
        return base / result.median_wall_time if result.median_wall_time else 0.0

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r in self.results:
            row = {"method": r.name, **r.stats.to_dict()}
            row.update(
                wall_time_median_s=r.median_wall_time,
                wall_time_min_s=min(r.wall_times, default=0.0),
                wall_time_max_s=max(r.wall_times, default=0.0),
                wall_time_spread=r.spread,
                wall_times_s=r.wall_times,
                generation_time_median_s=r.median_generation_time,
                tokens_per_second=r.stats.new_tokens / r.median_wall_time if r.median_wall_time else 0.0,
                speed_up=self.speed_up(r),
                identical_to_reference=r.identical,
                mismatched_outputs=r.mismatches,
            )
            rows.append(row)
        return {"title": self.title, "reference": self.reference, "settings": self.settings, "methods": rows,
                "warnings": self.warnings()}

    def warnings(self) -> list[str]:
        """One line naming every method whose wall times spread too widely over repetitions to trust its speed-up."""
        wide = [r for r in self.results if r.spread > UNTRUSTED_SPREAD]
        if not wide:
            return []
        rows = ", ".join(f"{r.name} ({r.spread:.0%})" for r in wide)
        return [f"wall times spread by more than {UNTRUSTED_SPREAD:.0%} of the median over repetitions for {rows}: "
                "those speed-ups are not reliable; rerun on an idle machine or with more --repeats"]

    def to_table(self) -> str:
        header = (f"{'method':<26} {'tau':>5} {'alpha':>6} {'tgt fwd':>8} {'drf fwd':>8} {'wall s':>8} {'min-max s':>15} "
                  f"{'tok/s':>8} {'speed-up':>8}  identical")
        lines = self.table_head(header)
        for r in self.results:
            s = r.stats
            alpha = f"{s.alpha:.2f}" if s.drafted else "-"
            tps = s.new_tokens / r.median_wall_time if r.median_wall_time else 0.0
            lines.append(
                f"{r.name:<26} {s.tau:>5.2f} {alpha:>6} {s.target_forwards:>8} {s.drafter_forwards:>8} "
                f"{r.median_wall_time:>8.3f} {span(r.wall_times):>15} {tps:>8.1f} {self.speed_up(r):>7.2f}x  "
                f"{'yes' if r.identical else f'NO ({r.mismatches})'}"
            )
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        lines.append(f"({settings}; wall = median over repetitions of the total over all inputs, min-max beside it)")
        lines.extend(f"warning: {line}" for line in self.warnings())
        return "\n".join(lines)


def span(values: Sequence[float]) -> str:
    """'min-max' of wall times, for a table cell."""
    return f"{min(values):.3f}-{max(values):.3f}" if values else "-"


def run_benchmark(
    title: str,
    methods: dict[str, MethodFn],
    inputs: Sequence[Any],
    *,
    reference: str,
    repeats: int = 3,
    warmup: int = 1,
    settings: dict[str, Any] | None = None,
    progress: bool = True,
) -> BenchReport:
    """Run every method over every input, `repeats` times, interleaved input by input, after `warmup` passes."""
    if reference not in methods:
        raise ValueError(f"reference method {reference!r} is not among {list(methods)}")
    warm_inputs = list(inputs[: max(1, min(len(inputs), 2))])
    for _ in range(warmup):
        for fn in methods.values():
            for item in warm_inputs:
                fn(item)

    results = {name: MethodResult(name=name, stats=SpecStats(method=name)) for name in methods}
    outputs: dict[str, list[list[int]]] = {}
    bar = tqdm(total=repeats * len(methods) * len(inputs), desc=title, disable=not progress, leave=False)
    names = list(methods)
    for rep in range(repeats):
        totals = dict.fromkeys(names, 0.0)
        stats = {name: SpecStats(method=name) for name in names}
        produced: dict[str, list[list[int]]] = {name: [] for name in names}
        for index, item in enumerate(inputs):
            shift = (rep * len(inputs) + index) % len(names)  # no method always runs first (or after the same one)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                tokens, call_stats = methods[name](item)
                totals[name] += time.perf_counter() - start
                stats[name] = stats[name] + call_stats
                produced[name].append(tokens)
                bar.update(1)
        for name in names:
            results[name].wall_times.append(totals[name])
            results[name].prefill_times.append(stats[name].prefill_time)
            results[name].generation_times.append(stats[name].total_time)
            if rep == 0:
                results[name].stats = stats[name]
                results[name].stats.method = name
                outputs[name] = produced[name]
    bar.close()

    for name, result in results.items():
        result.mismatches = sum(a != b for a, b in zip(outputs[name], outputs[reference]))
        result.identical = result.mismatches == 0
    report = BenchReport(title=title, reference=reference, results=list(results.values()), settings=settings or {})
    note_report(report)  # into the results file when a bench command is recording (mmspec.bench.results)
    return report


class ForwardCounter:
    """Counts a module's forward calls through a forward hook (no patching).

    `attached=False` registers the hook only inside `counting()`: rows whose own stats count forwards (mmspec's)
    then run the module without a hook. A hook matters there: mmspec sends a hooked Llama drafter through
    transformers' forward instead of its lean one (a user's hook must be called), so a counter left attached
    would measure a slower path than users run.
    """

    def __init__(self, module: torch.nn.Module, attached: bool = True) -> None:
        self.count = 0
        self.module = module
        self._handle: Any = None
        if attached:
            self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *args: Any) -> None:
        self.count += 1

    def take(self) -> int:
        count, self.count = self.count, 0
        return count

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the forwards made inside the block (the hook is removed again after it, unless attached)."""
        if self._handle is not None:
            yield
            return
        self._handle = self.module.register_forward_hook(self._hook)
        try:
            yield
        finally:
            self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' per-call warnings (e.g. on assisted or Whisper generate) while a bench runs:
    the bench's output is its table."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
