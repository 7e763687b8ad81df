"""The Transcribe tab: hybrid decoding made visible: what the big decoder kept of the fast decoder's draft, and where it corrected."""

from __future__ import annotations

from typing import Iterator

import gradio as gr

from ..errors import MMSpecError
from . import rounds as R
from .display import stats_markdown
from .models import transcription_pipeline
from .round_tab import (
    add_samples,
    compare_and_run,
    comparison_with_plain,
    model_and_method,
    round_outputs,
    rounds_table,
)
from .streaming import stream_rounds
from .uploads import LIMITS_NOTE, check_audio_length, checked_upload, page_message


def build() -> None:
    gr.Markdown("Transcribe speech. In `hybrid` decoding a fast decoder drafts the transcript (whisper-tiny.en's is its "
                "own decoder over its 8192 most used tokens, 10 tokens a pass) and the model verifies the draft in one "
                "pass: green is what it kept of the draft, grey the draft it rejected, red "
                "its correction in place of that, blue its own tokens after a draft was used up. The table lists every "
                f"decoder pass: the fast decoder's draft, the kept part, the rejected part and the correction. {LIMITS_NOTE}")
    with gr.Row():
        with gr.Column():
            audio = gr.Audio(label="audio", sources=["upload", "microphone"], type="filepath", elem_id="transcribe-audio")
            add_samples(audio, "speech-*.flac", "samples")
            model, method = model_and_method("transcribe", transcription_pipeline)
            compare, run = compare_and_run("transcribe", "Transcribe")
        with gr.Column():
            shown, text, stats = round_outputs("transcribe", "transcript", "pass by pass")
            versus = gr.Markdown(elem_id="transcribe-compare-result")
    table = rounds_table("transcribe", "decoder passes")
    run.click(transcribe, inputs=[audio, model, method, compare], outputs=[shown, text, stats, table, versus])


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
            versus = comparison_with_plain(pipe, call, progress, None, "audio")
        summary = stats_markdown(out.stats, out.method if out.method == "ar" else f"{out.method} ({out.mode})")
        if out.note:
            summary += f"\n\n{out.note}"
        yield R.highlighted(views), out.text, summary, R.table_rows(views), versus
    except MMSpecError as error:
        raise gr.Error(page_message(error, path), duration=None) from None
