"""The family of an image model ("llamagen", "janus", "var" or "mar"), read from its files without torch, so that
flags of another family are refused before torch is imported (`mmspec.image_ar.pipeline.image_family` is the
loader's own reading; a test keeps the two equal on the zoo's models)."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_IMAGE_MODEL = "shapes-image-ar"  # mmspec.image_ar.pipeline.DEFAULT_IMAGE_MODEL
VAR_METHODS = ("ar", "code")  # mmspec.image_ar.var_pipeline.VAR_METHODS
MAR_METHODS = ("ar", "cspd")  # mmspec.image_ar.mar_pipeline.MAR_METHODS
SAVED_FAMILIES = {"VARPipeline": "var", "MARPipeline": "mar", "JanusImagePipeline": "janus"}  # by the saved class


def image_family(name: str) -> str | None:
    """The family `name` (a zoo name or a folder) loads as; None when only loading can tell (a Hub id, a missing or
    unreadable folder: the loader then says what is wrong)."""
    from ..zoo import entries

    folder = next((entry.path for entry in entries() if entry.name == name), None) or Path(name).expanduser()
    index = folder / "model_index.json"
    if index.is_file():
        saved = _json(index)
        return SAVED_FAMILIES.get(str(saved.get("_class_name", "")), "llamagen") if isinstance(saved, dict) else None
    if not (folder / "config.json").is_file():
        return None
    config = _json(folder / "config.json")
    return "janus" if isinstance(config, dict) and config.get("model_type") == "janus" else "llamagen"


def _json(file: Path) -> object:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
