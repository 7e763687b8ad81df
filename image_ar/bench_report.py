"""What the image benches share: the report (rows against the `ar` reference, settings, notes, a grid
of the images; each bench module adds its table) and the side-by-side run of a pipeline's rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from PIL import Image

from mmspec.bench.harness import TableReport, run_benchmark
from mmspec.sampling import seeded_generator
from mmspec.stats import SpecStats

from .imaging import image_grid
from .judge import get_judge

REFERENCE = "ar"


@dataclass
class ImageReport(TableReport):
    title: str
    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    grid: Image.Image | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": REFERENCE, "settings": self.settings, "methods": self.rows,
                "notes": self.notes}


def run_pipeline_rows(pipe: Any, title: str, rows_spec: dict[str, tuple[str, Any]], labels: Sequence[int], *,
                      knob: str | None, seed: int, options: dict[str, Any],
                      settings: dict[str, Any], repeats: int, warmup: int, progress: bool, batch_size: int = 1):
    """Time a pipeline's rows side by side: row name -> (method, value of the pipeline argument `knob`;
    with knob None, a dict of pipeline arguments).

    Images go `batch_size` to a call; the call whose first image is i draws with a CPU generator seeded
    `seed + i` (the same draws on any device; at batch 1, image i's own seed). Returns the harness
    report, the images made ({row: {i: image}}) and the (i, label) items, one per image.
    """
    images: dict[str, dict[int, Image.Image]] = {name: {} for name in rows_spec}

    def runner_for(name: str, method: str, value: Any):
        def run(batch: tuple[int, list[int]]) -> tuple[list, SpecStats]:
            first, batch_labels = batch
            out = pipe(class_labels=batch_labels, method=method, **row_arguments(knob, value),
                       generator=seeded_generator("cpu", seed + first), **options)
            for j, image in enumerate(out.images):
                images[name][first + j] = image
            return out.tokens.flatten().tolist(), out.stats  # every image pipeline's output has tokens

        return run

    items = list(enumerate(labels))
    batches = [(i, list(labels[i : i + batch_size])) for i in range(0, len(labels), batch_size)]
    report = run_benchmark(title, {name: runner_for(name, *spec) for name, spec in rows_spec.items()}, batches,
                           reference=REFERENCE, repeats=repeats, warmup=warmup, progress=progress,
                           settings={"images": len(items), **({"batch_size": batch_size} if batch_size > 1 else {}),
                                     **settings})
    return report, images, items


def rows_without(report: Any, rows_spec: dict[str, tuple[str, Any]], knob: str | None, dropped: Sequence[str],
                 extra: Callable[[str], dict[str, Any]] = lambda name: {}) -> list[dict[str, Any]]:
    """The report's rows with the method family and knob value added and the `dropped` columns removed
    (sampled images are not comparable token by token)."""
    rows = []
    for row in report.to_dict()["methods"]:
        method, value = rows_spec[row["method"]]
        row.update(method_family=method, **row_arguments(knob, value), **extra(row["method"]))
        for key in dropped:
            row.pop(key, None)
        rows.append(row)
    return rows


def add_generation_speed_up(rows: list[dict[str, Any]]) -> None:
    """Each row's `generation_speed_up`: ar's token-generation time over the row's (the pipeline call
    without its image decoder, which every row runs alike)."""
    base = next(r for r in rows if r["method"] == REFERENCE)["generation_time_median_s"]
    for r in rows:
        r["generation_speed_up"] = base / r["generation_time_median_s"] if r["generation_time_median_s"] else 0.0


def row_arguments(knob: str | None, value: Any) -> dict[str, Any]:
    return dict(value or {}) if knob is None else {knob: value}


def judge_rows(pipe: Any, judge: Any, images: dict[str, dict[int, Image.Image]], items: list[tuple[int, int]], *,
               seed: int, options: dict[str, Any], batch_size: int = 1) -> tuple[dict[str, dict[str, float]], str]:
    """Per row {class_accuracy, fd_vs_ar} by the judge, and a note on ar's own spread.

    FD is measured against an independent `ar` run (image i drawn with seed + len(items) + i, batched as
    the rows), so the ar row shows the noise floor; the note gives ar's accuracy on that run and the 95%
    interval of its own."""
    judged = get_judge(judge)
    labels = [label for _, label in items]
    reference: list[Image.Image] = []
    for first in range(0, len(items), batch_size):
        out = pipe(class_labels=labels[first : first + batch_size], method=REFERENCE,
                   generator=seeded_generator("cpu", seed + len(items) + first), **options)
        reference += list(out.images)
    quality = {}
    for name, by_item in images.items():
        made = [by_item[i] for i, _ in items]
        quality[name] = {"class_accuracy": judged.class_accuracy(made, labels),
                         "fd_vs_ar": judged.frechet_distance(made, reference)}
    note = ar_spread_note(quality[REFERENCE]["class_accuracy"], judged.class_accuracy(reference, labels), len(items))
    return quality, note


def wilson_interval(accuracy: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion measured on n trials."""
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def ar_spread_note(accuracy: float, other_seeds_accuracy: float, n: int) -> str:
    """How far the reference's own class accuracy moves: a second run on other seeds, and its 95% interval."""
    low, high = wilson_interval(accuracy, n)
    return (f"ar's own spread: class accuracy {other_seeds_accuracy:.3f} on the FD reference run (other seeds); "
            f"95% interval of ar's {accuracy:.3f} on {n} images: {low:.3f}-{high:.3f} (Wilson)")


def quality_columns(rows: list[dict[str, Any]]) -> tuple[str, Callable[[dict[str, Any]], str]]:
    """The judge's two columns (header, cell maker), or nothing when no row was judged."""
    if not any("class_accuracy" in r for r in rows):
        return "", lambda r: ""
    return (f" {'class acc':>9} {'FD vs AR':>9}",
            lambda r: f" {r.get('class_accuracy', float('nan')):>9.3f} {r.get('fd_vs_ar', float('nan')):>9.2f}")


def rows_grid(images: dict[str, dict[int, Image.Image]], items: list[tuple[int, int]], columns: int) -> Image.Image:
    """One grid line per row, its first `columns` images in item order."""
    return image_grid([(name, [by[i] for i, _ in items][:columns]) for name, by in images.items()])
