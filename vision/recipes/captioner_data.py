"""Pieces of the zoo video captioner ``shapes-video-captioner`` shared by its training
script, its test and anyone who wants to feed it by hand.

The captioner is a real ``LlavaNextVideoForConditionalGeneration``: a tiny CLIP vision
tower (trained from scratch here) + the LLaVA-NeXT-Video 2x2 average pooler + a
two-layer projector + the zoo caption LM ``shapes-caption-lm`` (a Llama) whose
tokenizer gains two special tokens, ``<video>`` and ``<image>``, appended after the
existing vocabulary (every old token keeps its id).

A prompt is ``<bos> <video>*288 describe the video.`` and the model continues with a
caption ending in ``<eos>``: 8 frames of 96x96, 12x12 patches of 8 px per frame
(CLS dropped), pooled 2x2 to 6x6 = 36 visual tokens per frame.

Inputs are best built with the saved processor::

    processor = AutoProcessor.from_pretrained(folder)
    inputs = processor(text="<video>describe the video.", videos=frames, return_tensors="pt")

:func:`build_captioner_inputs` does the same by hand (and is what the training uses).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from mmspec.zoo import MODELS_DIR

FRAMES = 8  # frames per video
FRAME_SIZE = 96  # frames are resized to FRAME_SIZE x FRAME_SIZE
PATCH_SIZE = 8
POOL_STRIDE = 2  # LLaVA-NeXT-Video average pooling of the patch grid
PATCHES_PER_SIDE = FRAME_SIZE // PATCH_SIZE  # 12
TOKENS_PER_FRAME = (PATCHES_PER_SIDE // POOL_STRIDE) ** 2  # 36
VISUAL_TOKENS = FRAMES * TOKENS_PER_FRAME  # 288
VIDEO_TOKEN, IMAGE_TOKEN = "<video>", "<image>"
PROMPT = "describe the video."
# OpenAI CLIP normalisation (the LLaVA-NeXT-Video video processor's default).
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


# ---------------------------------------------------------------- tokenizer / processor

def extend_tokenizer(tok):
    """Append ``<video>`` and ``<image>`` as special tokens (old ids unchanged); in place."""
    old = len(tok)
    tok.add_special_tokens({"additional_special_tokens": [VIDEO_TOKEN, IMAGE_TOKEN]})
    ids = tok.convert_tokens_to_ids([VIDEO_TOKEN, IMAGE_TOKEN])
    if ids != [old, old + 1]:
        raise RuntimeError(f"expected <video>/<image> at ids {old}, {old + 1}; got {ids}")
    return tok


def build_video_processor():
    """A ``LlavaNextVideoVideoProcessor`` that resizes every frame to 96x96 (no crop)."""
    from transformers import LlavaNextVideoVideoProcessor

    return LlavaNextVideoVideoProcessor(
        size={"height": FRAME_SIZE, "width": FRAME_SIZE}, do_resize=True, do_center_crop=False,
        crop_size={"height": FRAME_SIZE, "width": FRAME_SIZE}, do_sample_frames=False,
        image_mean=list(MEAN), image_std=list(STD))


def build_image_processor():
    """A ``LlavaNextImageProcessor`` at 96 px with one grid pinpoint (images are not trained)."""
    from transformers import LlavaNextImageProcessor

    return LlavaNextImageProcessor(
        size={"height": FRAME_SIZE, "width": FRAME_SIZE}, crop_size={"height": FRAME_SIZE, "width": FRAME_SIZE},
        do_center_crop=False, image_grid_pinpoints=[[FRAME_SIZE, FRAME_SIZE]],
        image_mean=list(MEAN), image_std=list(STD))


def build_processor(tokenizer):
    """``LlavaNextVideoProcessor`` for the captioner: expands one ``<video>`` to 36 tokens per frame."""
    from transformers import LlavaNextVideoProcessor

    return LlavaNextVideoProcessor(
        video_processor=build_video_processor(), image_processor=build_image_processor(),
        tokenizer=tokenizer, patch_size=PATCH_SIZE, vision_feature_select_strategy="default",
        video_token=VIDEO_TOKEN, image_token=IMAGE_TOKEN, num_additional_image_tokens=1)


# ---------------------------------------------------------------- manual inputs

def _resize_frames(frames: np.ndarray, size: int = FRAME_SIZE) -> np.ndarray:
    if frames.shape[1:3] == (size, size):
        return frames
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(f).resize((size, size), Image.BICUBIC)) for f in frames])


def normalise_frames(frames: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., T, H, W, 3]`` (H = W = 96) -> float ``[..., T, 3, H, W]`` CLIP-normalised."""
    x = torch.as_tensor(np.asarray(frames)).float().div_(255.0)
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (x.movedim(-1, -3) - mean) / std


