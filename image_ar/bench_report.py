"""What the image benches share: the report (rows against the `ar` reference, settings, notes, a grid
of the images; each bench module adds its table) and the side-by-side run of a pipeline's rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from PIL import Image

from mmspec.bench.harness import TableReport, run_benchmark
from mmspec.sampling import seeded_generator
from mmspec.stats import SpecStats

from .imaging import image_grid

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
                      knob: str, tokens_of: Callable[[Any], list], seed: int, options: dict[str, Any],
                      settings: dict[str, Any], repeats: int, warmup: int, progress: bool, batch_size: int = 1):
    """Time a pipeline's rows side by side: row name -> (method, value of the pipeline argument `knob`).

    Images go `batch_size` to a call; the call whose first image is i draws with a CPU generator seeded
    `seed + i` (the same draws on any device; at batch 1, image i's own seed). Returns the harness
    report, the images made ({row: {i: image}}) and the (i, label) items, one per image.
    """
    images: dict[str, dict[int, Image.Image]] = {name: {} for name in rows_spec}

    def runner_for(name: str, method: str, value: Any):
        def run(batch: tuple[int, list[int]]) -> tuple[list, SpecStats]:
            first, batch_labels = batch
            out = pipe(class_labels=batch_labels, method=method, **{knob: value},
                       generator=seeded_generator("cpu", seed + first), **options)
            for j, image in enumerate(out.images):
                images[name][first + j] = image
            return tokens_of(out), out.stats

        return run

    items = list(enumerate(labels))
    batches = [(i, list(labels[i : i + batch_size])) for i in range(0, len(labels), batch_size)]
    report = run_benchmark(title, {name: runner_for(name, *spec) for name, spec in rows_spec.items()}, batches,
                           reference=REFERENCE, repeats=repeats, warmup=warmup, progress=progress,
                           settings={"images": len(items), **({"batch_size": batch_size} if batch_size > 1 else {}),
                                     **settings})
    return report, images, items


def rows_without(report: Any, rows_spec: dict[str, tuple[str, Any]], knob: str, dropped: Sequence[str],
                 extra: Callable[[str], dict[str, Any]] = lambda name: {}) -> list[dict[str, Any]]:
    """The report's rows with the method family and knob value added and the `dropped` columns removed
    (sampled images are not comparable token by token)."""
    rows = []
    for row in report.to_dict()["methods"]:
        method, value = rows_spec[row["method"]]
        row.update(method_family=method, **{knob: value}, **extra(row["method"]))
        for key in dropped:
            row.pop(key, None)
        rows.append(row)
    return rows


def rows_grid(images: dict[str, dict[int, Image.Image]], items: list[tuple[int, int]], columns: int) -> Image.Image:
    """One grid line per row, its first `columns` images in item order."""
    return image_grid([(name, [by[i] for i, _ in items][:columns]) for name, by in images.items()])
