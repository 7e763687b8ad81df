"""`mmspec bench image` rows for a MAR model: the target MAR alone (ar) against CSpD at one or more draft windows.

Image i of every row uses the same class label and a CPU generator seeded with seed + i (a batch of
`batch_size` images, the seed of its first). Rows: `ar` (the card's steps of the cosine schedule), `cspd
k=N` for each window, and for each window a control `ar T steps`: the target alone on the cosine schedule
with as many steps as CSpD's target forwards (CSpD's output follows the target on a schedule where each
verified window is one step, so the control says what the drafting adds over simply taking fewer
steps). Columns: forwards of the target and of the draft MAR, drafted window tokens and the share
accepted, wall time (median over repetitions after a warm-up, rows interleaved: `mmspec.bench.harness`),
speed-up over ar, the same for token generation alone (`gen s`, `gen x`: without the VAE's decoding),
and, with a judge (the card's, else none): class accuracy and the Fréchet distance to an
independent ar run, with ar's own spread.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from mmspec.errors import MMSpecError

from .bench_report import (
    REFERENCE,
    ImageReport,
    add_generation_speed_up,
    judge_rows,
    quality_columns,
    rows_grid,
    rows_without,
    run_pipeline_rows,
)
from .cspd import cspd_schedule
from .mar_pipeline import MARPipeline


class MARBenchReport(ImageReport):
    def to_table(self) -> str:
        quality_header, quality_cells = quality_columns(self.rows)
        header = (f"{'method':<16} {'target fwd':>10} {'draft fwd':>9} {'drafted':>8} {'accepted':>8} {'wall s':>8} "
                  f"{'min-max s':>15} {'speed-up':>8} {'gen s':>7} {'gen x':>6}") + quality_header
        lines = self.table_head(header)
        for r in self.rows:
            span = f"{r['wall_time_min_s']:.3f}-{r['wall_time_max_s']:.3f}"
            share = f"{r['accepted'] / r['drafted']:.3f}" if r["drafted"] else "-"
            lines.append(f"{r['method']:<16} {r['target_forwards']:>10} {r['drafter_forwards']:>9} {r['drafted']:>8} "
                         f"{share:>8} {r['wall_time_median_s']:>8.3f} {span:>15} {r['speed_up']:>7.2f}x "
                         f"{r['generation_time_median_s']:>7.3f} {r['generation_speed_up']:>5.2f}x" + quality_cells(r))
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        lines.append(f"(cspd k=N: the draft runs N steps per target verification; accepted = share of drafted "
                     f"tokens kept; ar T steps: the target alone with as many steps as cspd's target forwards; "
                     f"{settings}; wall = median over repetitions, all images, the VAE's decoding included; gen = the same "
                     "for token generation alone)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def bench_mar(pipe: MARPipeline, labels: Sequence[int], *, seed: int = 0, num_drafts: Sequence[int] | None = None,
              guidance_scale: float | None = None, temperature: float = 1.0, inner_temperature: float = 1.0,
              repeats: int = 1, warmup: int = 1, batch_size: int = 1, judge: Any = None, controls: bool = True,
              grid_columns: int = 8, progress: bool = True, title: str = "bench image (MAR)") -> MARBenchReport:
    """Run ar, CSpD at each of `num_drafts` (default: the card's window) and, with `controls`, the fewer-steps
    ar rows on every label, `batch_size` images a call; then judge them when a `judge` is given."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MMSpecError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if pipe.draft is None:
        raise MMSpecError(f"{pipe.model_name!r} has no draft MAR: the cspd rows need one")
    options = {"guidance_scale": guidance_scale, "temperature": temperature, "progress_bar": False}
    windows = list(num_drafts) if num_drafts else [pipe.settings_for("cspd", None, None, None, guidance_scale,
                                                                     temperature, 1.0)["num_draft"]]
    settings = {k: pipe.settings_for("cspd", None, k, None, guidance_scale, temperature, inner_temperature)
                for k in windows}  # bad settings fail before anything runs
    rows_spec: dict[str, tuple[str, dict[str, Any]]] = {REFERENCE: ("ar", {})}
    for k in windows:
        rows_spec[f"cspd k={k}"] = ("cspd", {"num_draft": k, "inner_temperature": inner_temperature})
    if controls:
        for k, s in settings.items():
            steps = len(cspd_schedule(s["num_iter"], pipe.model.seq_len, k, s["prefill_ratio"]))
            rows_spec.setdefault(f"ar {steps} steps", ("ar", {"num_iter": steps}))
    first = settings[windows[0]]
    report, images, items = run_pipeline_rows(
        pipe, title, rows_spec, labels, knob=None,
        seed=seed, options=options, repeats=repeats, warmup=warmup, progress=progress, batch_size=batch_size,
        settings={"tokens": pipe.model.seq_len, "num_iter": first["num_iter"], "prefill_ratio": first["prefill_ratio"],
                  "cfg": first["cfg"], "temperature": temperature, "inner_temperature": inner_temperature,
                  "head_steps": pipe.model.config.num_sampling_steps, "seed": seed, "repeats": repeats,
                  "threads": torch.get_num_threads(), "device": str(pipe.device)})
    notes = []
    quality: dict[str, dict[str, float]] = {}
    if judge is None:
        notes.append("no judge given (the model card names none): quality columns skipped")
    else:
        quality, spread = judge_rows(pipe, judge, images, items, seed=seed, options=options, batch_size=batch_size)
        notes.append(spread)
    if inner_temperature == 1.0:
        notes.append("cspd accepts by the paper's ratio of the heads' last-step Gaussians (densities of a diffusion "
                     "head are approximate: close to, not provably, the target's law)")
    else:
        notes.append(f"inner_temperature {inner_temperature}: the acceptance ratio is tempered, so cspd's output is "
                     "NOT the target's distribution")
    # Sampled continuous tokens are not comparable token by token.
    rows = rows_without(report, rows_spec, None, ("identical_to_reference", "mismatched_outputs", "alpha", "tau",
                                                  "step_compression", "position_attempts", "position_accepts",
                                                  "per_position_acceptance"),
                        extra=lambda name: quality.get(name, {}))
    add_generation_speed_up(rows)
    grid = rows_grid(images, items, grid_columns)
    return MARBenchReport(title=title, rows=rows, settings=report.settings, notes=notes, grid=grid)