def prompt_ids(tokenizer, prompt: str = PROMPT, num_frames: int = FRAMES) -> list[int]:
    """``<bos> <video>*(36*num_frames) prompt`` as token ids."""
    video_id = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    text = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id] + [video_id] * (TOKENS_PER_FRAME * num_frames) + text


def build_captioner_inputs(video_frames: np.ndarray, prompt: str = PROMPT, folder=None, tokenizer=None) -> dict:
    """Model inputs for one video without the processor.

    ``video_frames``: uint8 ``[T, H, W, 3]`` (any H, W: frames are resized to 96x96 bicubic;
    use 8 frames, as in training). ``prompt``: text after the video (the model was trained
    with :data:`PROMPT`). ``folder``: where the tokenizer lives (or pass ``tokenizer``).
    Returns ``input_ids``, ``attention_mask`` ``[1, L]`` and ``pixel_values_videos``
    ``[1, T, 3, 96, 96]``, ready for ``model.generate(**inputs)``.
    """
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    frames = np.asarray(video_frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected video frames [T, H, W, 3], got shape {frames.shape}")
    frames = _resize_frames(frames.astype(np.uint8, copy=False))
    ids = prompt_ids(tokenizer, prompt, num_frames=len(frames))
    input_ids = torch.tensor([ids])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "pixel_values_videos": normalise_frames(frames)[None]}


# ---------------------------------------------------------------- attribute parsing

SHAPE_COLOURS = ("red", "blue", "green", "yellow", "purple", "orange")
KIND_OF_WORD = {"circle": "circle", "circles": "circle", "ball": "circle", "balls": "circle",
                "disc": "circle", "discs": "circle", "square": "square", "squares": "square",
                "box": "square", "boxes": "square", "triangle": "triangle", "triangles": "triangle",
                "star": "star", "stars": "star"}
# Regexes over the caption text for each motion (all verb forms of the grammar).
MOTION_PATTERNS = {
    "still": r"\b(stays? still|staying still|does not move|do not move|not moving|sits? still|sitting still)\b",
    "moving": r"\b(moves?|moving|slides?|sliding|travels?|travelling) (to the )?(left|right|up|upwards|down|downwards)\b",
    "bouncing": r"\b(bounces?|bouncing) (around|off the walls)\b",
    "growing": r"\b(grows?|growing|gets? bigger|getting bigger)\b",
    "shrinking": r"\b(shrinks?|shrinking|gets? smaller|getting smaller)\b",
    "changing": r"\b(turns?|turning|changes?|changing) (colour to |from )?",
}
DIRECTION_PATTERN = r"\b(?:moves?|moving|slides?|sliding|travels?|travelling) (?:to the )?(left|right|up|upwards|down|downwards)\b"
BACKGROUND_PATTERN = r"\b(?:background is|on an? )(white|black|grey)\b"


