"""The Transcribe tab: hybrid decoding made visible: what the big decoder kept of the fast decoder's draft, and where it corrected."""

from __future__ import annotations

from typing import Any, Iterator

import gradio as gr

from ..errors import MMSpecError
from . import rounds as R
from .display import comparison_markdown, stats_markdown
from .models import sample_assets, transcription_pipeline, zoo_models
from .streaming import stream_rounds
from .uploads import LIMITS_NOTE, check_audio_length, checked_upload, page_message


def build() -> None:
    models = zoo_models("transcribe")
    first = transcription_pipeline(models[0]) if models else None
    gr.Markdown("Transcribe speech. In `hybrid` decoding a light fast decoder drafts the whole transcript in one pass "
                "and the big decoder verifies it: green is what it kept of the draft, red its corrections, blue its own "
                f"tokens after a draft was used up. The table lists every decoder pass. {LIMITS_NOTE}")
    with gr.Row():
        with gr.Column():
            audio = gr.Audio(label="audio", sources=["upload", "microphone"], type="filepath", elem_id="transcribe-audio")
            assets = sample_assets()
            samples = [[str(p)] for p in sorted(assets.glob("speech-*.flac"))] if assets is not None else []
            if samples:
                gr.Examples(samples, inputs=[audio], label="samples")
            model = gr.Dropdown(models, value=models[0] if models else None, label="model", elem_id="transcribe-model")
            method = gr.Dropdown(first.available_methods if first else [], value=first.default_method if first else None,
                                 label="method", elem_id="transcribe-method")
            compare = gr.Checkbox(False, label="compare with plain decoding", elem_id="transcribe-compare")
            run = gr.Button("Transcribe", variant="primary", elem_id="transcribe-run")
        with gr.Column():
            shown = gr.HighlightedText(label="transcript, pass by pass", color_map=R.COLORS, show_legend=True,
                                       combine_adjacent=False, elem_id="transcribe-rounds")
            text = gr.Textbox(label="transcript", interactive=False, elem_id="transcribe-text")
            stats = gr.Markdown(elem_id="transcribe-stats")
            table = gr.Dataframe(headers=R.TABLE_HEADERS, label="decoder passes", interactive=False, wrap=True,
                                 elem_id="transcribe-table")
            versus = gr.Markdown(elem_id="transcribe-compare-result")
    model.change(_methods_of, inputs=[model], outputs=[method])
    run.click(transcribe, inputs=[audio, model, method, compare], outputs=[shown, text, stats, table, versus])


def _methods_of(name: str) -> Any:
    try:
        pipe = transcription_pipeline(name)
    except MMSpecError as error:
        raise gr.Error(str(error)) from None
    return gr.Dropdown(choices=pipe.available_methods, value=pipe.default_method)


def transcribe(audio: str | None, model: str, method: str, compare: bool,
               progress: gr.Progress = gr.Progress()) -> Iterator[tuple]:
    path = None
    try:
        path = checked_upload(audio, "audio")
        check_audio_length(path)
        pipe = transcription_pipeline(model)

        def decode(ids: list[int]) -> str:
            return pipe.tokenizer.decode(ids, skip_special_tokens=True)

        progress(0.0, desc=f"{method}: reading the audio")
        call = dict(audio=path, method=method, progress_bar=False)
        for done_rounds, out in stream_rounds(pipe, **call):
            views = R.round_views(done_rounds, decode)
            progress(None, desc=f"{method}: {len(done_rounds)} decoder passes")
            if out is None:
                yield R.highlighted(views), gr.skip(), gr.skip(), R.table_rows(views), gr.skip()
        versus = ""
        if compare:
            progress(None, desc="plain decoding (ar) on the same audio")
            plain = pipe(**{**call, "method": "ar"})
            # Timed again now that both have run once (the streamed run may have paid one-time start-up costs).
            versus = comparison_markdown(pipe(**call), plain)
        summary = stats_markdown(out.stats, out.method if out.method == "ar" else f"{out.method} ({out.mode})")
        if out.note:
            summary += f"\n\n{out.note}"
        yield R.highlighted(views), out.text, summary, R.table_rows(views), versus
    except MMSpecError as error:
        raise gr.Error(page_message(error, path)) from None
