"""Caption corpora and prompts drawn from the shapes world, generated on the fly.

Each example ``i`` of a split gets its own integer seed. Train seeds are even and
held-out seeds are odd, so the two splits can never share a scene seed.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from .captions import caption
from .detailed_captions import detailed_caption
from .detailed_scenes import MAX_SHAPES, DetailedScene, sample_detailed_scene
from .scenes import Scene, sample_scene

SPLITS = ("train", "heldout")


def example_seed(split: str, seed: int, index: int) -> int:
    """The scene/caption seed of example ``index``; the low bit encodes the split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    digest = hashlib.sha256(f"{split}:{seed}:{index}".encode()).digest()
    return (int.from_bytes(digest[:8], "little") >> 1 << 1) | SPLITS.index(split)


def sample_example(example: int, max_shapes: int = 3) -> tuple[Scene, str]:
    """The scene and caption for one example seed (see :func:`example_seed`)."""
    rng = random.Random(example)
    scene = sample_scene(rng, max_shapes=max_shapes)
    return scene, caption(scene, rng)


def examples(n: int, seed: int = 0, split: str = "train", max_shapes: int = 3) -> list[tuple[Scene, str]]:
    """``n`` (scene, caption) pairs of ``split``, with 1..``max_shapes`` shapes per scene."""
    return [sample_example(example_seed(split, seed, i), max_shapes) for i in range(n)]


def sample_detailed_example(example: int, max_shapes: int = MAX_SHAPES) -> tuple[DetailedScene, str]:
    """The detailed scene (1..``max_shapes`` shapes) and its caption for one example seed."""
    rng = random.Random(f"detailed:{example}")
    scene = sample_detailed_scene(rng, max_shapes=max_shapes)
    return scene, detailed_caption(scene, rng)


def detailed_examples(n: int, seed: int = 0, split: str = "train",
                      max_shapes: int = MAX_SHAPES) -> list[tuple[DetailedScene, str]]:
    """``n`` (detailed scene, caption) pairs of ``split``; same seed streams as :func:`examples`."""
    return [sample_detailed_example(example_seed(split, seed, i), max_shapes) for i in range(n)]


def captioner_examples(card: dict, n: int, seed: int = 0, split: str = "heldout") -> list:
    """``n`` (scene, caption) pairs like the ones a captioner was trained on, as its zoo card says:
    detailed scenes when it has ``"scenes": "detailed"``, else one-shape-grammar scenes; up to its
    ``"max_shapes"`` shapes."""
    if card.get("scenes") == "detailed":
        return detailed_examples(n, seed, split, card.get("max_shapes", MAX_SHAPES))
    return examples(n, seed, split, card.get("max_shapes", 3))


def caption_token_cap(card: dict) -> int:
    """A generous cap on a caption's new tokens for that captioner (detailed captions run to 150 tokens)."""
    from .detailed_captions import MAX_TOKENS

    return MAX_TOKENS + 10 if card.get("scenes") == "detailed" else 48


def caption_corpus(n: int, seed: int = 0, split: str = "train") -> list[str]:
    """``n`` captions of ``split`` ("train" or "heldout", disjoint seed streams)."""
    return [c for _, c in examples(n, seed, split)]


def caption_prefix(text: str, rng: random.Random, lo: float = 0.3, hi: float = 0.5) -> str:
    """The first ``lo``..``hi`` share of the words of ``text`` (at least one word,
    never the whole caption)."""
    words = text.split()
    k = max(1, min(len(words) - 1, round(len(words) * rng.uniform(lo, hi))))
    return " ".join(words[:k])


PROMPT_SCENES = ("one-shape", "detailed")


def heldout_prompts(n: int, seed: int = 0, scenes: str = "one-shape") -> list[str]:
    """Prefixes (the first 30-50% of the words) of ``n`` held-out captions: one-shape captions
    (``caption_corpus``) or, with ``scenes="detailed"``, the detailed captions of 1-4-shape scenes."""
    if scenes not in PROMPT_SCENES:
        raise ValueError(f"scenes must be one of {PROMPT_SCENES}, got {scenes!r}")
    rng = random.Random(f"prompts:{seed}")
    captions = (caption_corpus(n, seed, "heldout") if scenes == "one-shape"
                else [c for _, c in detailed_examples(n, seed, "heldout")])
    return [caption_prefix(c, rng) for c in captions]


def write_prompts_file(path: str | Path, n: int = 200, seed: int = 0, scenes: str = "one-shape") -> Path:
    """Write ``heldout_prompts(n, seed, scenes)``, one per line, to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(heldout_prompts(n, seed, scenes)) + "\n", encoding="utf-8")
    return path