def parse_caption(text: str) -> dict:
    """Sets of shape colours (incl. colours changed to), kinds and motions named in ``text``."""
    words = re.findall(r"[a-z]+", text.lower())
    motions = {m for m, pat in MOTION_PATTERNS.items() if re.search(pat, text)}
    directions = {d.replace("wards", "") for d in re.findall(DIRECTION_PATTERN, text)}
    bg = re.findall(BACKGROUND_PATTERN, text)
    return {"colours": {w for w in words if w in SHAPE_COLOURS},
            "kinds": {KIND_OF_WORD[w] for w in words if w in KIND_OF_WORD},
            "motions": motions, "directions": directions, "background": bg[0] if bg else None}


def scene_attributes(scene) -> dict:
    """The same sets as :func:`parse_caption`, from the scene itself."""
    colours = {s.colour for s in scene.shapes} | {s.to_colour for s in scene.shapes if s.to_colour}
    return {"colours": colours, "kinds": {s.kind for s in scene.shapes},
            "motions": {s.motion for s in scene.shapes},
            "directions": {s.direction for s in scene.shapes if s.direction},
            "background": scene.background}


# ---------------------------------------------------------------- auxiliary vision targets

AUX_COLOURS = SHAPE_COLOURS
AUX_KINDS = ("circle", "square", "triangle", "star")
AUX_MOTIONS = ("still", "moving", "bouncing", "growing", "shrinking", "changing")
AUX_DIRECTIONS = ("left", "right", "up", "down")
AUX_SIZES = ("small", "medium", "large")
AUX_BACKGROUNDS = ("white", "black", "grey")


def aux_targets(scene) -> np.ndarray:
    """Multi-hot vector of what is in ``scene`` (for pre-training the vision tower):
    colours, kinds, motions, directions, sizes, background, shape count, and the
    kind x colour, kind x motion and colour x motion pairs (binding)."""
    parts = []

    def hot(vocab, present):
        v = np.zeros(len(vocab), np.float32)
        for p in present:
            v[vocab.index(p)] = 1.0
        return v

    sh = scene.shapes
    parts.append(hot(AUX_COLOURS, {s.colour for s in sh}))
    parts.append(hot(AUX_COLOURS, {s.to_colour for s in sh if s.to_colour}))
    parts.append(hot(AUX_KINDS, {s.kind for s in sh}))
    parts.append(hot(AUX_MOTIONS, {s.motion for s in sh}))
    parts.append(hot(AUX_DIRECTIONS, {s.direction for s in sh if s.direction}))
    parts.append(hot(AUX_SIZES, {s.size for s in sh}))
    parts.append(hot(AUX_BACKGROUNDS, {scene.background}))
    parts.append(hot((1, 2, 3, 4), {len(sh)}))
    kc = [f"{k}/{c}" for k in AUX_KINDS for c in AUX_COLOURS]
    km = [f"{k}/{m}" for k in AUX_KINDS for m in AUX_MOTIONS]
    cm = [f"{c}/{m}" for c in AUX_COLOURS for m in AUX_MOTIONS]
    parts.append(hot(kc, {f"{s.kind}/{s.colour}" for s in sh}))
    parts.append(hot(km, {f"{s.kind}/{s.motion}" for s in sh}))
    parts.append(hot(cm, {f"{s.colour}/{s.motion}" for s in sh}))
    return np.concatenate(parts)


AUX_DIM = (2 * len(AUX_COLOURS) + len(AUX_KINDS) + len(AUX_MOTIONS) + len(AUX_DIRECTIONS) + len(AUX_SIZES)
           + len(AUX_BACKGROUNDS) + 4 + len(AUX_KINDS) * (len(AUX_COLOURS) + len(AUX_MOTIONS))
           + len(AUX_COLOURS) * len(AUX_MOTIONS))


def zoo_folder() -> Path:
    return MODELS_DIR / "shapes-video-captioner"


# ---------------------------------------------------------------- dense per-token targets

DENSE_COLOURS = ("none",) + SHAPE_COLOURS  # 7 classes
DENSE_KINDS = ("none",) + AUX_KINDS  # 5 classes
_INDEX_COLOURS = ("red", "blue", "green", "yellow", "purple", "orange")  # shape i drawn in colour i


