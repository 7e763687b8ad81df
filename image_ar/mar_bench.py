"""`mmspec bench image` rows for a MAR model: the target MAR alone (ar) against CSpD at one or more draft windows.

Image i of every row uses the same class label and a CPU generator seeded with seed + i. Columns: forwards
of the target and of the draft MAR, drafted window tokens and the share accepted, wall time (median over
repetitions after a warm-up, rows interleaved: `mmspec.bench.harness`) and speed-up over ar. No quality
columns: no MAR judge exists in the zoo, and CSpD's output is sampled (not token-for-token comparable).
"""

from __future__ import annotations

from typing import Sequence

import torch

from mmspec.errors import MMSpecError

from .bench_report import REFERENCE, ImageReport, rows_grid, rows_without, run_pipeline_rows
from .mar_pipeline import MARPipeline



class MARBenchReport(ImageReport):
    def to_table(self) -> str:
        header = (f"{'method':<16} {'target fwd':>10} {'draft fwd':>9} {'drafted':>8} {'accepted':>8} {'wall s':>8} "
                  f"{'min-max s':>15} {'speed-up':>8}")
        lines = self.table_head(header)
        for r in self.rows:
            span = f"{r['wall_time_min_s']:.3f}-{r['wall_time_max_s']:.3f}"
            share = f"{r['accepted'] / r['drafted']:.3f}" if r["drafted"] else "-"
            lines.append(f"{r['method']:<16} {r['target_forwards']:>10} {r['drafter_forwards']:>9} {r['drafted']:>8} "
                         f"{share:>8} {r['wall_time_median_s']:>8.3f} {span:>15} {r['speed_up']:>7.2f}x")
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        lines.append(f"(cspd k=N: the draft runs N steps per target verification; accepted = share of drafted "
                     f"tokens kept; {settings}; wall = median over repetitions, all images)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def bench_mar(pipe: MARPipeline, labels: Sequence[int], *, seed: int = 0, num_drafts: Sequence[int] | None = None,
              guidance_scale: float | None = None, temperature: float = 1.0, repeats: int = 1, warmup: int = 1,
              grid_columns: int = 8, progress: bool = True, title: str = "bench image (MAR)") -> MARBenchReport:
    """Run ar and CSpD at each of `num_drafts` (default: the card's window) on every label."""
    if pipe.draft is None:
        raise MMSpecError(f"{pipe.model_name!r} has no draft MAR: the cspd rows need one")
    options = {"guidance_scale": guidance_scale, "temperature": temperature, "progress_bar": False}
    windows = list(num_drafts) if num_drafts else [pipe.settings_for("cspd", None, None, None, guidance_scale,
                                                                     temperature, 1.0)["num_draft"]]
    rows_spec = {REFERENCE: ("ar", None), **{f"cspd k={k}": ("cspd", k) for k in windows}}
    for method, k in rows_spec.values():  # bad settings fail before anything runs
        pipe.settings_for(method, None, k, None, guidance_scale, temperature, 1.0)
    settings = pipe.settings_for("cspd", None, windows[0], None, guidance_scale, temperature, 1.0)
    report, images, items = run_pipeline_rows(
        pipe, title, rows_spec, labels, knob="num_draft", tokens_of=lambda out: out.tokens.flatten().tolist(),
        seed=seed, options=options, repeats=repeats, warmup=warmup, progress=progress,
        settings={"tokens": pipe.model.seq_len, "num_iter": settings["num_iter"],
                  "prefill_ratio": settings["prefill_ratio"], "cfg": settings["cfg"], "temperature": temperature,
                  "seed": seed, "repeats": repeats, "threads": torch.get_num_threads(), "device": str(pipe.device)})
    # Sampled continuous tokens are not comparable token by token.
    rows = rows_without(report, rows_spec, "num_draft", ("identical_to_reference", "mismatched_outputs", "alpha", "tau",
                                                         "step_compression", "position_attempts", "position_accepts",
                                                         "per_position_acceptance"))
    notes = ["no quality columns: there is no MAR judge; cspd's output is the target's law only approximately "
             "(diffusion-head densities)"]
    grid = rows_grid(images, items, grid_columns)
    return MARBenchReport(title=title, rows=rows, settings=report.settings, notes=notes, grid=grid)
