"""The Caption tab: a video captioned as it is decoded, each round's accepted drafts and target token coloured."""

from __future__ import annotations

from typing import Iterator

import gradio as gr

from ..errors import MMSpecError
from . import rounds as R
from .display import acceptance_frame, stats_markdown
from .fields import checked_seed
from .models import caption_pipeline
from .round_tab import (
    add_samples,
    compare_and_run,
    comparison_with_plain,
    model_and_method,
    round_outputs,
    rounds_table,
)
from .streaming import stream_rounds
from .uploads import LIMITS_NOTE, checked_upload, page_message


def build() -> None:
    gr.Markdown("Caption a video with a video-language model. Green: draft tokens the target accepted; grey: the "
                "drafts it rejected; red: the target's correction in their place; blue: the target's own token (after "
                f"all drafts were accepted). The table lists every round. {LIMITS_NOTE}")
    with gr.Row():
        with gr.Column():
            video = gr.Video(label="video", sources=["upload"], include_audio=True, elem_id="caption-video")
            add_samples(video, "shapes.mp4", "sample")
            model, method = model_and_method("caption", caption_pipeline)
            max_new_tokens = gr.Slider(4, 192, value=160, step=1, label="max new tokens", elem_id="caption-max-tokens")
            temperature = gr.Slider(0, 1.5, value=0, step=0.1, label="temperature (0: greedy)",
                                    elem_id="caption-temperature")
            seed = gr.Number(0, precision=0, label="seed (sampling)", elem_id="caption-seed")
            compare, run = compare_and_run("caption", "Caption")
        with gr.Column():
            shown, text, stats = round_outputs("caption", "caption", "round by round")
            chart = gr.BarPlot(x="draft position", y="acceptance", y_lim=[0, 1], label="acceptance per draft position",
                               elem_id="caption-acceptance")
            versus = gr.Markdown(elem_id="caption-compare-result")
    table = rounds_table("caption", "rounds")
    run.click(caption, inputs=[video, model, method, max_new_tokens, temperature, seed, compare],
              outputs=[shown, text, stats, chart, versus, table])


def caption(video: str | None, model: str, method: str, max_new_tokens: float, temperature: float, seed: float,
            compare: bool,
            progress: gr.Progress = gr.Progress()) -> Iterator[tuple]:
    path = None
    try:
        seed = checked_seed(seed)
        path = checked_upload(video, "video")
        pipe = caption_pipeline(model)
        tokenizer = pipe.processor.tokenizer

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)

        limit = int(max_new_tokens)
        progress(0.0, desc=f"{method}: reading the video")
        call = dict(video=path, method=method, max_new_tokens=limit, do_sample=temperature > 0,
                    temperature=temperature or 1.0, seed=seed, progress_bar=False)
        for done_rounds, out in stream_rounds(pipe, **call):
            views = R.round_views(done_rounds, decode)
            committed = done_rounds[-1].new_tokens if done_rounds else 0
            progress(min(committed / limit, 1.0), desc=f"{method}: {committed} tokens decoded")
            if out is None:
                yield R.highlighted(views), gr.skip(), gr.skip(), gr.skip(), gr.skip(), R.table_rows(views)
        versus = ""
        if compare:
            versus = comparison_with_plain(pipe, call, progress, 0.5, "video", sampled=temperature > 0)
        yield (R.highlighted(views), out.text, stats_markdown(out.stats, out.method), acceptance_frame(out.stats), versus,
               R.table_rows(views))
    except MMSpecError as error:
        raise gr.Error(page_message(error, path), duration=None) from None
