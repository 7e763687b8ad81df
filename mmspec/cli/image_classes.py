"""`generate-image PROMPT` on a class-conditional model: a prompt that names no class (or several) is refused before
torch is imported, with the class names and synonyms read from the model's files as its pipeline reads them (a saved
pipeline's model_index.json; a LlamaGen folder's classes.json and zoo_card.json). The pipeline's own reading still
runs; a model whose names cannot be read here is left to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..class_prompts import class_id_from_prompt
from .image_families import image_family


def check_class_prompt(model: str, prompt: str) -> None:
    """MMSpecError (the pipeline's message) if `prompt` (not a class id) names no single class of `model`."""
    if prompt.strip().isascii() and prompt.strip().isdigit():  # a class id: its range is checked once loaded
        return
    if image_family(model) not in ("llamagen", "var", "mar"):  # Janus reads free text; None: only loading can tell
        return
    from ..zoo import entries

    folder = next((entry.path for entry in entries() if entry.name == model), None) or Path(model).expanduser()
    if (folder / "model_index.json").is_file():
        saved = _json(folder / "model_index.json")
        names, card = (saved.get("class_names"), saved.get("card")) if isinstance(saved, dict) else (None, None)
    else:
        names, card = _json(folder / "classes.json"), _json(folder / "zoo_card.json")
    synonyms = card.get("class_synonyms", {}) if isinstance(card, dict) else {}
    if not (isinstance(names, list) and names and all(isinstance(name, str) for name in names)) \
            or not (isinstance(synonyms, dict) and all(isinstance(v, str) for v in synonyms.values())):
        return
    class_id_from_prompt(prompt, names, synonyms)


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
