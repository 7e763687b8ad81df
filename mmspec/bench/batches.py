"""Batched decoding side by side: plain batched `generate` vs mmspec's batch loop, per batch size.

Prompts are cut into batches of each size (left-padded); every method runs every batch. Speculation
pays while a verify forward over B rows x (k + 1) positions costs much less than k + 1 plain forwards
over B rows; on a CPU the verify's cost grows with B (k + 1) tokens, so the gain shrinks as B grows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ..decoding import SpeculativeDecoder, eos_ids
from ..drafters import PromptLookupDrafter
from ..policies import FixedDraftLength
from ..stats import SpecStats
from .harness import BenchReport, ForwardCounter, MethodFn, TableReport, run_benchmark

# left-padded ids [B, P], attention mask [B, P], and optionally the batch's other model inputs (pixels, ...)
Batch = tuple[torch.LongTensor, torch.LongTensor] | tuple[torch.LongTensor, torch.LongTensor, dict[str, Any]]


def batch_parts(batch: Batch) -> tuple[torch.LongTensor, torch.LongTensor, dict[str, Any]]:
    """ids, attention mask and the other model inputs of a batch."""
    return batch[0], batch[1], (batch[2] if len(batch) > 2 else {})  # type: ignore[misc]


def left_padded_batches(prompts: list[list[int]], size: int, pad_token_id: int) -> list[Batch]:
    batches = []
    for start in range(0, len(prompts), size):
        rows = prompts[start:start + size]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad_token_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        batches.append((ids, mask))
    return batches


def new_token_count(rows: torch.Tensor, stops: set[int]) -> int:
    """Tokens `generate` produced per row [B, N] (up to and with the first stop; the rest is padding)."""
    total = 0
    for row in rows.tolist():
        ends = [i for i, token in enumerate(row) if token in stops]
        total += ends[0] + 1 if ends else len(row)
    return total


def plain_batched(target: PreTrainedModel, max_new_tokens: int, counter: ForwardCounter) -> MethodFn:
    stops = eos_ids(target, None)

    def run(batch: Batch) -> tuple[list[int], SpecStats]:
        ids, mask, inputs = batch_parts(batch)
        counter.take()
        start = time.perf_counter()
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, **inputs)
        stats = SpecStats(method="plain-batched", total_time=time.perf_counter() - start)
        stats.new_tokens = new_token_count(out[:, ids.shape[1]:], stops)
        stats.target_forwards = counter.take() * ids.shape[0]  # per row, as mmspec's batch stats count them
        return out[:, ids.shape[1]:].flatten().tolist(), stats

    return run


def mmspec_batched(decoder: SpeculativeDecoder, max_new_tokens: int) -> MethodFn:
    def run(batch: Batch) -> tuple[list[int], SpecStats]:
        ids, mask, inputs = batch_parts(batch)
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, **inputs)
        return out.sequences[:, ids.shape[1]:].flatten().tolist(), out.stats

    return run


@dataclass
class BatchSizeReport(TableReport):
    """One `BenchReport` per batch size, and a summary of tokens/s against plain batched decoding."""

    title: str
    reports: dict[int, BenchReport]

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "batch_sizes": {str(size): report.to_dict() for size, report in self.reports.items()}}

    def to_table(self) -> str:
        methods = [r.name for r in next(iter(self.reports.values())).results]
        header = f"{'batch':>5}" + "".join(f"  {name + ' tok/s':>{len(name) + 6}} {'x':>5}" for name in methods) + "  identical"
        lines = self.table_head(header)
        for size, report in self.reports.items():
            cells = ""
            for r in report.results:
                tps = r.stats.new_tokens / r.median_wall_time if r.median_wall_time else 0.0
                cells += f"  {tps:>{len(r.name) + 6}.1f} {report.speed_up(r):>4.2f}x"
            same = all(r.identical for r in report.results)
            lines.append(f"{size:>5}{cells}  {'yes' if same else 'NO'}")
        lines.append("(tok/s over all prompts, median over repetitions; x = against plain batched generate at the same batch size)")
        for size, report in self.reports.items():
            lines.extend(["", f"batch size {size}:", report.to_table()])
        return "\n".join(lines)


def bench_text_batches(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    prompts: list[list[int]],
    batch_sizes: tuple[int, ...],
    *,
    pad_token_id: int,
    max_new_tokens: int = 48,
    num_draft_tokens: int = 5,
    repeats: int = 3,
    title: str = "bench text (batches)",
    progress: bool = True,
) -> BatchSizeReport:
    counter = ForwardCounter(target)
    methods: dict[str, MethodFn] = {
        "plain-batched": plain_batched(target, max_new_tokens, counter),
        "mmspec-batched": mmspec_batched(
            SpeculativeDecoder(target, drafter, policy=FixedDraftLength(num_draft_tokens), method="mmspec-batched"), max_new_tokens),
        "mmspec-prompt-lookup": mmspec_batched(
            SpeculativeDecoder(target, PromptLookupDrafter(), policy=FixedDraftLength(num_draft_tokens),
                               method="mmspec-prompt-lookup"), max_new_tokens),
    }
    try:
        return run_batch_sizes(
            title, methods, lambda size: left_padded_batches(prompts, size, pad_token_id), batch_sizes, repeats=repeats,
            progress=progress, settings={"prompts": len(prompts), "max_new_tokens": max_new_tokens, "k": num_draft_tokens})
    finally:
        counter.close()


def run_batch_sizes(
    title: str,
    methods: dict[str, MethodFn],
    batches_of: Callable[[int], Sequence[Any]],
    batch_sizes: Sequence[int],
    *,
    reference: str = "plain-batched",
    repeats: int = 3,
    progress: bool = True,
    settings: dict[str, Any] | None = None,
) -> BatchSizeReport:
    """Every method over `batches_of(size)` for each batch size (`run_benchmark`, `reference` the plain batched
    `generate`), gathered in one `BatchSizeReport`; `settings` are shown with each size's table."""
    reports = {}
    with torch.inference_mode():
        for size in batch_sizes:
            reports[size] = run_benchmark(
                f"{title}, batch size {size}", methods, batches_of(size), reference=reference, repeats=repeats,
                progress=progress, settings={**(settings or {}), "batch_size": size, "repeats": repeats,
                                             "threads": torch.get_num_threads()})
    return BatchSizeReport(title=title, reports=reports)
