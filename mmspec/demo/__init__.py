"""The Gradio demo (`mmspec demo`, `python demos/app.py`): speculation made visible.

Tabs: Caption (video), Transcribe (speech), Image (autoregressive image model) and Bench (the latest
measured speed-ups). Every tab calls the public pipelines (`CaptionPipeline`, `TranscriptionPipeline`,
`ImagePipeline`) and draws what their `callback_on_round` reports; nothing here decodes by itself.
Needs the `demo` extra (gradio): `pip install 'mmspec[demo]'`.
"""

from __future__ import annotations

from typing import Any


def build_app() -> Any:
    from .app import build_app as build

    return build()


def launch(host: str = "127.0.0.1", port: int = 7860) -> None:
    from .app import launch as serve

    serve(host=host, port=port)
