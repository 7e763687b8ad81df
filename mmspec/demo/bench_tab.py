"""The Bench tab: the latest measured speed-ups per modality, read from the results file the benches write."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from ..bench.results import RESULTS_ENV, latest_results, results_path

MODALITIES = ("text", "vision", "speech", "image", "overhead")  # the `mmspec bench` modalities, one chart each
COLUMNS = ["modality", "method", "speed-up", "tau", "alpha", "identical to reference"]


def build() -> list:
    """The tab's parts; returns the outputs of `read`, which the app also runs when the page loads."""
    gr.Markdown("The latest speed-ups measured by `mmspec bench <modality>` on this machine (median wall time of "
                "the bench's reference over each method's, same process, same inputs). Run a bench, then refresh.")
    refresh = gr.Button("Refresh", elem_id="bench-refresh")
    notes = gr.Markdown(elem_id="bench-notes")
    charts = [gr.BarPlot(x="method", y="speed-up", label=f"{modality}: speed-up over the reference", sort=None,
                         x_label_angle=-25, visible=False, elem_id=f"bench-chart-{modality}") for modality in MODALITIES]
    table = gr.Dataframe(label="measured", interactive=False, elem_id="bench-table")
    outputs = [notes, table, *charts]
    refresh.click(read, outputs=outputs)
    return outputs


def _rounded(value: Any) -> float | None:
    """A measured number to two places; None (a blank cell) where the row has none (no drafts verified) or the
    results file holds something else there (a hand-edited or foreign file: the tab still shows the rest)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return round(float(value), 2)


def images_per_call(modality: str, record: dict[str, Any]) -> int:
    """How many sequences one counted target forward served. An image bench's batched call counts each forward
    once for all its images (text batches count a forward per row), so its tau is divided by this to be per image."""
    if modality != "image":
        return 1
    settings = record.get("settings")
    size = settings.get("batch_size", 1) if isinstance(settings, dict) else 1
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else 1


def per_row_tau(modality: str, record: dict[str, Any], tau: Any) -> float | None:
    """Tokens of one sequence per target forward, as `mmspec bench` prints tau; None where the row has none."""
    tau = _rounded(tau)
    return None if tau is None else _rounded(tau / images_per_call(modality, record))


def read() -> list[Any]:
    """A note per modality, the table of every method, and one chart per modality (hidden when it has no record)."""
    path = results_path()
    latest = latest_results(path)
    if not latest:
        where = f"`{path}`" if path else f"nowhere (`{RESULTS_ENV}` is empty)"
        message = (f"No bench results yet in {where}. Run e.g. `mmspec bench vision --num-videos 3` "
                   f"(results go to `${RESULTS_ENV}` if set, else the user cache).")
        return [message, pd.DataFrame(columns=COLUMNS), *(gr.BarPlot(visible=False) for _ in MODALITIES)]
    rows, lines = [], [f"Read from `{path}`."]
    for modality, record in sorted(latest.items()):
        lines.append(f"- **{modality}** ({record.get('time', '?')}): `{record.get('command', '')}`; "
                     f"reference `{record.get('reference', '?')}`")
        warnings = record.get("warnings") or []
        lines += [f"  - **warning**: {warning}" for warning in ([warnings] if isinstance(warnings, str) else warnings)]
        if images_per_call(modality, record) > 1:
            lines.append(f"  - tau per image: {images_per_call(modality, record)} images a call shared each target forward")
        for row in (row for row in record["methods"] if isinstance(row, dict)):
            rows.append({"modality": modality, "method": str(row.get("method")),
                         "speed-up": _rounded(row.get("speed_up")) or 0.0,
                         "tau": per_row_tau(modality, record, row.get("tau")), "alpha": _rounded(row.get("alpha")),
                         "identical to reference": bool(row.get("identical_to_reference"))})
    table = pd.DataFrame(rows, columns=COLUMNS)
    charts = []
    for modality in MODALITIES:
        mine = table[table["modality"] == modality]
        top = float(mine["speed-up"].max()) if not mine.empty else 1.0
        # From zero (a bar's length is its speed-up), in the bench's own row order.
        charts.append(gr.BarPlot(value=mine, visible=not mine.empty, y_lim=[0, max(top, 1.0) * 1.1],
                                 sort=list(mine["method"])))
    return ["\n".join(lines), table, *charts]
