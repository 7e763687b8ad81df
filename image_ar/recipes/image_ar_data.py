"""Pieces of the zoo image-AR model ``shapes-image-ar`` shared by its training scripts, its
pipeline, its tests and anyone who wants to feed it by hand.

Data: class-conditional images of the shapes world (:mod:`mmspec.world`). A class is a shape kind x
a colour ("red circle"; every kind in ``KINDS`` x every colour in ``COLOURS``, 24 classes, id =
kind index x number of colours + colour index). An image shows ONE still shape of its class with
the world's own size, background and (still-shape) position distributions, rendered by
:func:`mmspec.world.render_image` at 64 x 64, so a VQ with downsample factor 4 gives a 16 x 16 grid
of 256 tokens. Example ``i`` of a split has its own seed (:func:`mmspec.world.example_seed`: train
and held-out seeds can never coincide) and class ``i mod 24``, so every prefix of a split is
class-balanced.

The zoo folder (the contract with :class:`mmspec.image_ar.SpeculativeImagePipeline`)::

    shapes-image-ar/
        config.json, model.safetensors   the AR target (LlamaGenForClassConditional, fp16; load in fp32)
        vq/        VQModel (save_pretrained)
        drafter/   LlamaGenForClassConditional, 1 layer, same vocabulary (the LANTERN drafter)
        judge/     timm classifier (config.json + model.safetensors; mmspec.image_ar.judge.load_judge)
        classes.json   class names in id order
        zoo_card.json  one card; each training script fills its own section

The bottom of the file holds the small training plumbing the four scripts share (wall-clock
budget, learning-rate schedule, bf16 autocast, the cached VQ codes of the dataset, the card).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np
import torch
from tqdm import tqdm

from mmspec.errors import MMSpecError
from mmspec.training import add_output_arguments, parse_output_folder
from mmspec.world import BACKGROUNDS, COLOURS, KINDS, SIZES, Scene, Shape, example_seed, render_image
from mmspec.world.captions import KIND_WORDS
from mmspec.zoo import MODELS_DIR

IMAGE_SIZE = 64
DOWNSAMPLE = 4
GRID = IMAGE_SIZE // DOWNSAMPLE  # 16 x 16 = 256 image tokens
NAME = "shapes-image-ar"
ZOO_DIR = MODELS_DIR / NAME
CACHE_DIR = Path.home() / ".cache" / "mmspec" / NAME
SUBFOLDERS = ("vq", "drafter", "judge")
REBUILD_COMMAND = "python -m mmspec.image_ar.recipes.build_shapes_image_ar"

_KIND_LIST = list(KINDS)
_COLOUR_LIST = list(COLOURS)
NUM_CLASSES = len(_KIND_LIST) * len(_COLOUR_LIST)

# Every word the caption grammar uses for a kind (singular and plural), e.g. "ball" -> "circle".
KIND_SYNONYMS: dict[str, str] = {
    word: kind for kind, options in KIND_WORDS.items() for (forms, _) in options for word in forms
}
# The words a pipeline maps before matching a prompt to a class name (a model card's `class_synonyms`).
CLASS_SYNONYMS: dict[str, str] = {word: kind for word, kind in KIND_SYNONYMS.items() if word != kind}


# ---------------------------------------------------------------------------------------- classes


def label_names() -> list[str]:
    """Class names in id order: "red circle", "blue circle", ..., "orange star"."""
    return [f"{colour} {kind}" for kind in _KIND_LIST for colour in _COLOUR_LIST]


def class_id(kind: str, colour: str) -> int:
    """The class of a (kind, colour) pair."""
    if kind not in KINDS or colour not in COLOURS:
        raise MMSpecError(f"unknown shape {colour!r} {kind!r}; valid classes: {', '.join(label_names())}")
    return _KIND_LIST.index(kind) * len(_COLOUR_LIST) + _COLOUR_LIST.index(colour)


def class_parts(label: int) -> tuple[str, str]:
    """(kind, colour) of a class id."""
    if not 0 <= int(label) < NUM_CLASSES:
        raise MMSpecError(f"class id must be in [0, {NUM_CLASSES}), got {label}")
    return _KIND_LIST[int(label) // len(_COLOUR_LIST)], _COLOUR_LIST[int(label) % len(_COLOUR_LIST)]


def class_from_text(text: str) -> int:
    """Read a class from free text: one colour word and one shape word, in any order, anything else
    ignored ("red circle", "a big red ball", "Circle, red"); a bare class id ("3") works too.

    Shape words are those of the caption grammar (circle/ball/disc, square/box, triangle, star,
    and their plurals). Raises MMSpecError listing the valid class names otherwise.
    """
    stripped = str(text).strip()
    if stripped.isdigit() and int(stripped) < NUM_CLASSES:
        return int(stripped)
    words = re.findall(r"[a-z]+", stripped.lower())
    colours = {w for w in words if w in COLOURS}
    kinds = {KIND_SYNONYMS[w] for w in words if w in KIND_SYNONYMS}
    if len(colours) == 1 and len(kinds) == 1:
        return class_id(kinds.pop(), colours.pop())
    if not colours or not kinds:
        problem = "no colour" if not colours else "no shape"
        if not colours and not kinds:
            problem = "no colour and no shape"
    else:
        problem = "more than one colour or shape"
    raise MMSpecError(
        f"cannot read an image class from {text!r} ({problem}): say one colour "
        f"({', '.join(_COLOUR_LIST)}) and one shape ({', '.join(sorted(KIND_SYNONYMS))}). "
        f"Valid classes: {', '.join(label_names())} (or a class id 0-{NUM_CLASSES - 1})"
    )


# ------------------------------------------------------------------------------------------- data


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys], k=1)[0]


def class_scene(label: int, rng: random.Random) -> Scene:
    """One still shape of class `label`; size and background from the world's weights, and the
    centre uniform in [0.15, 0.85]^2 as the world places a still shape (`scenes._start`)."""
    kind, colour = class_parts(label)
    background = _pick(rng, BACKGROUNDS)
    size = _pick(rng, SIZES)
    x, y = round(rng.uniform(0.15, 0.85), 4), round(rng.uniform(0.15, 0.85), 4)
    return Scene((Shape(kind, colour, size, x, y, "still"),), background)


def example(index: int, seed: int = 0, split: str = "train") -> tuple[Scene, int]:
    """Example `index` of a split: (scene, class id); its class is index mod NUM_CLASSES."""
    # A salt keeps these draws independent of the caption corpus built on the same example seeds.
    rng = random.Random(f"image-ar:{example_seed(split, seed, index)}")
    label = index % NUM_CLASSES
    return class_scene(label, rng), label


def render(scenes: list[Scene]) -> torch.Tensor:
    """Scenes -> uint8 images [N, 3, 64, 64]."""
    arrays = np.stack([np.asarray(render_image(s, IMAGE_SIZE)) for s in scenes])
    return torch.from_numpy(arrays).permute(0, 3, 1, 2).contiguous()


@dataclass
class ImageSet:
    """uint8 images [N, 3, 64, 64] and their class ids [N]."""

    images: torch.Tensor
    labels: torch.LongTensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def images(n: int, seed: int = 0, split: str = "train", start: int = 0) -> ImageSet:
    """Examples start .. start + n - 1 of a split, rendered."""
    pairs = [example(i, seed, split) for i in range(start, start + n)]
    return ImageSet(render([s for s, _ in pairs]), torch.tensor([label for _, label in pairs], dtype=torch.long))


def to_model_range(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float in [-1, 1] (the VQ's and the judge's input convention)."""
    return images_uint8.float() / 127.5 - 1.0


