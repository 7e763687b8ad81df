"""`mmspec bench image`: image-AR methods side by side on one model, in one process, with the same seeds.

Rows: AR sampling (the reference), speculative sampling with the drafter, SJD, GSD, and LANTERN at a
few (delta, k) settings, on the drafter's drafts and on Jacobi drafts. Image i of every method uses
the same class label and the same seed. Columns: target forwards, step compression (image tokens
per target forward), acceptance rate, wall time (median over repetitions, after a warm-up, methods
interleaved; `mmspec.bench.harness`), speed-up over AR, and quality from the model's judge when it
has one (`judge/` folder + `mmspec.image_ar.judge`):

- class accuracy: the judge's `class_accuracy(images, labels)`;
- FD vs AR: the judge's Fréchet distance between a method's images and an independent AR run
  (same labels, other seeds). The AR row shows the noise floor: two AR runs against each other.
"""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from mmspec.bench.harness import run_benchmark
from mmspec.sampling import SamplingConfig
from mmspec.stats import SpecStats

from .imaging import image_grid, to_pil
from .methods import MethodConfig
from .pipeline import SpeculativeImagePipeline

REFERENCE = "ar"
DEFAULT_LANTERN_SETTINGS = ((0.1, 16), (0.25, 16), (0.25, 64))  # (delta, k)


@dataclass
class ImageBenchReport:
    title: str
    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    grid: Image.Image | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": REFERENCE, "settings": self.settings, "methods": self.rows, "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_table(self) -> str:
        quality = any("class_accuracy" in r for r in self.rows)
        header = f"{'method':<30} {'steps x':>7} {'alpha':>6} {'tgt fwd':>8} {'drf fwd':>8} {'wall s':>8} {'speed-up':>8}"
        if quality:
            header += f" {'class acc':>9} {'FD vs AR':>9}"
        lines = [self.title, header, "-" * len(header)]
        for r in self.rows:
            alpha = f"{r['alpha']:.2f}" if r["drafted"] else "-"
            line = (f"{r['method']:<30} {r['step_compression']:>7.2f} {alpha:>6} {r['target_forwards']:>8} "
                    f"{r['drafter_forwards']:>8} {r['wall_time_median_s']:>8.3f} {r['speed_up']:>7.2f}x")
            if quality:
                acc, fd = r.get("class_accuracy"), r.get("fd_vs_ar")
                line += f" {'-' if acc is None else f'{acc:.2f}':>9} {'-' if fd is None else f'{fd:.2f}':>9}"
            lines.append(line)
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        lines.append(f"(steps x = image tokens / target forwards; {settings}; wall = median over repetitions, all images)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def default_methods(
    has_drafter: bool,
    *,
    window: int = 16,
    num_draft_tokens: int = 4,
    lantern_settings: Sequence[tuple[float, int]] = DEFAULT_LANTERN_SETTINGS,
    init: str = "left",
    gsd_defaults: dict[str, Any] | None = None,
    gsd_settings: Sequence[tuple[int, float | None, float | None]] = (),
) -> dict[str, MethodConfig]:
    """Row name -> method config: AR, SD (with a drafter), SJD, GSD, LANTERN (drafter and Jacobi drafts).

    The GSD row uses `gsd_defaults` (the pipeline's: the model card's calibrated group options, else
    the paper's); each of `gsd_settings` (group window, probability threshold, distance threshold;
    None = filter off) adds one more GSD row.
    """
    methods = {REFERENCE: MethodConfig(method="ar")}
    if has_drafter:
        methods[f"sd k={num_draft_tokens}"] = MethodConfig(method="sd", num_draft_tokens=num_draft_tokens)
    methods[f"sjd W={window}"] = MethodConfig(method="sjd", window=window, init=init)
    methods[f"gsd W={window}"] = MethodConfig(method="gsd", window=window, init=init, **(gsd_defaults or {}))
    for group, prob, distance in gsd_settings:
        methods[f"gsd W={window} g={group} p={prob} d={distance}"] = MethodConfig(
            method="gsd", window=window, init=init, gsd_window=group, gsd_prob_threshold=prob,
            gsd_distance_threshold=distance)
    for delta, k in lantern_settings:
        if has_drafter:
            methods[f"lantern d={delta} k={k} drafter"] = MethodConfig(
                method="lantern", drafts="drafter", lantern_delta=delta, lantern_k=k, num_draft_tokens=num_draft_tokens)
        methods[f"lantern d={delta} k={k} jacobi"] = MethodConfig(
            method="lantern", drafts="jacobi", lantern_delta=delta, lantern_k=k, window=window, init=init)
    return methods


