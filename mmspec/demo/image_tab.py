"""The Image tab: an image from an autoregressive image model, with the step at which each token was committed."""

from __future__ import annotations

import inspect
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from ..errors import MMSpecError
from .fields import checked_seed
from .models import image_pipeline, zoo_models

SHOWN_SIZE = 256  # toy images are tiny: shown enlarged, pixels kept sharp


def build() -> None:
    models = zoo_models("image")
    first = image_pipeline(models[0]) if models else None
    classes = list(first.class_names or []) if first else []
    gr.Markdown("Sample an image from an autoregressive image model. Speculative and Jacobi methods commit several "
                "image tokens per target forward: the step map colours each token by the forward that committed it "
                "(dark: early, bright: late), and the step compression is tokens per forward.")
    with gr.Row():
        with gr.Column():
            model = gr.Dropdown(models, value=models[0] if models else None, label="model", elem_id="image-model")
            label = gr.Dropdown(classes, value=classes[0] if classes else None, label="class", elem_id="image-class")
            method = gr.Dropdown(first.available_methods if first else [], value=first.default_method if first else None,
                                 label="method", elem_id="image-method")
            seed = gr.Number(0, precision=0, label="seed", elem_id="image-seed")
            run = gr.Button("Generate", variant="primary", elem_id="image-run")
        with gr.Column():
            with gr.Row():
                image = gr.Image(label="image", type="pil", format="png", elem_id="image-output")
                steps = gr.Image(label="step at which each token was committed", type="pil", format="png",
                                 elem_id="image-steps")
            stats = gr.Markdown(elem_id="image-stats")
    model.change(_choices_of, inputs=[model], outputs=[label, method])
    run.click(generate, inputs=[model, label, method, seed], outputs=[image, steps, stats])


def _choices_of(name: str) -> tuple[Any, Any]:
    try:
        pipe = image_pipeline(name)
    except MMSpecError as error:
        raise gr.Error(str(error), duration=None) from None
    classes = list(pipe.class_names or [])
    return (gr.Dropdown(choices=classes, value=classes[0] if classes else None),
            gr.Dropdown(choices=pipe.available_methods, value=pipe.default_method))


def reports_rounds(pipe: Any) -> bool:
    """Whether this image pipeline takes `callback_on_round` (the step map needs it)."""
    return "callback_on_round" in inspect.signature(pipe.__call__).parameters


def step_map(spans: list[tuple[int, int]], grid: tuple[int, int]) -> np.ndarray:
    """The round (0, 1, ...) that committed each token of a raster-order grid, from each round's
    (raster position of its first token, tokens committed)."""
    steps = np.full(grid[0] * grid[1], -1)
    for step, (position, count) in enumerate(spans):
        steps[position:position + count] = step
    missing = int((steps < 0).sum())
    if missing:
        raise MMSpecError(f"the rounds committed {steps.size - missing} of the image's {steps.size} tokens")
    return steps.reshape(grid)


def round_spans(rounds: list) -> list[tuple[int, int]]:
    """(raster position, count) per round of the call's first image (the image pipelines number a call's
    images as chunks and give each round's raster position)."""
    return [(info.position, len(info.tokens)) for info in rounds if info.chunk in (None, 0)]


def step_image(steps: np.ndarray) -> Image.Image:
    """The step map as colours from dark blue (first forward) to yellow (last)."""
    t = steps / max(int(steps.max()), 1)
    dark, bright = np.array([30, 40, 110]), np.array([250, 220, 40])
    pixels = (dark + (bright - dark) * t[..., None]).astype(np.uint8)
    return _enlarged(Image.fromarray(pixels))


def _enlarged(picture: Image.Image) -> Image.Image:
    return picture.resize((SHOWN_SIZE, SHOWN_SIZE * picture.height // picture.width), Image.NEAREST)


def generate(model: str, label: str, method: str, seed: float, progress: gr.Progress = gr.Progress()) -> tuple:
    try:
        seed = checked_seed(seed)
        if not label:
            raise MMSpecError("choose a class")
        pipe = image_pipeline(model)
        progress(None, desc=f"{method}: sampling image tokens")
        rounds: list = []
        extra = {"callback_on_round": lambda _i, info: rounds.append(info)} if reports_rounds(pipe) else {}
        out = pipe(prompt=label, method=method, seed=seed, progress_bar=False, **extra)
        stats = out.stats
        text = (f"**{method}**: {stats.new_tokens} image tokens in {stats.target_forwards} target forwards: step "
                f"compression **{stats.step_compression:.2f}** tokens per forward; {stats.total_time * 1e3:.0f} ms "
                f"(token generation; the VQ decoder's time not included)")
        picture = step_image(step_map(round_spans(rounds), tuple(out.tokens.shape[-2:]))) if rounds else None
        if picture is None:
            text += "\n\nThe step map needs the image pipeline's per-round callback (`callback_on_round`), which it lacks."
        return _enlarged(out.images[0]), picture, text
    except MMSpecError as error:
        raise gr.Error(str(error), duration=None) from None