def to_uint8(images_float: torch.Tensor) -> torch.Tensor:
    """float [B, 3, H, W] in [-1, 1] -> uint8 (clamped, rounded)."""
    return ((images_float.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class Stream:
    """An endless, seeded stream of fresh training examples (rendering costs ~0.1 ms an image)."""

    def __init__(self, seed: int = 0, split: str = "train") -> None:
        self.seed, self.split, self.next_index = seed, split, 0

    def take(self, n: int) -> ImageSet:
        batch = images(n, self.seed, self.split, self.next_index)
        self.next_index += n
        return batch


# ------------------------------------------------------------------------------ training plumbing


def recipe_parser(doc: str, what: str, *, max_minutes: float, batch_size: int, lr: float, warmup: int,
                  bf16: bool = True, name: str = NAME, threads: int = 2) -> argparse.ArgumentParser:
    """The parser every shapes-world image training script starts from: where it writes (`--out`, default
    ./<name>, or `--into-zoo`), the budget loop, the optimiser and the CPU."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_output_arguments(parser, name, what)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=max_minutes, help="wall-clock budget of the training loop")
    parser.add_argument("--steps", type=int, default=0, help="0 = as many as fit the budget")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--threads", type=int, default=threads)
    if bf16:
        parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                            help="train in fp32 (bf16 autocast is the default where the CPU supports it)")
    return parser


def parse_recipe_args(parser: argparse.ArgumentParser, argv: list[str] | None,
                      zoo_dir: Path = ZOO_DIR) -> argparse.Namespace:
    """Parsed arguments with `out` resolved: never the installed zoo folder without `--into-zoo`."""
    args = parser.parse_args(argv)
    args.out = str(parse_output_folder(parser, args, zoo_dir))
    return args


def timing_facts(loop: Any, wall: float, threads: int, prep: float | None = None) -> dict[str, Any]:
    """The card fields every training script records about its run's time and machine."""
    facts: dict[str, Any] = {"seconds_per_step": loop.seconds_per_step}
    if prep is not None:
        facts["data_prep_time_s"] = round(prep, 1)
    facts["train_wall_time_s"] = round(wall, 1)
    facts["train_machine"] = f"2 CPU cores, torch.set_num_threads({threads})"
    return facts


def set_threads(threads: int) -> None:
    torch.set_num_threads(max(1, int(threads)))


def bf16_supported() -> bool:
    """bf16 matmuls on this CPU (avx512_bf16 / AMX): then autocast roughly halves a step's time."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast(enabled: bool) -> ContextManager:
    """bf16 autocast on CPU when asked for and supported; weights and optimiser stay fp32."""
    if enabled and bf16_supported():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def autocast_state(enabled: bool) -> str:
    """'on' / 'off': whether bf16 autocast really ran (asked for AND supported), for logs and cards."""
    return "on" if enabled and bf16_supported() else "off"


def file_sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@torch.no_grad()
def encode_images(vq: torch.nn.Module, data: ImageSet, batch_size: int = 128, desc: str = "VQ encode") -> torch.Tensor:
    """Token grids of a dataset, flattened row-major: int16 [N, 256] (fp32 encoder, exact nearest code)."""
    out = []
    for i in tqdm(range(0, len(data), batch_size), desc=desc, mininterval=5):
        out.append(vq.encode(to_model_range(data.images[i : i + batch_size])).flatten(1).to(torch.int16))
    return torch.cat(out)


def cached_codes(vq_dir: Path, n: int, seed: int, split: str, cache_dir: Path = CACHE_DIR) -> tuple[torch.Tensor, torch.LongTensor]:
    """(codes int16 [n, 256], labels [n]) of the first n examples of a split, encoded once with the
    frozen VQ in `vq_dir` and cached under `cache_dir` (keyed by the VQ weights' hash)."""
    from mmspec.image_ar import VQModel

    key = file_sha(Path(vq_dir) / "model.safetensors")
    path = Path(cache_dir) / f"codes-{split}-s{seed}-n{n}-vq{key}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["codes"], saved["labels"]
    vq = VQModel.from_pretrained(vq_dir, dtype=torch.float32).eval()
    t0 = time.time()
    data = images(n, seed, split)
    codes = encode_images(vq, data, desc=f"VQ encode {split}")
    print(f"encoded {n} {split} images in {time.time() - t0:.0f}s -> {path}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"codes": codes, "labels": data.labels}, path)
    return codes, data.labels


def folder_size(folder: Path) -> int:
    """Bytes of every file under `folder`, recursively."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def base_card() -> dict[str, Any]:
    return {
        "name": NAME,
        "task": "class-conditional-image-generation",
        "architecture": "LlamaGenForClassConditional",
        "pipeline": "mmspec.image_ar.SpeculativeImagePipeline",
        "default_method": "gsd",
        "role": "target (LlamaGen) + drafter + VQ + judge",
        "image_size": IMAGE_SIZE,
        "grid": GRID,
        "num_classes": NUM_CLASSES,
        "classes": label_names(),
        "class_text": "a class name, or free text holding one colour and one shape word ('a big red ball'); "
                      "class_synonyms maps the other shape words to the class names",
        "class_synonyms": CLASS_SYNONYMS,
        "layout": {
            ".": "the AR target: config.json + model.safetensors (fp16; load with dtype=torch.float32)",
            "vq": "mmspec.image_ar.VQModel (LlamaGen VQ layout), downsample 4: 64x64 image <-> 16x16 codes",
            "drafter": "LlamaGenForClassConditional, same vocabulary: the drafter for plain speculative decoding / LANTERN",
            "judge": "timm classifier of the 24 classes: mmspec.image_ar.judge.load_judge",
            "classes.json": "class names in id order",
        },
        "trained_on": (
            "class-conditional 64x64 renders of the shapes world: one still shape per image, class = kind x colour "
            "(mmspec.image_ar.recipes.image_ar_data.example(i, seed, split)), size / background / position from the "
            "world's distributions"
        ),
        "rebuild_command": REBUILD_COMMAND,
        "limitations": [
            "a toy: 64x64 images of one flat-coloured shape on a flat background, 24 classes; not a general image model",
            "trained for minutes on 2 CPU cores; samples can have ragged edges or, rarely, the wrong shape",
            "class-conditional only (no text encoder): text prompts are mapped to a class by class_from_text",
            "the judge only knows these 24 classes; its Frechet distance is comparable only within this zoo",
        ],
        "components": {},
    }


def save_fp16(model: torch.nn.Module, folder: Path) -> Path:
    """Save `model` in fp16 (the shipped precision; loaded back in fp32) to `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(folder, safe_serialization=True)
    return folder


def finish(out: Path, section: str, info: dict[str, Any], folder: Path, wall: float) -> dict[str, Any]:
    """Record a trained part in the card (`update_card`) and say where it went."""
    update_card(out, section, info)
    size = (Path(folder) / "model.safetensors").stat().st_size
    print(f"saved {folder} ({size / 1e6:.2f} MB of weights) after {wall:.0f}s of training", flush=True)
    return info


def update_card(out: Path, section: str, info: dict[str, Any]) -> dict[str, Any]:
    """Fill one section of `out/zoo_card.json` ("target" = top-level fields; "vq", "drafter", "judge" =
    `components[...]`), refresh sizes and `classes.json`, and write the card back."""
    card = fill_card(out, section, info, top_level="target", new_card=base_card)
    target_weights = Path(out) / "model.safetensors"
    card["file_size_bytes"] = target_weights.stat().st_size if target_weights.is_file() else 0
    walls = [card.get("train_wall_time_s")] + [c.get("train_wall_time_s") for c in card.get("components", {}).values()]
    return write_card(out, card, walls)


def fill_card(out: Path, section: str, info: dict[str, Any], *, top_level: str,
              new_card: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """OUT/zoo_card.json (`new_card()` where there is none yet) with `info` as its top-level fields (section
    `top_level`) or as `components[section]`; writes OUT/classes.json. `write_card` writes the card back."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    card_file = out / "zoo_card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else new_card()
    if section == top_level:
        card.update(info)
    else:
        card.setdefault("components", {})[section] = info
    (out / "classes.json").write_text(json.dumps(label_names(), indent=1) + "\n")
    return card


def write_card(out: Path, card: dict[str, Any], walls: list[float | None]) -> dict[str, Any]:
    """The card with the folder's total size and the sum of the training `walls`, written to OUT/zoo_card.json."""
    card["total_size_bytes"] = folder_size(out)
    card["train_wall_time_total_s"] = round(sum(w for w in walls if w), 1)
    (Path(out) / "zoo_card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card