def judge_quality(
    judge_dir: Path | None, images: dict[str, list[Image.Image]], labels: list[int], reference_images: list[Image.Image]
) -> tuple[dict[str, dict[str, float]], str | None]:
    """Per method {class_accuracy, fd_vs_ar} from the judge, or ({}, why not)."""
    if judge_dir is None or not judge_dir.is_dir():
        return {}, "the model has no judge/ folder: quality columns skipped"
    try:
        judge = importlib.import_module("mmspec.image_ar.judge")
    except ImportError as error:
        return {}, f"mmspec.image_ar.judge is not available ({error}): quality columns skipped"
    accuracy = getattr(judge, "class_accuracy", None)
    frechet = next((getattr(judge, n) for n in sorted(dir(judge)) if "frechet" in n.lower() and callable(getattr(judge, n))), None)
    results: dict[str, dict[str, float]] = {}
    try:
        for name, method_images in images.items():
            row = {}
            if accuracy is not None:
                row["class_accuracy"] = float(_with_judge(accuracy, judge_dir)(method_images, labels))
            if frechet is not None:
                row["fd_vs_ar"] = float(_with_judge(frechet, judge_dir)(method_images, reference_images))
            results[name] = row
    except (TypeError, ValueError, RuntimeError) as error:
        return {}, f"the judge failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}): quality columns skipped"
    return results, None


def _with_judge(fn: Callable, judge_dir: Path) -> Callable:
    """Pass the judge folder to judge functions that take it by one of the usual names."""
    for name in ("judge_dir", "judge_path", "judge"):
        if name in inspect.signature(fn).parameters:
            return lambda *args: fn(*args, **{name: str(judge_dir)})
    return fn


def bench_image(
    pipe: SpeculativeImagePipeline,
    labels: Sequence[int],
    *,
    seed: int = 0,
    methods: dict[str, MethodConfig] | None = None,
    sampling: SamplingConfig = SamplingConfig(do_sample=True),
    guidance_scale: float | None = None,
    repeats: int = 1,
    warmup: int = 1,
    grid_columns: int = 8,
    judge_dir: Path | None = None,
    progress: bool = True,
    title: str = "bench image",
) -> ImageBenchReport:
    """Run every method on every label (image i seeded with seed + i), then judge and grid the images."""
    methods = methods or default_methods(pipe.drafter is not None)
    if judge_dir is None and pipe.folder is not None:
        judge_dir = pipe.folder / "judge"
    scale = pipe.default_guidance_scale if guidance_scale is None else guidance_scale
    items = list(enumerate(labels))
    grids: dict[str, dict[int, torch.Tensor]] = {name: {} for name in methods}

    def runner_for(name: str, config: MethodConfig):
        def run(item: tuple[int, int]) -> tuple[list[int], SpecStats]:
            index, label = item
            generator = torch.Generator(device=pipe.model.device).manual_seed(seed + index)
            out = pipe.runner.run(config, [label], sampling=sampling, generator=generator, guidance_scale=scale)
            grids[name][index] = out.tokens[0]
            return out.tokens.flatten().tolist(), out.stats

        return run

    with torch.inference_mode():
        report = run_benchmark(title, {name: runner_for(name, c) for name, c in methods.items()}, items, reference=REFERENCE,
                               repeats=repeats, warmup=warmup, progress=progress,
                               settings={"images": len(items), "seed": seed, "guidance_scale": scale,
                                         "temperature": sampling.temperature if sampling.do_sample else 0.0,
                                         "repeats": repeats, "threads": torch.get_num_threads()})
        images = {name: to_pil(pipe.vq.decode(torch.stack([by_index[i] for i, _ in items]))) for name, by_index in grids.items()}
        reference_images = []
        if judge_dir is not None and judge_dir.is_dir():
            # An independent AR run (other seeds) for the Fréchet distance; the AR row then shows the noise floor.
            for index, label in items:
                generator = torch.Generator(device=pipe.model.device).manual_seed(seed + len(items) + index)
                out = pipe.runner.run(MethodConfig(method="ar"), [label], sampling=sampling, generator=generator,
                                      guidance_scale=scale)
                reference_images += to_pil(pipe.vq.decode(out.tokens))
    quality, note = judge_quality(judge_dir, images, list(labels), reference_images)

    rows = []
    for row in report.to_dict()["methods"]:
        name = row["method"]
        row["method_family"] = methods[name].method
        row.update(quality.get(name, {}))
        if sampling.do_sample:  # sampled outputs are not comparable token for token
            row.pop("identical_to_reference", None)
            row.pop("mismatched_outputs", None)
        rows.append(row)
    notes = [note] if note else []
    if pipe.drafter is None:
        notes.append("no drafter/ folder: sd and LANTERN-with-drafter rows skipped")
    grid = image_grid([(name, imgs[:grid_columns]) for name, imgs in images.items()])
    return ImageBenchReport(title=title, rows=rows, settings=report.settings, notes=notes, grid=grid)