def dense_targets(scene, num_frames: int = FRAMES, size: int = FRAME_SIZE, min_pixels: int = 12) -> np.ndarray:
    """Per frame and per pooled token (a 16x16-pixel cell of the 6x6 grid): the colour
    and kind of the shape covering most of the cell (class 0 = background).

    Shapes are identified by re-rendering the scene with shape ``i`` painted in a unique
    colour (same geometry as :func:`mmspec.world.render_video`). Returns int64
    ``[num_frames, 36, 2]`` (colour class, kind class).
    """
    from dataclasses import replace

    from mmspec.world import Scene, render_video
    from mmspec.world.render import shape_state
    from mmspec.world.scenes import RGB

    shapes = scene.shapes
    if len(shapes) > len(_INDEX_COLOURS):
        raise ValueError("too many shapes for index rendering")
    painted = tuple(replace(s, colour=_INDEX_COLOURS[i], motion="still" if s.motion == "changing" else s.motion,
                            to_colour=None) for i, s in enumerate(shapes))
    frames = render_video(Scene(painted, "white"), num_frames, size).astype(np.int32)
    index = np.zeros(frames.shape[:3], np.int64)  # 0 = background
    for i in range(len(shapes)):
        r, g, b = RGB[_INDEX_COLOURS[i]]
        index[(frames[..., 0] == r) & (frames[..., 1] == g) & (frames[..., 2] == b)] = i + 1
    side = PATCHES_PER_SIDE // POOL_STRIDE
    cell = size // side
    cells = index.reshape(num_frames, side, cell, side, cell).transpose(0, 1, 3, 2, 4).reshape(num_frames, side * side, -1)
    counts = np.stack([(cells == i + 1).sum(-1) for i in range(len(shapes))], -1)  # [T, 36, n]
    best = counts.argmax(-1)
    covered = counts.max(-1) >= min_pixels
    out = np.zeros((num_frames, side * side, 2), np.int64)
    ts = [i / (num_frames - 1) if num_frames > 1 else 0.0 for i in range(num_frames)]
    for f, t in enumerate(ts):
        colours = [DENSE_COLOURS.index(shape_state(s, t)[3]) for s in shapes]
        kinds = [DENSE_KINDS.index(s.kind) for s in shapes]
        for c in np.nonzero(covered[f])[0]:
            out[f, c] = (colours[best[f, c]], kinds[best[f, c]])
    return out


def frame_targets(scene, num_frames: int = FRAMES) -> np.ndarray:
    """Per frame, a multi-hot vector of what the whole frame shows: the colours (as drawn in
    that frame, so a colour change shows), kinds, kind x colour pairs, sizes, background and
    shape count. Every pooled token of the frame is trained to predict it, so that any
    attention the language model pays to a frame's tokens already carries the frame's content.
    Returns float32 ``[num_frames, FRAME_TARGET_DIM]``."""
    from mmspec.world.render import shape_state

    ts = [i / (num_frames - 1) if num_frames > 1 else 0.0 for i in range(num_frames)]
    out = np.zeros((num_frames, FRAME_TARGET_DIM), np.float32)
    for f, t in enumerate(ts):
        for s in scene.shapes:
            colour = shape_state(s, t)[3]
            c, k = AUX_COLOURS.index(colour), AUX_KINDS.index(s.kind)
            out[f, c] = 1.0
            out[f, 6 + k] = 1.0
            out[f, 10 + k * 6 + c] = 1.0
            out[f, 34 + AUX_SIZES.index(s.size)] = 1.0
        out[f, 37 + AUX_BACKGROUNDS.index(scene.background)] = 1.0
        out[f, 40 + min(len(scene.shapes), 4) - 1] = 1.0
    return out


FRAME_TARGET_DIM = 6 + 4 + 24 + 3 + 3 + 4
