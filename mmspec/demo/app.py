"""The demo app: one Gradio Blocks page with a tab per modality and one for the bench results."""

from __future__ import annotations

import gradio as gr

from . import bench_tab, caption_tab, image_tab, transcribe_tab
from .models import sample_assets
from .uploads import MAX_UPLOAD_MB

TITLE = "mmspec: speculative decoding, seen at work"


def build_app() -> gr.Blocks:
    """The page. Models load once, when the page is built (the zoo's toy models: about a second each)."""
    with gr.Blocks(title=TITLE) as app:
        gr.Markdown(f"# {TITLE}\nA small model (or the model itself) drafts several tokens; the target model checks "
                    "them all in one forward pass and keeps the longest prefix it agrees with, plus one token of its "
                    "own. Lossless methods give exactly the text plain decoding gives, in fewer target forwards.\n\n"
                    "The shapes-* models are toys trained only on a synthetic world of coloured shapes: other input "
                    "(a photo, a test pattern) gets confident nonsense.")
        with gr.Tab("Caption", id="caption"):
            caption_tab.build()
        with gr.Tab("Transcribe", id="transcribe"):
            transcribe_tab.build()
        with gr.Tab("Image", id="image"):
            image_tab.build()
        with gr.Tab("Bench", id="bench"):
            bench_outputs = bench_tab.build()
        app.load(bench_tab.read, outputs=list(bench_outputs))
    return app


def launch(host: str = "127.0.0.1", port: int = 7860) -> None:
    """Serve the app until interrupted (uploads over `MAX_UPLOAD_MB` are refused by the server)."""
    assets = sample_assets()
    build_app().queue().launch(server_name=host, server_port=port, max_file_size=f"{MAX_UPLOAD_MB}mb",
                               allowed_paths=[str(assets)] if assets is not None else None, show_error=True)
