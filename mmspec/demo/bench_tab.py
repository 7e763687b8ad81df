"""The Bench tab: the latest measured speed-ups per modality, read from the results file the benches write."""

from __future__ import annotations

import pandas as pd
import gradio as gr

from ..bench.results import RESULTS_ENV, latest_results, results_path


def build() -> tuple:
    """The tab's parts; returns the outputs of `read`, which the app also runs when the page loads."""
    gr.Markdown("The latest speed-ups measured by `mmspec bench <modality>` on this machine (median wall time of "
                "each method over its bench's reference, same process, same inputs). Run a bench, then refresh.")
    refresh = gr.Button("Refresh", elem_id="bench-refresh")
    chart = gr.BarPlot(x="method", y="speed-up", color="modality", label="speed-up over the reference",
                       elem_id="bench-chart", sort=None)
    notes = gr.Markdown(elem_id="bench-notes")
    table = gr.Dataframe(label="measured", interactive=False, elem_id="bench-table")
    refresh.click(read, outputs=[chart, notes, table])
    return chart, notes, table


def read() -> tuple[pd.DataFrame, str, pd.DataFrame]:
    """The latest record per modality as chart data, a note per modality and a table."""
    path = results_path()
    latest = latest_results(path)
    if not latest:
        where = f"`{path}`" if path else f"nowhere (`{RESULTS_ENV}` is empty)"
        message = (f"No bench results yet in {where}. Run e.g. `mmspec bench vision --num-videos 3` "
                   f"(results go to `${RESULTS_ENV}` if set, else the user cache).")
        return _frame([]), message, _frame([])
    rows, lines = [], [f"Read from `{path}`."]
    for modality, record in sorted(latest.items()):
        lines.append(f"- **{modality}** ({record.get('time', '?')}): `{record.get('command', '')}`; "
                     f"reference `{record.get('reference', '?')}`")
        for row in record["methods"]:
            rows.append({"modality": modality, "method": f"{modality}: {row.get('method')}",
                         "speed-up": round(float(row.get("speed_up") or 0.0), 2),
                         "tau": round(float(row.get("tau") or 0.0), 2), "alpha": round(float(row.get("alpha") or 0.0), 2),
                         "identical to reference": bool(row.get("identical_to_reference"))})
    frame = _frame(rows)
    return frame, "\n".join(lines), frame


def _frame(rows: list[dict]) -> pd.DataFrame:
    columns = ["modality", "method", "speed-up", "tau", "alpha", "identical to reference"]
    return pd.DataFrame(rows, columns=columns)
