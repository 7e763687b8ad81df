"""What the Caption and Transcribe tabs share: the model and method pickers, the round-by-round outputs and
the comparison with plain decoding. `prefix` is the tab's name in `models.TASKS` and its element-id prefix
(the browser tests find elements by these ids)."""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

from ..errors import MMSpecError
from . import rounds as R
from .display import comparison_markdown
from .models import sample_assets, zoo_models

Loader = Callable[[str], Any]  # zoo model name -> its (cached) pipeline


def add_samples(component: Any, pattern: str, label: str) -> None:
    """Offer the sample files matching `pattern` in the repository's assets (when running from a checkout)."""
    assets = sample_assets()
    samples = [[str(p)] for p in sorted(assets.glob(pattern))] if assets is not None else []
    if samples:
        gr.Examples(samples, inputs=[component], label=label)


def model_and_method(prefix: str, load: Loader) -> tuple[Any, Any]:
    """The dropdowns of the tab's zoo models and their methods; choosing another model offers its methods."""
    models = zoo_models(prefix)
    first = load(models[0]) if models else None
    model = gr.Dropdown(models, value=models[0] if models else None, label="model", elem_id=f"{prefix}-model")
    method = gr.Dropdown(first.available_methods if first else [], value=first.default_method if first else None,
                         label="method", elem_id=f"{prefix}-method")

    def methods_of(name: str) -> Any:
        try:
            pipe = load(name)
        except MMSpecError as error:
            raise gr.Error(str(error), duration=None) from None
        return gr.Dropdown(choices=pipe.available_methods, value=pipe.default_method)

    model.change(methods_of, inputs=[model], outputs=[method])
    return model, method


def compare_and_run(prefix: str, verb: str) -> tuple[Any, Any]:
    """The "compare with plain decoding" checkbox and the run button."""
    compare = gr.Checkbox(False, label="compare with plain decoding", elem_id=f"{prefix}-compare")
    run = gr.Button(verb, variant="primary", elem_id=f"{prefix}-run")
    return compare, run


def round_outputs(prefix: str, what: str, rounds_label: str) -> tuple[Any, Any, Any]:
    """The coloured round-by-round text, the final text and the statistics."""
    shown = gr.HighlightedText(label=f"{what}, {rounds_label}", color_map=R.COLORS, show_legend=True,
                               combine_adjacent=False, elem_id=f"{prefix}-rounds")
    text = gr.Textbox(label=what, interactive=False, elem_id=f"{prefix}-text")
    stats = gr.Markdown(elem_id=f"{prefix}-stats")
    return shown, text, stats


def rounds_table(prefix: str, label: str) -> Any:
    """One row per round: what was drafted, kept and rejected, and the target's token that replaced the rejected drafts."""
    return gr.Dataframe(headers=R.TABLE_HEADERS, label=label, interactive=False, wrap=True, elem_id=f"{prefix}-table",
                        column_widths=["7%", "7%", "6%", "8%", "22%", "20%", "15%", "15%"])


def comparison_with_plain(pipe: Any, call: dict[str, Any], progress: Any, fraction: float | None, media: str,
                          sampled: bool = False) -> str:
    """Plain decoding (`ar`) on the same input against the method, as markdown."""
    progress(fraction, desc=f"plain decoding (ar) on the same {media}")
    plain = pipe(**{**call, "method": "ar"})
    # Timed again now that both have run once (the streamed run may have paid one-time start-up costs).
    return comparison_markdown(pipe(**call), plain, sampled=sampled)
