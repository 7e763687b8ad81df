"""Checks of the models a verb is given (`--model`, `--drafter`, `--fast-decoder`, ...), run before torch and
transformers are imported: a bad name, card or folder is refused in a fraction of a second, not after seconds of
imports.

What is checked without loading anything: the zoo's own refusals (`mmspec.zoo.check`: cards, derived models,
pickle-only folders, paths that are not there, ids not in the Hub cache offline), then the folder's shape for
what the verb loads from it: a config.json that is a JSON object naming its model type, weights that mmspec can
read (safetensors), a CTranslate2 folder's settings and header. A folder that passes may still fail to load;
the loader's error then stands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from ..errors import MMSpecError

# lm / vlm / fast-decoder: a transformers folder; speech: transformers or CTranslate2 (faster-whisper);
# feature-drafter: an MSD / FLASH drafter folder; image: an image model folder or saved pipeline.
Kind = Literal["lm", "vlm", "speech", "fast-decoder", "feature-drafter", "image"]


def check_model(value: str | None, role: str, kind: Kind) -> None:
    """MMSpecError (one line) if `value` cannot name a loadable model of `kind`; None (the verb's default) passes."""
    if value is None:
        return
    from .. import zoo

    if any(entry.name == value for entry in zoo.entries()):
        zoo.check(value, role)  # a derived zoo model's card; the zoo's own folders are trusted
        return
    if kind == "feature-drafter":  # a folder, never a Hub id
        _feature_drafter_folder(value, role)
        return
    folder = zoo.check(value, role)
    if folder is None or "derived_from" in zoo.folder_card(folder):
        return
    if kind == "image" or (folder / "model_index.json").is_file():  # a saved pipeline: diffusers' loader reads it
        _image_folder(folder, value, role)
    elif kind == "speech" and _is_ct2_folder(folder):
        _ct2_folder(folder)
    else:
        _transformers_folder(folder, value, role)


def _read_json(file: Path, start: str) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise MMSpecError(f"{start}: its {file.name} is not valid JSON ({reason})") from None


def _json_object(file: Path, start: str) -> dict[str, Any]:
    value = _read_json(file, start)
    if not isinstance(value, dict):
        raise MMSpecError(f"{start}: its {file.name} must hold a JSON object, got a {type(value).__name__}")
    return value


def _transformers_folder(folder: Path, value: str, role: str) -> None:
    """A transformers checkpoint folder: config.json naming a model type, and safetensors weights."""
    start = f"cannot load the {role} {value!r}"
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise MMSpecError(f"{start}: the folder has no config.json (not a transformers model folder)")
    config = _json_object(config_file, start)
    model_type = config.get("model_type")
    if "model_type" in config and not (isinstance(model_type, str) and model_type):
        raise MMSpecError(f"{start}: its config.json has model_type {model_type!r}; transformers needs the name of a "
                          "model type there (e.g. \"llama\")")
    if "model_type" not in config and not config.get("architectures"):
        raise MMSpecError(f"{start}: its config.json names no model_type (transformers reads it to pick the model class)")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("*.safetensors.index.json")):
        raise MMSpecError(f"{start}: the folder holds no .safetensors weights (mmspec loads safetensors checkpoints "
                          "only)")
    for file in weights:
        _readable_safetensors(file, start)


def _readable_safetensors(file: Path, start: str) -> None:
    """The file's header parses and its tensors lie inside the file (safetensors' own check; no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="numpy"):
            pass
    except (SafetensorError, OSError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise MMSpecError(f"{start}: its weights {file.name} cannot be read ({reason}): a damaged or truncated "
                          ".safetensors file") from None


def _is_ct2_folder(folder: Path) -> bool:
    from ..speech.ctranslate2 import is_ct2_whisper_folder

    return is_ct2_whisper_folder(folder)


def _ct2_folder(folder: Path) -> None:
    """A CTranslate2 (faster-whisper) folder: its settings and its model.bin's header and variable table."""
    from ..speech.ct2_settings import checked_settings
    from ..speech.ctranslate2 import CT2_MODEL_FILE, read_ct2_checkpoint

    config_file = folder / "config.json"
    checked_settings(_read_json(config_file, f"cannot load the CTranslate2 folder {str(folder)!r}"), config_file)
    read_ct2_checkpoint(folder / CT2_MODEL_FILE)


def _feature_drafter_folder(value: str, role: str) -> None:
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise MMSpecError(f"the {role} {value!r} is not a folder (a trained drafter's folder, with config.json)"
                          if folder.exists() else f"the {role} folder {value!r} does not exist")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise MMSpecError(f"no {role} in {value!r} (config.json not found)")
    _json_object(config_file, f"cannot load the {role} {value!r}")


def _image_folder(folder: Path, value: str, role: str) -> None:
    """An image model folder (config.json) or a saved pipeline of any modality (model_index.json, its components in
    sub-folders): what it has is a JSON object."""
    start = f"cannot load the {role} {value!r}"
    found = [folder / name for name in ("config.json", "model_index.json") if (folder / name).is_file()]
    if not found:
        raise MMSpecError(f"{start}: the folder has neither config.json nor model_index.json (not a model folder)")
    for file in found:
        _json_object(file, start)
