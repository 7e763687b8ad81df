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

LANTERN rows also report how far the rule really moves the output from the target (`output_tv_*`,
column "TV out" = mean / max): delta bounds the total variation between p and each candidate's
boosted distribution, not between p and the law of the token the rule outputs. For every sampled
acceptance step of the row (up to `MAX_TV_STEPS`, evenly spaced over all its steps) the exact law
of the token that step commits at the first draft position is computed analytically from that
step's q and p (`rules.lantern_output_law`), and its total variation from p is averaged. It is
exact per step, not a Monte Carlo estimate; the average is over the steps the row met.

Seeds: image i of every method uses a CPU generator seeded with seed + i, whatever the model's
device (draws happen on the generator's device), so a seed gives the same draws on every machine.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from mmspec.bench.harness import run_benchmark
from mmspec.sampling import SamplingConfig, seeded_generator
from mmspec.stats import SpecStats

from .bench_report import REFERENCE, ImageReport
from .imaging import image_grid, to_pil
from .methods import MethodConfig
from .pipeline import SpeculativeImagePipeline
from .rules import LANTERN_DELTA, LANTERN_K, lantern_output_law, total_variation

MAX_TV_STEPS = 2048  # acceptance steps per LANTERN row whose exact output law is computed


class ImageBenchReport(ImageReport):
    def to_table(self) -> str:
        quality = any("class_accuracy" in r for r in self.rows)
        tv = any("output_tv_mean" in r for r in self.rows)
        width = max([30, *(len(r["method"]) for r in self.rows)])
        header = f"{'method':<{width}} {'steps x':>7} {'alpha':>6} {'tgt fwd':>8} {'drf fwd':>8} {'wall s':>8} {'speed-up':>8}"
        if quality:
            header += f" {'class acc':>9} {'FD vs AR':>9}"
        if tv:
            header += f" {'TV out':>11}"
        lines = [self.title, header, "-" * len(header)]
        for r in self.rows:
            alpha = f"{r['alpha']:.2f}" if r["drafted"] else "-"
            line = (f"{r['method']:<{width}} {r['step_compression']:>7.2f} {alpha:>6} {r['target_forwards']:>8} "
                    f"{r['drafter_forwards']:>8} {r['wall_time_median_s']:>8.3f} {r['speed_up']:>7.2f}x")
            if quality:
                acc, fd = r.get("class_accuracy"), r.get("fd_vs_ar")
                line += f" {'-' if acc is None else f'{acc:.2f}':>9} {'-' if fd is None else f'{fd:.2f}':>9}"
            if tv:
                mean, most = r.get("output_tv_mean"), r.get("output_tv_max")
                line += f" {'-' if mean is None else f'{mean:.3f}/{most:.2f}':>11}"
            lines.append(line)
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        lines.append(f"(steps x = image tokens / target forwards; {settings}; wall = median over repetitions, all images)")
        if tv:
            lines.append("(TV out = total variation between the target's p and the exact law of the token a LANTERN step "
                         "outputs, mean / max over the row's steps; delta bounds TV(p, each candidate's boosted p), "
                         "not this)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def default_methods(
    has_drafter: bool,
    *,
    window: int = 16,
    num_draft_tokens: int = 4,
    lantern_settings: Sequence[tuple[float, int]] = ((LANTERN_DELTA, LANTERN_K),),
    init: str = "left",
    gsd_defaults: dict[str, Any] | None = None,
    gsd_settings: Sequence[tuple[int, float | None, float | None]] = (),
) -> dict[str, MethodConfig]:
    """Row name -> method config: AR, SD (with a drafter), SJD, GSD, LANTERN (drafter and Jacobi drafts).

    The GSD row uses `gsd_defaults` (the pipeline's: the model card's calibrated group options, else
    the paper's); each of `gsd_settings` (group window, probability threshold, distance threshold;
    None = filter off; optionally a fourth entry, the latents: "embeddings" or "codebook") adds one
    more GSD row. `lantern_settings` are (delta, k) pairs (the pipeline's default: the model card's).
    """
    methods = {REFERENCE: MethodConfig(method="ar")}
    if has_drafter:
        methods[f"sd k={num_draft_tokens}"] = MethodConfig(method="sd", num_draft_tokens=num_draft_tokens)
    methods[f"sjd W={window}"] = MethodConfig(method="sjd", window=window, init=init)
    methods[f"gsd W={window}"] = MethodConfig(method="gsd", window=window, init=init, **(gsd_defaults or {}))
    for setting in gsd_settings:
        group, prob, distance = setting[:3]
        latents = setting[3] if len(setting) > 3 else "embeddings"
        suffix = "" if latents == "embeddings" else f" {latents}"
        methods[f"gsd W={window} g={group} p={prob} d={distance}{suffix}"] = MethodConfig(
            method="gsd", window=window, init=init, gsd_window=group, gsd_prob_threshold=prob,
            gsd_distance_threshold=distance, gsd_latents=latents)
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
    if methods is None:
        lantern = pipe.lantern_settings() if hasattr(pipe, "lantern_settings") else {}
        methods = default_methods(pipe.drafter is not None,
                                  lantern_settings=[(lantern.get("lantern_delta", LANTERN_DELTA),
                                                     lantern.get("lantern_k", LANTERN_K))],
                                  gsd_defaults=pipe.gsd_settings() if hasattr(pipe, "gsd_settings") else None)
    for config in methods.values():
        pipe.runner.check(config)  # one clear error (e.g. LANTERN's k vs the codebook) before minutes of runs
    if judge_dir is None and pipe.folder is not None:
        judge_dir = pipe.folder / "judge"
    scale = pipe.default_guidance_scale if guidance_scale is None else guidance_scale
    items = list(enumerate(labels))
    grids: dict[str, dict[int, torch.Tensor]] = {name: {} for name in methods}
    # LANTERN rows: per image, the (q, p) of each acceptance step (the last run of that image).
    steps: dict[str, dict[int, list[tuple[torch.Tensor, torch.Tensor]]]] = {
        name: {} for name, c in methods.items() if c.method == "lantern" and sampling.do_sample}

    def runner_for(name: str, config: MethodConfig):
        def run(item: tuple[int, int]) -> tuple[list[int], SpecStats]:
            index, label = item
            generator = seeded_generator("cpu", seed + index)  # a CPU generator: the same draws on every device
            observe = None
            if name in steps:
                seen = steps[name][index] = []

                def observe(q: torch.Tensor, p: torch.Tensor) -> None:
                    seen.append((q.detach().float().cpu(), p.detach().float().cpu()))

            out = pipe.runner.run(config, [label], sampling=sampling, generator=generator, guidance_scale=scale,
                                  observe=observe)
            grids[name][index] = out.tokens[0]
            return out.tokens.flatten().tolist(), out.stats

        return run

    with torch.inference_mode():
        report = run_benchmark(title, {name: runner_for(name, c) for name, c in methods.items()}, items, reference=REFERENCE,
                               repeats=repeats, warmup=warmup, progress=progress,
                               settings={"images": len(items), "seed": seed, "guidance_scale": scale,
                                         "temperature": sampling.temperature if sampling.do_sample else 0.0,
                                         "repeats": repeats, "threads": torch.get_num_threads(),
                                         "device": str(pipe.device)})
        images = {name: to_pil(pipe.vq.decode(torch.stack([by_index[i] for i, _ in items]))) for name, by_index in grids.items()}
        reference_images = []
        if judge_dir is not None and judge_dir.is_dir():
            # An independent AR run (other seeds) for the Fréchet distance; the AR row then shows the noise floor.
            for index, label in items:
                generator = seeded_generator("cpu", seed + len(items) + index)
                out = pipe.runner.run(MethodConfig(method="ar"), [label], sampling=sampling, generator=generator,
                                      guidance_scale=scale)
                reference_images += to_pil(pipe.vq.decode(out.tokens))
    quality, note = judge_quality(judge_dir, images, list(labels), reference_images)

    rows = []
    for row in report.to_dict()["methods"]:
        name = row["method"]
        row["method_family"] = methods[name].method
        row.update(quality.get(name, {}))
        if name in steps:
            row.update(output_tv(steps[name], pipe.runner.neighbours(methods[name].lantern_k), methods[name]))
        if sampling.do_sample:  # sampled outputs are not comparable token for token
            row.pop("identical_to_reference", None)
            row.pop("mismatched_outputs", None)
        rows.append(row)
    notes = [note] if note else []
    if pipe.drafter is None:
        notes.append("no drafter/ folder: sd and LANTERN-with-drafter rows skipped")
    grid = image_grid([(name, imgs[:grid_columns]) for name, imgs in images.items()])
    return ImageBenchReport(title=title, rows=rows, settings=report.settings, notes=notes, grid=grid)


def output_tv(per_image: dict[int, list[tuple[torch.Tensor, torch.Tensor]]], neighbours: torch.LongTensor,
              config: MethodConfig, max_steps: int = MAX_TV_STEPS, batch: int = 8) -> dict[str, Any]:
    """Mean / max total variation between p and the exact output law of a LANTERN row's acceptance steps.

    Steps are taken in image order; with more than `max_steps`, an evenly spaced subset.
    """
    pairs = [pair for index in sorted(per_image) for pair in per_image[index]]
    if not pairs:
        return {}
    q = torch.cat([a for a, _ in pairs])
    p = torch.cat([b for _, b in pairs])
    if q.shape[0] > max_steps:
        keep = torch.linspace(0, q.shape[0] - 1, max_steps, device=q.device).round().long()
        q, p = q[keep], p[keep]
    neighbours = neighbours.to(q.device)
    tvs = torch.cat([
        total_variation(lantern_output_law(q[i : i + batch], p[i : i + batch], neighbours, delta=config.lantern_delta,
                                           lam=config.lantern_lam), p[i : i + batch])
        for i in range(0, q.shape[0], batch)
    ])
    return {"lantern_delta": config.lantern_delta, "lantern_k": config.lantern_k, "output_tv_mean": float(tvs.mean()),
            "output_tv_max": float(tvs.max()), "output_tv_steps": int(tvs.numel()),
            "output_tv_method": "exact law per step (analytic), averaged over the row's acceptance steps"}
